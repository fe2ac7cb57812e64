"""Paired comparisons: the t quantiles are Student's, the interval and the paired differences
match scipy's on the seeds both rows have."""

from __future__ import annotations

import statistics

import pytest

from fedge.bench.stats import (
    T_975,
    comparison,
    direction,
    paired_difference,
    size,
    t_interval,
    verdict,
)

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


# Hand-computed cases of the two-part verdict (BAFFLE Table 1's records, 10,000 samples, points):
# BP FedAvg − K=100: diffs +15.9, +20.7, +19.5 → mean 18.70, 95% interval +12.5..+24.9; paper
# 94.31 − 87.27 = +7.04, outside the interval: 18.70 / 7.04 = 2.66.
def test_verdict_same_direction_with_a_larger_effect_gives_the_ratio() -> None:
    assert verdict(12.5, 24.9, 18.70, 7.04) == "same direction; 2.7× the paper's"


def test_verdict_size_matches_only_when_the_papers_figure_is_inside() -> None:
    # K=200 − K=100: +2.81 (+2.0..+3.6) against the paper's +2.21
    assert verdict(2.0, 3.6, 2.81, 2.21) == "same direction; size matches"
    # central − twice-FD: -3.21 (-5.5..-0.9) against -11.25: 3.21 / 11.25 = 0.285
    assert verdict(-5.5, -0.9, -3.21, -11.25) == "same direction; 0.29× the paper's"
    # the edges count as inside
    assert size(2.21, 3.6, 2.81, 2.21) == size(1.0, 2.21, 1.5, 2.21) == "size matches"


def test_verdict_opposite_when_the_interval_excludes_0_on_the_other_side() -> None:
    # w/o EMA − K=100: +0.67 (+0.3..+1.1) where the paper has -2.21: 0.67 / -2.21 = -0.303
    assert verdict(0.3, 1.1, 0.67, -2.21) == "opposite direction; -0.30× the paper's"
    assert direction(-3.0, -0.1, +5.0) == "opposite direction"


def test_verdict_not_resolved_when_the_interval_holds_0() -> None:
    # SELU − Hardswish on 10,000 samples: +3.07 (-3.4..+9.5) against the paper's -1.09: the
    # paper's figure is inside the interval, so is 0
    assert verdict(-3.4, 9.5, 3.07, -1.09) == "not resolved (the interval holds 0); size matches"
    # ReLU on 30,000: -1.22 (-3.0..+0.6) against -5.72: 1.22 / 5.72 = 0.213
    assert verdict(-3.0, 0.6, -1.22, -5.72) == (
        "not resolved (the interval holds 0); 0.21× the paper's"
    )
    assert direction(0.0, 1.0, 1.0) == "not resolved (the interval holds 0)"  # 0 is in [0, 1]


def test_selu_against_hardswish_over_both_tables_is_opposite() -> None:
    # SELU − Hardswish per seed (points), 10,000 samples +0.6, +5.8, +2.9 and 30,000 samples +1.1,
    # +3.7, +2.7: mean 16.8 / 6 = 2.8, squared deviations sum 17.56, std sqrt(17.56 / 5) = 1.874,
    # half-width 2.571 · 1.874 / sqrt(6) = 1.967: the interval +0.83..+4.77 excludes 0 on the
    # other side of the paper's -1.09 (SELU below Hardswish), and 2.8 / -1.09 = -2.57
    lo, hi = t_interval([0.6, 5.8, 2.9, 1.1, 3.7, 2.7])
    assert (lo, hi) == pytest.approx((0.833, 4.767), abs=1e-3)
    assert verdict(lo, hi, 2.8, -1.09) == "opposite direction; -2.6× the paper's"


def test_verdict_without_a_paper_figure_has_a_direction_but_no_size() -> None:
    # NTK − magnitude-pruned: +2.25 (-2.0..+6.5) where the paper says only "NTK higher"
    assert verdict(-2.0, 6.5, 2.25, None, sign=+1) == (
        "not resolved (the interval holds 0); no figure in the paper to size against"
    )
    assert verdict(0.5, 1.5, 1.0, None, sign=-1) == (
        "opposite direction; no figure in the paper to size against"
    )
    with pytest.raises(ValueError, match="no paper figure and sign 0"):
        verdict(0.5, 1.5, 1.0, None)
    with pytest.raises(ValueError, match="sign -1.0 contradicts the paper's figure 2.0"):
        verdict(0.5, 1.5, 1.0, 2.0, sign=-1.0)
    assert verdict(0.5, 1.5, 1.0, 2.0, sign=+1.0) == verdict(0.5, 1.5, 1.0, 2.0)


def test_comparison_names_who_is_ahead_only_when_the_interval_excludes_0() -> None:
    ahead = ("local_set ahead", "batch ahead")
    # local_set − batch at equal forwards: -13.80, interval -27.598..-0.002: batch ahead, just
    assert comparison(-27.598, -0.002, ahead) == "batch ahead"
    assert comparison(0.3, 1.1, ahead) == "local_set ahead"
    assert comparison(-4.14, 9.57, ahead) == "not resolved (the interval holds 0)"
    assert comparison(0.0, 2.0, ahead) == "not resolved (the interval holds 0)"  # 0 is inside
    with pytest.raises(ValueError, match="expected lo <= hi"):
        comparison(1.0, 0.0, ahead)


def test_verdict_ratio_digits_follow_its_magnitude() -> None:
    assert size(30.0, 40.0, 35.0, 2.5) == "14× the paper's"
    assert size(1.0, 2.0, 1.5, 0.5) == "3.0× the paper's"
    assert size(0.01, 0.02, 0.012, 1.0) == "0.01× the paper's"


def test_verdict_rejects_what_has_no_direction_or_no_interval() -> None:
    with pytest.raises(ValueError, match="the paper's sign is 0"):
        direction(1.0, 2.0, 0.0)
    with pytest.raises(ValueError, match="the paper's figure is 0"):
        size(1.0, 2.0, 1.5, 0.0)
    with pytest.raises(ValueError, match="interval 2.0..1.0: expected lo <= hi"):
        verdict(2.0, 1.0, 1.5, 1.0)
