"""benchmarks/fedpt_table5.py: its one-seed verdict names no direction and says what the point
estimates show, with seeds it pairs FT's and PT's losses by seed (hand-made accuracies); a tiny
run records every run, and the records alone render the same section."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedge.bench.stats import NO_INTERVAL
from tests_helpers import (
    benchmark_script,
    check_unit_records_awaiting,
    check_unit_records_round_trip,
)

bench = benchmark_script("fedpt_table5")


def _report(ft: list[float], pt: list[float]) -> dict:
    zs = [0.0, 1.13, 2.33]
    rows = {f"FT z={z:g}": {"accuracy": a} for z, a in zip(zs, ft, strict=True)}
    rows |= {f"PT z={z:g}": {"accuracy": a} for z, a in zip(zs, pt, strict=True)}
    return {"z": zs, "rows": rows}


def test_one_seed_reads_no_direction_whatever_the_point_estimates_show() -> None:
    agree = bench.verdict(_report([0.60, 0.55, 0.50], [0.60, 0.58, 0.57]))
    assert "FT loses 10.0 points and PT 3.0" in agree
    assert f"direction {NO_INTERVAL}; size not compared" in agree
    assert "the point estimates agree with the paper" in agree and "reproduces" not in agree
    flips = bench.verdict(_report([0.60, 0.55, 0.50], [0.60, 0.54, 0.52]))
    assert "do not agree: PT is ahead at z = 2.33 and not at z = 1.13" in flips
    assert f"direction {NO_INTERVAL}" in flips


SECTION, HEADER = "fedpt-table5", "| | z = 0 (clip only) | z = 1.13 |"
SEEDS = [0, 1]
LABELS = ["FT z=0", "PT z=0", "FT z=1.13", "PT z=1.13"]
TINY = [
    "--seeds",
    "2",
    "--z",
    "0,1.13",
    "--set",
    "rounds=2",
    "--set",
    "eval_every=1",
    "--set",
    "dataset.limit_train=400",
    "--set",
    "dataset.limit_test=50",
    "--set",
    "clients.num=40",
    "--set",
    "clients.per_round=10",
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


def test_with_seeds_the_verdict_pairs_ft_and_pt_losses_by_seed() -> None:
    # FT loses 10, 12, 8 points from z = 0 to 2.33; PT 3, 4, 2: FT − PT 7, 8, 6 → mean 7, std 1,
    # 95% half-width 4.303 / sqrt(3) = 2.48: 4.5..9.5, above 0 (the paper's direction)
    zs = [0.0, 1.13, 2.33]
    rows = {
        "FT z=0": [0.60, 0.62, 0.58],
        "FT z=1.13": [0.55, 0.55, 0.55],
        "FT z=2.33": [0.50, 0.50, 0.50],
        "PT z=0": [0.60, 0.60, 0.60],
        "PT z=1.13": [0.58, 0.58, 0.58],
        "PT z=2.33": [0.57, 0.56, 0.58],
    }
    report = {
        "z": zs,
        "rows": {k: {"accuracy": sum(v) / 3, "accuracies": v, "seeds": 3} for k, v in rows.items()},
    }
    text = bench.verdict(report)
    assert (
        "paired by seed: +7.00 points, seeds 0: +7.0, 1: +8.0, 2: +6.0; 95% interval +4.5 to +9.5 "
        "→ same direction;"
    ) in text
    assert NO_INTERVAL not in text and "One seed" not in text
