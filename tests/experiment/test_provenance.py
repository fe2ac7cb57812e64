"""Provenance: which machine ran which rounds (sessions.jsonl -> summary.json "machines")."""

import json

import pytest

import fedge.experiment.drive as drive_module
from fedge.core.rundir_schema import SESSIONS
from fedge.experiment.provenance import _cpu, machine, segments
from fedge.experiment.rundir import RunDir
from tests_helpers import unfinished_run

A = {
    "cpu": "AMD EPYC",
    "isa": "avx2",
    "cores": 2,
    "torch": "2.13.0",
    "python": "3.11.7",
    "fedge": "0.1.0",
}
B = {**A, "cpu": "Intel Xeon", "isa": "avx512f", "cores": 16, "torch": "2.11.0"}


def at(m, when):
    return {**m, "started_utc": when}


@pytest.mark.parametrize(
    ("sessions", "rounds", "expected"),
    [
        ([], 3, [{"rounds": [1, 3], "machine": None}]),  # a run from before sessions.jsonl existed
        ([{"first_round": 1, "machine": A}], 0, []),
        (
            [{"first_round": 4, "machine": A}],
            5,
            [{"rounds": [1, 3], "machine": None}, {"rounds": [4, 5], "machine": A}],
        ),
        (
            [
                {"first_round": 1, "machine": A},
                {"first_round": 3, "machine": B},
                {"first_round": 6, "machine": A},
            ],
            7,
            [
                {"rounds": [1, 2], "machine": A},
                {"rounds": [3, 5], "machine": B},
                {"rounds": [6, 7], "machine": A},
            ],
        ),
        # resumed from an older checkpoint: the later session's rounds replace the earlier ones
        (
            [
                {"first_round": 1, "machine": A},
                {"first_round": 5, "machine": B},
                {"first_round": 3, "machine": A},
            ],
            6,
            [{"rounds": [1, 6], "machine": A}],
        ),
        # a session that ran no round (stopped at once) is overwritten by the next one
        (
            [
                {"first_round": 1, "machine": A},
                {"first_round": 2, "machine": B},
                {"first_round": 2, "machine": A},
            ],
            2,
            [{"rounds": [1, 2], "machine": A}],
        ),
    ],
)
def test_segments_hand_computed(sessions, rounds, expected):
    assert segments(sessions, rounds) == expected


def test_segments_merge_one_machine_resumed_or_pinned_but_not_another_torch():
    sessions = [
        {"first_round": 1, "machine": at(A, "t1")},
        {"first_round": 3, "machine": at({**A, "usable_cores": 1}, "t2")},
        {"first_round": 5, "machine": at({**A, "torch": "2.11.0"}, "t3")},
    ]
    got = segments(sessions, 6)
    assert [s["rounds"] for s in got] == [[1, 4], [5, 6]]
    assert got[0]["machine"]["started_utc"] == "t1"  # the segment's first start


def test_cpu_reads_model_and_widest_vector_extension(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: avx512f\n"
    )
    assert _cpu.__wrapped__(str(info)) == ("AMD EPYC 7B13", "avx2")
    info.write_text("model name\t: X\nflags\t\t: sse avx512f avx2\n")
    assert _cpu.__wrapped__(str(info)) == ("X", "avx512f")
    cpu, isa = _cpu.__wrapped__(
        str(tmp_path / "missing")
    )  # not Linux: platform's answer, no extension
    assert cpu and isa is None


def test_machine_is_json_and_names_the_software():
    import torch

    m = machine()
    assert json.loads(json.dumps(m)) == m
    import fedge

    assert m["fedge"] == fedge.__version__  # from the installed metadata, as the package says
    assert (
        m["torch"] == torch.__version__
        and m["cores"] >= m["usable_cores"] >= 1
        and m["started_utc"].endswith("Z")
    )


def test_resumed_run_records_each_machines_rounds(tmp_path, monkeypatch):
    from fedge.experiment.resume import resume_experiment

    run = unfinished_run(tmp_path / "r", rounds=2)  # rounds 1-2 here, on this machine
    here = json.loads((run / SESSIONS).read_text().splitlines()[0])
    assert here["first_round"] == 1 and here["machine"]["cpu"] == machine()["cpu"]
    monkeypatch.setattr(drive_module, "machine", lambda: at(B, "later"))
    resume_experiment(run, render=False)  # rounds 3-4 "elsewhere"
    summary = json.loads((run / "summary.json").read_text())
    assert [s["rounds"] for s in summary["machines"]] == [[1, 2], [3, 4]]
    assert summary["machines"][1]["machine"] == at(B, "later")
    assert summary["machines"][0]["machine"]["torch"] == here["machine"]["torch"]


def test_read_sessions_skips_torn_and_foreign_lines(tmp_path):
    d = RunDir(tmp_path)
    assert d.read_sessions() == []
    d.record_session(1, A)
    (tmp_path / SESSIONS).write_text(
        (tmp_path / SESSIONS).read_text() + '[1, 2]\n{"first_round": "x"}\n{"first_ro'
    )
    assert d.read_sessions() == [{"first_round": 1, "machine": A}]
