"""benchmarks/fedpt_table5.py: its one-seed verdict names no direction and says what the point
estimates show (hand-made accuracies; nothing is trained)."""

from __future__ import annotations

from fedge.bench.stats import NO_INTERVAL
from tests_helpers import benchmark_script

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
