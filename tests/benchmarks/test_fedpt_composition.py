"""benchmarks/fedpt_composition.py: a tiny run records every run, and the records alone render
the same section."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedge.bench.docs import records_line
from tests_helpers import benchmark_script

bench = benchmark_script("fedpt_composition")

SECTION, HEADER = "fedpt-composition", "| row | method.name |"
SEEDS = [0]
LABELS = list(bench.ROWS)
TINY = [
    "--seeds",
    "1",
    "--set",
    "rounds=1",
    "--set",
    "eval_every=1",
    "--set",
    "dataset.limit_train=100",
    "--set",
    "dataset.limit_test=50",
    "--set",
    "method.max_steps=1",
]


# --- the benchmark at a tiny size: records, then the records alone -----------------------------


def test_a_tiny_run_records_each_run_and_the_records_alone_render_the_same_table(
    tmp_path: Path, fake_fashion_mnist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    records, docs = tmp_path / "records", tmp_path / "benchmarks.md"
    argv = [*TINY, "--records", str(records)]
    assert bench.main([*argv, "--out", str(tmp_path / "runs"), "--docs", str(docs)]) == 0
    first = capsys.readouterr().out
    assert HEADER in first and "Awaiting records" not in first
    for kind in ("runs", "figures"):  # one record per finished run, and its figures
        for seed in SEEDS:
            got = sorted(p.name for p in (records / kind / f"seed-{seed}").iterdir())
            assert got == sorted(f"{label}.json" for label in LABELS), (kind, seed, got)
    text = docs.read_text()
    assert f"<!-- bench:{SECTION} -->" in text and records_line(records) in text
    # the run directories gone, the records alone give the same section
    shutil.rmtree(tmp_path / "runs")
    assert bench.main([*argv, "--table-only"]) == 0
    assert capsys.readouterr().out == first
    assert bench.main([*argv, "--estimate"]) == 0
    runs = len(LABELS) * len(SEEDS)
    assert capsys.readouterr().out.startswith(f"0 of {runs} runs not yet recorded: about 0 ")


def test_without_records_the_section_lists_every_run_as_awaiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main([*TINY, "--records", str(tmp_path / "none"), "--table-only"]) == 0
    out = capsys.readouterr().out
    assert HEADER not in out
    awaiting = out.split("Awaiting records (runs to come): ")[1].strip().rstrip(".").split(", ")
    assert awaiting == [f"{label}@{s}" for s in SEEDS for label in LABELS]
