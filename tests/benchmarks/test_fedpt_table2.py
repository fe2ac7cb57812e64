"""benchmarks/fedpt_table2.py: its clients are Dirichlet(1) as the paper's; a tiny run records
every run, and the records alone render the same section."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_helpers import (
    benchmark_script,
    check_unit_records_awaiting,
    check_unit_records_round_trip,
)

bench = benchmark_script("fedpt_table2")

SECTION, HEADER = "fedpt-table2", "| frozen (method.freeze) |"
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
    "dataset.limit_train=300",  # Dirichlet(1) with at least 10 samples a client
    "--set",
    "dataset.limit_test=50",
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


def test_the_clients_are_dirichlet_1_as_the_papers() -> None:
    from fedge.core.config import load_config

    cfg = load_config(bench.PRESET, overrides=bench.COMMON)
    part = cfg.partition.model_dump()
    assert part["name"] == "dirichlet" and part["alpha"] == 1.0
    assert "Dirichlet(1)" in bench.section(
        {"rows": {}, "seeds": 3, "missing": [], "complete": False}
    )
