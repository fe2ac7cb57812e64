"""Algorithm 1's schedule: exact counts, d^(t/T) densities, nested masks, global threshold,
determinism by seed, and the baselines."""

from __future__ import annotations

import pytest
import torch

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.core.rng import PortableGenerator
from fedge.models import build_model
from fedge.pruning import (
    SCORERS,
    dense_masks,
    density,
    density_schedule,
    keep_counts,
    prune,
    prune_step,
    pruning_rounds,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def lenet() -> torch.nn.Module:
    # conv1 400, conv2 25,600, out 640 prunable weights on 1x8x8 digits
    return build_model("lenet", input_shape=(1, 8, 8), num_classes=10, seed=0)


def _total(masks: dict[str, torch.Tensor]) -> int:
    return sum(m.numel() for m in masks.values())


def _kept(masks: dict[str, torch.Tensor]) -> int:
    return sum(int(m.sum()) for m in masks.values())


def test_density_schedule_and_keep_counts() -> None:
    assert density_schedule(0.1, 4) == pytest.approx([0.1 ** (t / 4) for t in (1, 2, 3, 4)])
    assert density_schedule(0.1, 4)[-1] == 0.1  # exactly d
    counts = keep_counts(1000, 0.1, 4)
    assert counts == [round(0.1 ** (t / 4) * 1000) for t in (1, 2, 3, 4)] and counts[-1] == 100
    assert counts == sorted(counts, reverse=True)
    assert keep_counts(7, 1.0, 3) == [7, 7, 7]
    for bad in (0.0, 1.5, -0.1, True):
        with pytest.raises(ConfigError, match="density"):
            density_schedule(bad, 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="rounds"):
        density_schedule(0.5, 0)
    with pytest.raises(ConfigError, match="keeps 0"):
        keep_counts(10, 0.01, 2)


def test_prune_step_is_global_exact_nested_and_breaks_ties_by_position() -> None:
    masks = {
        "a": torch.tensor([True, True, False, True]),
        "b": torch.tensor([[True, True], [True, False]]),
    }
    scores = {"a": torch.tensor([0.1, 5.0, 9.0, 0.3]), "b": torch.tensor([[2.0, 0.3], [0.3, 99.0]])}
    out = prune_step(scores, masks, 3)  # 9.0 and 99.0 sit on pruned coordinates: never revived
    assert out["a"].tolist() == [False, True, False, True]  # 5.0, then the 0.3 tie goes to "a"
    assert out["b"].tolist() == [[True, False], [False, False]]  # 2.0
    ties = prune_step({"a": torch.zeros(4), "b": torch.zeros(2, 2)}, masks, 4)
    assert ties["a"].tolist() == [True, True, False, True] and ties["b"].tolist() == [
        [True, False],
        [False, False],
    ]
    with pytest.raises(ConfigError, match="keep"):
        prune_step(scores, masks, 7)  # only 6 live
    with pytest.raises(ConfigError, match="non-finite"):
        prune_step({"a": torch.tensor([float("nan"), 1, 1, 1]), "b": scores["b"]}, masks, 2)
    with pytest.raises(ConfigError, match="shape"):
        prune_step({"a": scores["a"]}, masks, 2)


SCORE_KW = {
    "ntk": {"num_inputs": 4},
    "magnitude": {},
    "random": {},
    "snip": {"batch": (torch.randn(6, 1, 8, 8, generator=_gen(3)), torch.arange(6))},
}


@pytest.mark.parametrize("score", sorted(SCORERS))
def test_rounds_follow_the_schedule_exactly_and_nest(lenet: torch.nn.Module, score: str) -> None:
    rounds, d = 4, 0.05
    history = list(
        pruning_rounds(
            lenet, density=d, rounds=rounds, score=score, generator=_gen(0), **SCORE_KW[score]
        )
    )
    total = _total(history[0])
    assert [_kept(m) for m in history] == keep_counts(total, d, rounds)
    assert _kept(history[-1]) == round(d * total) and density(history[-1], lenet) == pytest.approx(
        d, abs=1 / total
    )
    for before, after in zip(history, history[1:]):
        for n in before:
            assert not bool((after[n] & ~before[n]).any())  # a pruned weight never comes back
    layer = {n: float(m.float().mean()) for n, m in history[-1].items()}
    assert all(v > 0 for v in layer.values())  # no layer collapsed in this small model
    if score != "random":
        assert max(layer.values()) > 2 * min(layer.values())  # the global threshold is uneven


def _portable(seed: int) -> PortableGenerator:
    return PortableGenerator(seed, "prune")


@pytest.mark.parametrize("make", [_gen, _portable])
@pytest.mark.parametrize("score", sorted(SCORERS))
def test_prune_is_deterministic_by_seed(lenet: torch.nn.Module, score: str, make) -> None:
    state = {k: v.clone() for k, v in lenet.state_dict().items()}
    a = prune(lenet, density=0.1, rounds=3, score=score, generator=make(1), **SCORE_KW[score])
    b = prune(lenet, density=0.1, rounds=3, score=score, generator=make(1), **SCORE_KW[score])
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert all(torch.equal(v, state[k]) for k, v in lenet.state_dict().items())  # W0 untouched
    if score in ("ntk", "random"):
        c = prune(lenet, density=0.1, rounds=3, score=score, generator=make(2), **SCORE_KW[score])
        assert any(not torch.equal(a[n], c[n]) for n in a)
        if make is _portable:  # portable draws give another mask than torch's
            t = prune(
                lenet, density=0.1, rounds=3, score=score, generator=_gen(1), **SCORE_KW[score]
            )
            assert any(not torch.equal(a[n], t[n]) for n in a)


@pytest.mark.parametrize("make", [_gen, _portable])
def test_random_baseline_keeps_exactly_the_target_uniformly(lenet: torch.nn.Module, make) -> None:
    total = _total(dense_masks(lenet))
    masks = prune(lenet, density=0.3, rounds=1, score="random", generator=make(4))
    assert _kept(masks) == round(0.3 * total)
    for m in masks.values():  # each layer near 0.3 (binomial-like; 400 weights is the smallest)
        assert abs(float(m.float().mean()) - 0.3) < 0.1


def test_ntk_data_free_needs_an_input_shape_and_snip_needs_data() -> None:
    bare = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    with pytest.raises(ConfigError, match="input_shape"):
        prune(bare, density=0.5, rounds=1, generator=_gen(0))
    masks = prune(bare, density=0.5, rounds=2, generator=_gen(0), input_shape=(4,), num_inputs=3)
    assert _kept(masks) == round(0.5 * 18)
    fixed = prune(
        bare, density=0.5, rounds=2, generator=_gen(0), inputs=torch.randn(5, 4)
    )  # NTK-Ori
    assert _kept(fixed) == 9
    with pytest.raises(ConfigError, match="labelled batch"):
        prune(bare, density=0.5, rounds=1, score="snip", generator=_gen(0))
    with pytest.raises(UnknownNameError, match="grasp"):
        prune(bare, density=0.5, rounds=1, score="grasp", generator=_gen(0))  # type: ignore[arg-type]
