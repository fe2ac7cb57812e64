"""benchmarks/ppfl_tables.py at a tiny size: every run is recorded, the section comes from the
records, and a rerun with the run directories deleted renders the same tables from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests_helpers import benchmark_script

bench = benchmark_script("ppfl_tables")
TINY = [
    "--seeds",
    "1",
    "--set",
    "dataset.limit_train=160",
    "--set",
    "dataset.limit_test=40",
    "--set",
    "clients.num=4",
    "--set",
    "clients.per_round=2",
]


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script's schedule shrunk to a round or so per run, LeNet only; the globals its ``main``
    sets from the command line (seeds, paths) put back afterwards, so a later test rendering the
    committed section (tests/test_docs_figures.py, in the same process) sees the script's own."""
    for name in ("OUT", "RECORDS", "TABLE_ONLY", "EXTRA", "SEEDS"):
        monkeypatch.setattr(bench, name, getattr(bench, name))
    for name, value in {
        "LENET_ROUNDS": 1,
        "LENET_CAP": 1,
        "UNCAPPED_FEDAVG_ROUNDS": 1,
        "UNCAPPED_ROUNDS": 4,
        "STAGE_PATIENCE": 1,
        "VALIDATION": 40,
        "PHASE_ROUNDS": 1,
        "PUBLIC": 200,
        "LARGE": (),
    }.items():
        monkeypatch.setattr(bench, name, value)


def _tables(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_the_tables_run_record_and_render_again_from_the_records_alone(
    tmp_path: Path, fake_fashion_mnist: Path, tiny: None
) -> None:
    records, out = tmp_path / "records", tmp_path / "runs"
    docs = tmp_path / "benchmarks.md"
    argv = [*TINY, "--out", str(out), "--records", str(records)]
    assert bench.main([*argv, "--uncapped", "--docs", str(docs)]) == 0
    first = docs.read_text()
    assert "awaiting" not in first.lower()
    assert f"Rendered from the committed run records under `{records.as_posix()}/`" in first
    # one record (config + summary row) and one figures record per run
    runs = sorted(p.relative_to(records / "runs") for p in (records / "runs").rglob("*.json"))
    figs = sorted(p.relative_to(records / "figures") for p in (records / "figures").rglob("*.json"))
    assert (
        runs == figs and len(runs) == 2 + 4 + 2 + 4 + 1
    )  # FedAvg, PPFL b1/b2, x2 protocols, transfer
    free = json.loads((records / "runs/lenet-ppfl/seed-0/ppfl-iid-b1-uncapped.json").read_text())
    assert free["config"]["method"]["stage_patience"] == 1
    assert free["config"]["method"]["rounds_per_stage"] is None
    assert free["config"]["dataset"]["validation"] == 40
    assert (records / "phases-lenet-ppfl.json").exists()
    # the uncapped table's FedAvg target is its own FedAvg run's final accuracy
    fa = json.loads((records / "figures/lenet-ppfl/seed-0/fedavg-iid-uncapped.json").read_text())
    free_rows = first.split("LeNet uncapped", 1)[1]
    assert f"| iid | 1 | {fa[-1]['test_accuracy']:.3f} |" in free_rows
    # the run directories gone, nothing runs: the records alone give the same tables
    shutil.rmtree(out)
    docs2 = tmp_path / "again.md"
    assert bench.main([*argv, "--table-only", "--docs", str(docs2)]) == 0
    assert not out.exists()
    second = docs2.read_text()
    wall = ("round wall s",)  # Table 4 is the recorded timing, read back unchanged
    assert _tables(first) == _tables(second) and any(w in first for w in wall)


def test_table_only_without_records_lists_what_awaits_and_runs_nothing(
    tmp_path: Path, tiny: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--table-only", "--seeds", "1"]
    argv += ["--records", str(tmp_path / "none"), "--out", str(tmp_path / "runs")]
    assert bench.main(argv) == 0
    text = capsys.readouterr().out
    assert "*LeNet: awaiting records of 6 run(s)" in text
    assert "*LeNet, uncapped: awaiting records of 6 run(s)" in text
    assert "ppfl-iid-b1-uncapped" in text and not (tmp_path / "runs").exists()


def test_uncapped_rows_drop_the_cap_for_a_validation_plateau() -> None:
    cfg = bench.uncapped(bench.ppfl("lenet-ppfl", "iid", 0.8, 2, seed=1))
    m = cfg["method"]
    assert "rounds_per_stage" not in m and m["target_accuracy"] == 0.8
    assert (m["stage_patience"], m["stage_min_delta"]) == (
        bench.STAGE_PATIENCE,
        bench.STAGE_MIN_DELTA,
    )
    assert cfg["rounds"] == bench.UNCAPPED_ROUNDS
    assert cfg["dataset"]["limit_train"] - cfg["dataset"]["validation"] == 2000
    fa = bench.uncapped(bench.fedavg("lenet-ppfl", "iid", seed=1))
    assert fa["rounds"] == bench.UNCAPPED_FEDAVG_ROUNDS and fa["dataset"] == cfg["dataset"]
