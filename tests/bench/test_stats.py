"""Paired comparisons: the t quantiles are Student's, the interval and the paired differences
match scipy's on the seeds both rows have."""

from __future__ import annotations

import statistics

import pytest

from fedge.bench.stats import T_975, paired_difference, t_interval

scipy_stats = pytest.importorskip("scipy.stats")


def test_t_quantiles_are_students_and_beyond_the_table_the_normal_one() -> None:
    for df, q in T_975.items():
        assert q == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=5e-4)
    diffs = [0.01 * i for i in range(12)]  # 11 degrees of freedom: past the table
    lo, hi = t_interval(diffs)
    half = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5
    assert (lo, hi) == pytest.approx((statistics.mean(diffs) - half, statistics.mean(diffs) + half))


def test_t_interval_matches_scipy_and_needs_two_values() -> None:
    diffs = [0.012, -0.004, 0.020, 0.007]
    want = scipy_stats.t.interval(
        0.95, len(diffs) - 1, loc=statistics.mean(diffs), scale=scipy_stats.sem(diffs)
    )
    assert t_interval(diffs) == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError, match="at least 2 values, got 1"):
        t_interval([0.1])


def _row(by_seed: dict[int, float]) -> dict[str, object]:
    return {"runs": [{"seed": s, "final_test_accuracy": a} for s, a in by_seed.items()]}


def test_paired_difference_pairs_the_common_seeds_only() -> None:
    a = _row({0: 0.80, 1: 0.82, 2: 0.79, 3: 0.90})
    b = _row({2: 0.75, 0: 0.78, 1: 0.81, 4: 0.50})  # seeds 3 and 4 have no partner
    d = paired_difference(a, b)
    assert d is not None and d["seeds"] == [0, 1, 2]
    assert d["diffs"] == pytest.approx([0.02, 0.01, 0.04])
    assert d["mean"] == pytest.approx(statistics.mean([0.02, 0.01, 0.04]))
    assert d["std"] == pytest.approx(statistics.stdev([0.02, 0.01, 0.04]))
    assert (d["lo"], d["hi"]) == pytest.approx(t_interval([0.02, 0.01, 0.04]))
    assert paired_difference(a, _row({0: 0.7, 9: 0.1})) is None  # one common seed: no spread
