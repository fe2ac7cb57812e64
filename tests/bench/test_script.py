"""The reproduction scripts' shared command line, and each long script end to end on its smoke
protocol (screen, picks, seeds, records, table), so a 10-CPU-hour run cannot fail at its last step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from fedge.bench.script import parse_reproduction_args, parse_shard, reproduction_parser, runs_parser, script_command

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0/1", (0, 1)), ("1/2", (1, 2)), ("3/4", (3, 4)), ("2/2", None), ("-1/2", None), ("1", None), ("a/b", None),
     ("1/2/3", None), ("0/0", None)],
)  # fmt: skip
def test_parse_shard(text, expected):
    assert parse_shard(text) == expected


def test_parser_has_the_shared_flags_and_the_scripts_own():
    ap = reproduction_parser("doc", out="runs/x")
    ap.add_argument("--k500", action="store_true")
    args, shard, shards = parse_reproduction_args(ap, ["--shard", "1/3", "--k500", "--table-only"])
    assert (shard, shards) == (1, 3) and args.k500 and args.table_only and args.out == "runs/x" and not args.smoke
    assert not hasattr(parse_reproduction_args(reproduction_parser("d", out="o", smoke=False), [])[0], "smoke")


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--shard", "2/2"], "--shard '2/2': expected I/N with 0 <= I < N"),
     (["--smoke", "--docs", "docs/benchmarks.md"], "--smoke writes no docs: drop --docs")],
)  # fmt: skip
def test_bad_arguments_exit_2_with_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_reproduction_args(reproduction_parser("doc", out="o"), argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


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
@pytest.mark.parametrize(("name", "needle"), [("baffle_table2", "BAFFLE's skew cost"), ("ntk_table3", "NTK-Rand − NTK-Ori")])
def test_smoke_protocol_runs_end_to_end_and_resumes(name, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = _script(name)
    out = tmp_path / "out"
    assert script.main(["--smoke", "--out", str(out)]) == 0
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
    assert script_command("/any/where/benchmarks/fedpt_table1.py", ["--seeds", "3", "--docs", "d.md"]) == (
        "python benchmarks/fedpt_table1.py --seeds 3 --docs d.md"
    )
    assert script_command("fedpt_table5.py", []) == "python benchmarks/fedpt_table5.py"  # no trailing space
