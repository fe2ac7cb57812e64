"""benchmarks/fedpt_composition.py: a tiny run records every run, and the records alone render
the same section."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_helpers import (
    benchmark_script,
    check_unit_records_awaiting,
    check_unit_records_round_trip,
)

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
    check_unit_records_round_trip(
        bench, TINY, section=SECTION, header=HEADER, seeds=SEEDS, labels=LABELS,
        tmp_path=tmp_path, capsys=capsys,
    )  # fmt: skip


def test_without_records_the_section_lists_every_run_as_awaiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_unit_records_awaiting(
        bench, TINY, header=HEADER, seeds=SEEDS, labels=LABELS, tmp_path=tmp_path, capsys=capsys
    )
