"""Lean mode: weights and buffers restored exactly, masks honoured, memory O(largest parameter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fedge.core.errors import ConfigError
from fedge.estimators import estimate_gradient, loss_differences
from fedge.estimators.perturbation import standard_normal


class Recording(nn.Linear):
    """A Linear that records the weight its forward actually uses."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.weight.detach().clone())
        return super().forward(x)


def _convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4),
        nn.Hardswish(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 5),
    )


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 1, 8, 8, generator=g), torch.randint(0, 5, (6,), generator=g)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_parameters_and_buffers_restored_bit_for_bit(scheme: str) -> None:
    model = _convnet().train()  # BatchNorm updates running stats in train-mode forwards
    before = _state(model)
    ids = [id(p) for p in model.parameters()]
    loss_differences(model, F.cross_entropy, _batch(), k=5, sigma=1e-2, seed=0, scheme=scheme)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [id(p) for p in model.parameters()] == ids
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())


def test_restored_when_a_forward_raises() -> None:
    model = _convnet()
    before = _state(model)

    def bad_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        loss_differences(model, bad_loss, _batch(), k=2, sigma=1e-2, seed=0, scheme="central")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_forward_sees_perturbation_only_on_selected_unmasked_coordinates() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Recording(3, 4), nn.Tanh(), Recording(4, 2))
    for m in (model[0], model[2]):
        m.seen = []
    mask = torch.zeros(4, 3, dtype=torch.bool)
    mask[1:3] = True
    w0, w2 = model[0].weight.detach().clone(), model[2].weight.detach().clone()
    sigma = 0.1
    loss_differences(
        model,
        F.cross_entropy,
        (torch.randn(5, 3), torch.randint(0, 2, (5,))),
        k=2,
        sigma=sigma,
        seed=4,
        scheme="central",
        params=["0.weight"],
        masks={"0.weight": mask},
    )
    # Forwards: (k=0, +), (k=0, −), (k=1, +), (k=1, −).
    for i, (k, s) in enumerate([(0, 1), (0, -1), (1, 1), (1, -1)]):
        seen = model[0].seen[i]
        assert torch.equal(seen[~mask], w0[~mask])  # masked out: untouched
        z = standard_normal(4, k, "0.weight", (4, 3))
        torch.testing.assert_close(seen[mask], w0[mask] + s * sigma * z[mask])
        assert torch.equal(model[2].seen[i], w2)  # not selected: untouched


class HalfUsed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.spare = nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_parameter_of_a_module_that_never_runs_is_an_error() -> None:
    model = HalfUsed()
    with pytest.raises(ConfigError, match=r"\['spare.bias', 'spare.weight'\] are not used"):
        loss_differences(
            model,
            F.cross_entropy,
            (torch.randn(4, 3), torch.tensor([0, 1, 0, 1])),
            k=1,
            sigma=1e-2,
            seed=0,
            scheme="forward",
        )


class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("draws", ["torch", "portable"])
def test_lean_never_allocates_more_than_a_forward_or_a_parameter(draws: str) -> None:
    model = nn.Sequential(
        nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)
    )
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    with LargestAllocation() as plain, torch.no_grad():
        F.cross_entropy(model(x), y)
    largest_param = max(p.numel() for p in model.parameters())
    k = 50
    n = sum(p.numel() for p in model.parameters())
    with LargestAllocation() as lean:
        loss_differences(
            model, F.cross_entropy, (x, y), k=k, sigma=1e-3, seed=0, scheme="central", draws=draws
        )
    assert lean.largest <= max(plain.largest, largest_param) < k * n // 10


def test_reused_directions_are_drawn_once_per_k_and_change_no_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedge.estimators import zeroth_order
    from fedge.estimators.lean import LeanEvaluator
    from fedge.estimators.perturbation import select

    torch.manual_seed(0)
    model, (x, y) = _convnet(), _batch()
    draws: list[tuple[int, str]] = []

    def counting(seed, ks, name, shape):  # the default Gaussian draw, counted
        draws.extend((int(k), name) for k in ks)
        return standard_normal(seed, ks[0], name, shape).unsqueeze(0)

    losses = {}
    for reuse in (False, True):
        draws.clear()
        sel = select(model)
        sel = type(sel)(sel.params, sel.masks, counting)
        with (
            torch.no_grad(),
            LeanEvaluator(model, sel, 7, x, F.cross_entropy, y, reuse_directions=reuse) as ev,
        ):
            losses[reuse] = ev.losses([0, 1, 2], (1.0, -1.0), 1e-3, baseline=False)
        n = len(sel.params)
        assert len(draws) == (
            3 * n if reuse else 6 * n
        )  # central: one draw per k and parameter when reused
        assert len(set(draws)) == 3 * n
    assert torch.equal(losses[False], losses[True])
    monkeypatch.setattr(
        zeroth_order, "_MAX_BATCHED_WORK", 0.0
    )  # too much work to batch: fast mode runs
    big = (torch.cat([x] * 3), torch.cat([y] * 3))  # the lean loop, reusing z
    lean = loss_differences(
        model, F.cross_entropy, big, k=3, sigma=1e-3, seed=7, scheme="central", mode="lean"
    )
    fast = loss_differences(
        model,
        F.cross_entropy,
        big,
        k=3,
        sigma=1e-3,
        seed=7,
        scheme="central",
        mode="fast",
        workers=1,
    )
    assert torch.equal(lean, fast)


@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_portable_small_parameters_drawn_together_once_per_k_change_no_number(
    monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    from fedge.estimators import directions, lean, zeroth_order, zeroth_order_gradient
    from fedge.estimators.perturbation import portable_normal_many

    model, (x, y) = _convnet(), _batch()
    calls: list[tuple[int, list[str]]] = []

    def counting(seed, k, items):  # the portable group draw, counted
        calls.append((int(k), [name for name, _ in items]))
        return portable_normal_many(seed, k, items)

    monkeypatch.setattr(directions, "portable_normal_many", counting)
    kw = dict(k=4, sigma=1e-3, seed=7, scheme=scheme, draws="portable")
    grouped = loss_differences(model, F.cross_entropy, (x, y), mode="lean", **kw)
    # Every parameter but the largest (Linear 5x36: the group holds at most its 180 elements).
    small = ["0.weight", "0.bias", "1.weight", "1.bias", "5.bias"]
    assert calls == [(k, small) for k in range(4)]  # both signs of k share one draw
    monkeypatch.setattr(zeroth_order, "_MAX_BATCHED_WORK", 0.0)  # fast mode: the lean loop
    epoch = zeroth_order_gradient(model, F.cross_entropy, (x, y), mode="fast", workers=1, **kw)
    monkeypatch.setattr(lean, "_GROUP_MAX", 0)  # every parameter drawn alone
    calls.clear()
    alone = loss_differences(model, F.cross_entropy, (x, y), mode="lean", **kw)
    assert calls == [] and torch.equal(grouped, alone)
    rebuilt = estimate_gradient(
        dict(model.named_parameters()),
        alone,
        seed=7,
        **{n: v for n, v in kw.items() if n != "seed"},
    )
    assert epoch.keys() == rebuilt.keys()
    assert all(torch.equal(epoch[n], rebuilt[n]) for n in epoch)
