"""Paired comparisons of two seeded variants: the per-seed differences of a metric and the 95%
Student t interval of their mean (the same seed draws the same data and initial model in both
runs, so the seeds pair), and the verdict of such an interval against a paper's figure, in two
parts: the direction (does the interval exclude 0, with the paper's sign?) and the size (does it
hold the paper's figure, or how large is fedge's effect against it?). Every docs section that
renders a verdict takes its words from here: :func:`verdict` against a paper's claim,
:func:`comparison` for a difference between two of fedge's own variants that no paper reports."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = [
    "NO_INTERVAL",
    "OPPOSITE",
    "SAME",
    "UNRESOLVED",
    "NO_FIGURE",
    "T_975",
    "comparison",
    "direction",
    "paired_difference",
    "size",
    "t_interval",
    "verdict",
]


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


#: The direction of a comparison run on one seed: no interval, so no direction, whatever the point
#: estimates show (a script that writes one says so, then what the point estimates show).
NO_INTERVAL = "not resolved (one seed: no interval)"

#: The three directions :func:`direction` gives (:func:`comparison` gives the third too).
SAME, OPPOSITE, UNRESOLVED = (
    "same direction",
    "opposite direction",
    "not resolved (the interval holds 0)",
)


def direction(lo: float, hi: float, sign: float) -> str:
    """The direction of a 95% interval ``lo``..``hi`` of fedge's effect against the sign the paper
    reports (``sign`` > 0: the paper's effect is positive): "same direction" when the interval
    excludes 0 on the paper's side, "opposite direction" when it excludes 0 on the other, else
    "not resolved (the interval holds 0)".

    >>> direction(0.5, 2.0, +1), direction(-3.0, -0.5, +1), direction(-1.0, 2.0, -1)
    ('same direction', 'opposite direction', 'not resolved (the interval holds 0)')
    """
    if lo > hi:
        raise ValueError(f"interval {lo}..{hi}: expected lo <= hi")
    if sign == 0:
        raise ValueError("the paper's sign is 0: expected a positive or negative effect")
    if lo > 0 or hi < 0:
        return SAME if (lo > 0) == (sign > 0) else OPPOSITE
    return UNRESOLVED


def comparison(lo: float, hi: float, ahead: tuple[str, str]) -> str:
    """The verdict on a difference A − B (95% interval ``lo``..``hi``) that no paper reports, so
    has no direction to match: ``ahead[0]`` (A ahead) when the interval lies above 0,
    ``ahead[1]`` (B ahead) when below, else "not resolved (the interval holds 0)".

    >>> comparison(0.4, 1.2, ("BAFFLE ahead", "BP ahead")), comparison(-2.0, -0.1, ("A", "B"))
    ('BAFFLE ahead', 'B')
    >>> comparison(-0.3, 0.2, ("A", "B"))
    'not resolved (the interval holds 0)'
    """
    if lo > hi:
        raise ValueError(f"interval {lo}..{hi}: expected lo <= hi")
    return ahead[0] if lo > 0 else ahead[1] if hi < 0 else UNRESOLVED


#: The size part of a verdict where the paper reports a direction but no figure for the effect.
NO_FIGURE = "no figure in the paper to size against"


def _ratio(r: float) -> str:
    return f"{r:.0f}" if abs(r) >= 10 else f"{r:.1f}" if abs(r) >= 1 else f"{r:.2f}"


def size(lo: float, hi: float, mean: float, paper: float) -> str:
    """The size of fedge's effect (``mean``, its 95% interval ``lo``..``hi``) against the paper's
    figure ``paper`` (same units): "size matches" when the paper's figure lies in the interval,
    else the ratio of fedge's mean effect to the paper's, "2.7× the paper's" (negative when the
    two have opposite signs).

    >>> size(12.5, 24.9, 18.70, 7.04), size(2.0, 3.6, 2.81, 2.21), size(-2.7, -0.1, -1.38, -5.72)
    ("2.7× the paper's", 'size matches', "0.24× the paper's")
    """
    if lo > hi:
        raise ValueError(f"interval {lo}..{hi}: expected lo <= hi")
    if paper == 0:
        raise ValueError("the paper's figure is 0: a ratio to it is undefined")
    if lo <= paper <= hi:
        return "size matches"
    return f"{_ratio(mean / paper)}× the paper's"


def verdict(lo: float, hi: float, mean: float, paper: float | None, sign: float = 0.0) -> str:
    """Both parts of a reproduction's verdict, "direction; size" (:func:`direction` against the
    sign of ``paper``, :func:`size` against its value): a claim reproduces in direction and size
    only when it reads "same direction; size matches". ``lo``, ``hi``, ``mean`` and ``paper`` are
    in the same units (e.g. points of accuracy). Where the paper states a direction but no figure
    (``paper`` None), the direction is taken against ``sign`` and the size part says so
    (:data:`NO_FIGURE`); with a figure, ``sign`` (when given) must agree with it.

    >>> verdict(12.5, 24.9, 18.70, 7.04)
    "same direction; 2.7× the paper's"
    >>> verdict(0.9, 4.7, 2.79, -1.09)
    "opposite direction; -2.6× the paper's"
    >>> verdict(-2.0, 6.5, 2.25, None, sign=+1)
    'not resolved (the interval holds 0); no figure in the paper to size against'
    """
    if paper is None:
        if sign == 0:
            raise ValueError(
                "no paper figure and sign 0: pass the sign of the effect the paper claims"
            )
        return f"{direction(lo, hi, sign)}; {NO_FIGURE}"
    if sign * paper < 0:
        raise ValueError(
            f"sign {sign} contradicts the paper's figure {paper}: expected the same sign"
        )
    return f"{direction(lo, hi, paper)}; {size(lo, hi, mean, paper)}"
