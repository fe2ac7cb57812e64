"""The reproduction scripts' shared command line, and each long script end to end on its smoke
protocol (screen, picks, seeds, records, table), so a 10-CPU-hour run cannot fail at its last step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from fedge.bench.script import (
    parse_only,
    parse_reproduction_args,
    parse_shard,
    progress_action,
    reproduction_parser,
    runs_parser,
    script_command,
    usage_errors,
)
from tests_helpers import unfinished_run

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0/1", (0, 1)),
        ("1/2", (1, 2)),
        ("3/4", (3, 4)),
        ("2/2", None),
        ("-1/2", None),
        ("1", None),
        ("a/b", None),
        ("1/2/3", None),
        ("0/0", None),
    ],
)
def test_parse_shard(text, expected):
    assert parse_shard(text) == expected


def test_parser_has_the_shared_flags_and_the_scripts_own():
    ap = reproduction_parser("doc", out="runs/x")
    ap.add_argument("--k500", action="store_true")
    args, shard, shards = parse_reproduction_args(ap, ["--shard", "1/3", "--k500", "--table-only"])
    assert (
        (shard, shards) == (1, 3)
        and args.k500
        and args.table_only
        and args.out == "runs/x"
        and not args.smoke
    )
    assert not hasattr(
        parse_reproduction_args(reproduction_parser("d", out="o", smoke=False), [])[0], "smoke"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("BAFFLE K=200", ("BAFFLE K=200", None)),
        ("BAFFLE K=200@2", ("BAFFLE K=200", 2)),
        ("a@b@3", ("a@b", 3)),
        ("K=200@two", None),
        ("@1", None),
        ("K@", None),
        ("", None),
    ],
)
def test_parse_only(text, expected):
    assert parse_only(text) == expected


def test_only_arrives_as_label_seed_pairs():
    args, _, _ = parse_reproduction_args(
        reproduction_parser("d", out="o"), ["--only", "K=100 SELU@2", "--only", "BP FedAvg"]
    )
    assert args.only == [("K=100 SELU", 2), ("BP FedAvg", None)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shard", "2/2"], "--shard '2/2': expected I/N with 0 <= I < N"),
        (["--smoke", "--docs", "docs/benchmarks.md"], "--smoke writes no docs: drop --docs"),
        (["--only", "K=200@two"], "--only 'K=200@two': expected a variant's label, or LABEL@SEED"),
        (
            ["--table-only", "--save-progress"],
            "--table-only and --save-progress exclude each other",
        ),
        (
            ["--save-progress", "--restore-progress"],
            "--save-progress and --restore-progress exclude each other",
        ),
        (
            ["--save-progress", "--progress-max-mb", "-1"],
            "--progress-max-mb -1: expected a size in MB >= 0",
        ),
    ],
)
def test_bad_arguments_exit_2_with_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_reproduction_args(reproduction_parser("doc", out="o"), argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_config_error_inside_usage_errors_exits_2_with_its_line(capsys):
    from fedge.core.errors import ConfigError

    ap = reproduction_parser("doc", out="o")
    with pytest.raises(SystemExit) as exc, usage_errors(ap):
        raise ConfigError("--only ['c']: not a variant of this table; expected one of ['a']")
    assert exc.value.code == 2 and "error: --only ['c']: not a variant" in capsys.readouterr().err
    with usage_errors(ap):
        pass  # nothing raised: nothing happens


def test_progress_flags_save_then_restore_through_the_records_folder(tmp_path, capsys):
    out, records = tmp_path / "runs", tmp_path / "records"
    unfinished_run(out / "seed-0" / "a", 1)
    args, _, _ = parse_reproduction_args(
        reproduction_parser("d", out=str(out)), ["--save-progress"]
    )
    assert progress_action(args, records) and (records / "in-progress.tar.gz").exists()
    assert "seed-0/a (round 1)" in capsys.readouterr().out
    fresh = tmp_path / "fresh"
    args, _, _ = parse_reproduction_args(
        reproduction_parser("d", out=str(fresh)), ["--restore-progress"]
    )
    assert progress_action(args, records) and (fresh / "seed-0" / "a" / "checkpoint.pt").exists()
    assert f"restored under {fresh}: seed-0/a (round 1)" in capsys.readouterr().out
    assert not progress_action(
        parse_reproduction_args(reproduction_parser("d", out="o"), [])[0], records
    )
    # A run too large to commit at every save is named, with what it costs and the way to keep it.
    args, _, _ = parse_reproduction_args(
        reproduction_parser("d", out=str(out)), ["--save-progress", "--progress-max-mb", "0.01"]
    )
    assert progress_action(args, records) and not (records / "in-progress.tar.gz").exists()
    said = capsys.readouterr().out
    assert "nothing to carry (archive removed)" in said
    assert (
        "not carried: seed-0/a (round 1, 0.4 MB > --progress-max-mb 0.01)" in said
        and "--progress-max-mb 1)" in said
    )


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "needle"),
    [("baffle_table2", "BAFFLE's skew cost"), ("ntk_table3", "NTK-Rand − NTK-Ori")],
)
@pytest.mark.usefixtures("fake_fashion_mnist")  # the pipeline, not the figures: made images
def test_smoke_protocol_runs_end_to_end_and_resumes(name, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = _script(name)
    out = tmp_path / "out"
    assert script.main(["--smoke", "--out", str(out)]) == 0
    # the context rows run apart (--context), once the screen has picked
    assert (
        "| SGD NTK-BAFFLE K=8, clip 0.3 | 0 | not run yet |"
        if name == "ntk_table3"
        else "The context screen is not finished."
    ) in capsys.readouterr().out
    assert script.main(["--smoke", "--context", "--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert needle in first and "Picked:" in first and "not run yet" not in first
    records = sorted(p.relative_to(out) for p in out.rglob("*.json") if p.parent.name != out.name)
    assert records, "the smoke protocol writes its records under --out"
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.json")}
    assert script.main(["--smoke", "--out", str(out), "--table-only"]) == 0
    assert capsys.readouterr().out == first  # the table comes from the records alone
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.json")} == stamps


def test_runs_parser_and_the_command_line_shown_in_the_docs():
    args = runs_parser("doc", out="runs/x").parse_args(["--docs", "d.md"])
    assert (args.out, args.docs) == ("runs/x", "d.md")
    assert script_command(
        "/any/where/benchmarks/fedpt_table1.py", ["--seeds", "3", "--docs", "d.md"]
    ) == ("python benchmarks/fedpt_table1.py --seeds 3 --docs d.md")
    assert (
        script_command("fedpt_table5.py", []) == "python benchmarks/fedpt_table5.py"
    )  # no trailing space


def test_parse_settings_reads_each_value_as_its_defaults_type():
    from fedge.bench.script import parse_settings
    from fedge.core.errors import ConfigError

    defaults = {"model": "lenet5", "rounds": 20, "lr": 0.05}
    s = parse_settings(defaults, ["rounds=8", "lr=0.1", "model=vgg"])
    assert (
        s == {"model": "vgg", "rounds": 8, "lr": 0.1}
        and type(s["rounds"]) is int
        and type(s["lr"]) is float
    )
    assert (
        parse_settings(defaults, []) == defaults and defaults["rounds"] == 20
    )  # the defaults are not changed
    with pytest.raises(
        ConfigError, match=r"unknown setting 'round'; expected one of \['lr', 'model', 'rounds'\]"
    ):
        parse_settings(defaults, ["round=8"])
    with pytest.raises(
        ConfigError, match=r"setting rounds='x' is not a number; expected e.g. rounds=20"
    ):
        parse_settings(defaults, ["rounds=x"])
    with pytest.raises(
        ConfigError, match=r"rounds='2.5' is not a number"
    ):  # an int setting takes no fraction
        parse_settings(defaults, ["rounds=2.5"])


def test_a_saved_measurement_loads_back_whole(tmp_path):
    from fedge.bench.script import load_measurement, save_measurement

    record = {
        "settings": {"rounds": 2},
        "seconds": 1.5,
        "results": [{"row": "a", "auc": 0.5, "where": Path("x")}],
    }
    save_measurement(tmp_path / "m.json", record)
    assert load_measurement(tmp_path / "m.json") == {
        **record,
        "results": [{"row": "a", "auc": 0.5, "where": "x"}],
    }


@pytest.mark.parametrize("name", ["mia_overfit", "privacy_leakage"])
def test_a_bad_setting_exits_2_naming_it_before_measuring(name, tmp_path, capsys):
    docs = tmp_path / "benchmarks.md"
    with pytest.raises(SystemExit) as exc:
        _script(name).main(
            ["--docs", str(docs), "--set", "rounds=x" if name == "mia_overfit" else "bogus=1"]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and not docs.exists()
    assert (
        "error: setting rounds='x' is not a number; expected e.g. rounds=20"
        if name == "mia_overfit"
        else "error: unknown setting 'bogus'; expected one of ['clients', 'dataset',"
    ) in err


def test_report_and_document_prints_and_keeps_the_record_the_section_is_rendered_from(
    tmp_path, capsys
):
    import json

    from fedge.bench.measured import Section, opening_line, start
    from fedge.bench.script import report_and_document

    docs = tmp_path / "docs" / "benchmarks.md"
    report = {"rows": {"a": {"accuracy": 0.5}}}
    section = Section("t", "T", lambda r, command: f"Command: `{command}`\n\n| {r['rows']} |")
    kw = {"section": section, "script": "b/t.py"}
    assert report_and_document(report, "| a |", None, argv=[], started=start(), **kw) == 0
    assert (
        capsys.readouterr().out == json.dumps(report, indent=2) + "\n| a |\n" and not docs.exists()
    )
    argv = ["--docs", str(docs)]
    assert report_and_document(report, "| a |", str(docs), argv=argv, started=start(), **kw) == 0
    record = json.loads((tmp_path / "benchmarks/results/measured/t.json").read_text())
    command = f"python benchmarks/t.py --docs {docs}"
    assert record["report"] == report and record["command"] == command
    line = opening_line(record, "benchmarks/results/measured/t.json")
    assert (
        f"## T\n\n{line}\n\nCommand: `{command}`\n\n| {report['rows']} |\n<!-- /bench:t -->"
        in docs.read_text()
    )


@pytest.mark.parametrize(
    ("cores", "argv", "warns"),
    [
        (
            {0, 1},
            ["--shard", "1/2"],
            True,
        ),  # two workers sharing both cores: warned, with the pinning fix
        ({1}, ["--shard", "1/2"], False),  # pinned to one core
        ({0, 1}, [], False),  # one process: it may use every core
        ({0, 1}, ["--shard", "0/2", "--table-only"], False),  # tabulating runs nothing
    ],
)
def test_an_unpinned_shard_is_warned_about(cores, argv, warns, monkeypatch, recwarn):
    monkeypatch.setattr("fedge.bench.script.os.sched_getaffinity", lambda pid: cores)
    parse_reproduction_args(reproduction_parser("d", out="o"), argv)
    messages = [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert bool(messages) == warns
    if warns:
        assert "taskset -c 1" in messages[0] and "2 cores" in messages[0]
