"""benchmarks/fedpt_table1.py: the frozen − fully trainable accuracy gap, paired by seed, with its
two-part verdict against the paper's Table 1 (hand-made accuracies); a tiny run records every
run, and the records alone render the same section."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedge.bench.stats import NO_INTERVAL
from tests_helpers import (
    benchmark_script,
    check_unit_records_awaiting,
    check_unit_records_round_trip,
)

bench = benchmark_script("fedpt_table1")


def _rows(full: list[float], frozen: list[float]) -> tuple[dict, dict]:
    return {"accuracies": full}, {"accuracies": frozen}


def test_paper_gap_is_table_1s() -> None:
    assert bench.PAPER_GAP == pytest.approx(-1.72)


def test_gap_paired_by_seed_against_the_papers() -> None:
    # frozen − full per seed: -7, -8, -6 points: mean -7.00, std 1.00, 95% half-width
    # 4.303 / sqrt(3) = 2.48: -9.5..-4.5, excluding 0 with the paper's sign and its -1.72
    # outside: -7.00 / -1.72 = 4.07
    text = bench.verdict_sentence(*_rows([0.77, 0.78, 0.76], [0.70, 0.70, 0.70]))
    assert text == (
        "Against the paper's -1.72 points (frozen − fully trainable, paired by seed: -7.00 ± 1.00 "
        "points, seeds 0: -7.0, 1: -8.0, 2: -6.0; 95% interval -9.5 to -4.5) → same direction; "
        "4.1× the paper's."
    )
    # frozen ahead on every seed: +1, +2, +3 points: +2.00, 95% interval -0.5..+4.5 holds 0
    text = bench.verdict_sentence(*_rows([0.70, 0.70, 0.70], [0.71, 0.72, 0.73]))
    assert text.endswith(
        "95% interval -0.5 to +4.5) → not resolved (the interval holds 0); -1.2× the paper's."
    )


def test_one_seed_has_no_direction() -> None:
    text = bench.verdict_sentence(*_rows([0.77], [0.70]))
    assert (
        text
        == f"Against the paper's -1.72 points (frozen − fully trainable): direction {NO_INTERVAL}; size not compared."
    )


SECTION, HEADER = "fedpt-table1", "| model | trainable % |"
SEEDS = [0, 1]
LABELS = list(bench.ROWS)
TINY = [
    "--seeds",
    "2",
    "--set",
    "rounds=1",
    "--set",
    "eval_every=1",
    "--set",
    "dataset.limit_train=100",
    "--set",
    "dataset.limit_test=50",
    "--set",
    "measure.flops=false",
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
