"""Paired comparisons of two seeded variants: the per-seed differences of a metric and the 95%
Student t interval of their mean (the same seed draws the same data and initial model in both
runs, so the seeds pair)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["T_975", "paired_difference", "t_interval"]


# Two-sided 95% quantiles of Student's t by degrees of freedom (scipy.stats.t.ppf(0.975, df)).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t_interval(diffs: Sequence[float]) -> tuple[float, float]:
    """The 95% Student t interval of the mean of ``diffs`` (at least two values; normal
    quantile beyond 10). With 3 seeds the half-width is 4.303 · std / sqrt(3) ≈ 2.5 std."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {n}")
    mean, half = statistics.mean(diffs), T_975.get(n - 1, 1.96) * statistics.stdev(diffs) / n**0.5
    return mean - half, mean + half


def paired_difference(
    a: dict[str, Any], b: dict[str, Any], key: str = "final_test_accuracy"
) -> dict[str, Any] | None:
    """``a − b`` of two :func:`fedge.bench.variants.run_seeded_variants` rows over the seeds
    both have: the per-seed differences (the same seed draws the same data subset and initial
    model in both), their mean, sample std and 95% t interval of the mean (``lo``, ``hi``). None with fewer than two
    common seeds."""
    av = {r["seed"]: r[key] for r in a["runs"]}
    bv = {r["seed"]: r[key] for r in b["runs"]}
    common = sorted(av.keys() & bv.keys())
    if len(common) < 2:
        return None
    diffs = [av[s] - bv[s] for s in common]
    lo, hi = t_interval(diffs)
    return {
        "seeds": common,
        "diffs": diffs,
        "mean": statistics.mean(diffs),
        "std": statistics.stdev(diffs),
        "lo": lo,
        "hi": hi,
    }
