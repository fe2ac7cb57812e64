"""Saliency scores for foresight pruning: NTK (seed 004, Eq. 13-15; forward-only on devices), SNIP,
magnitude and random. Every draw (inputs, ΔW, random scores) comes from the ``generator``
given, in a fixed order: a ``torch.Generator`` or a :class:`fedge.core.rng.PortableGenerator`
(the same bits on every machine). Design notes: docs/decisions.md#pruning.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedge.core.config import check_positive_int
from fedge.core.errors import ConfigError
from fedge.core.rng import AnyGenerator, rand, randn
from fedge.estimators import ZerothOrderSpec, estimate_gradient, loss_differences
from fedge.pruning.masks import check_masks

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_SAMPLES",
    "NTKStatistic",
    "gaussian_inputs",
    "magnitude_saliency",
    "ntk_forward_statistic",
    "ntk_saliency",
    "ntk_saliency_from_differences",
    "ntk_saliency_zeroth_order",
    "ntk_statistic_differences",
    "random_saliency",
    "snip_saliency",
]

DEFAULT_EPS = 1e-6  # ε, the variance of ΔW (Eq. 15); std 1e-3. Seed 004 gives no value.
DEFAULT_SAMPLES = 1  # Monte Carlo draws of ΔW per evaluation of I (NTK-SAP: one per batch)

Weights = dict[str, Tensor]


class NTKStatistic(NamedTuple):
    """What a device computes with forwards only (Algorithm 1, lines 6-7).

    Attributes:
        value: I over the device's inputs (Eq. 15, mean over its N_i inputs).
        num_inputs: N_i, the weight of this device in the server's mean over all N inputs.
    """

    value: float
    num_inputs: int


def gaussian_inputs(input_shape: tuple[int, ...], n: int, *, generator: AnyGenerator) -> Tensor:
    """NTK-Rand inputs (Algorithm 1, line 10): ``n`` draws of ``x ~ N(0, I)``, shape (n, *input_shape)."""
    check_positive_int("n", n)
    return randn((n, *input_shape), generator)


@torch.no_grad()
def ntk_forward_statistic(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None,
    inputs: Tensor,
    *,
    eps: float = DEFAULT_EPS,
    samples: int = DEFAULT_SAMPLES,
    generator: AnyGenerator,
) -> NTKStatistic:
    """Device side of NTK pruning: I of Eq. 15 on ``inputs``, forward passes only (1 + samples).

    Nothing is saved for backward and the model is left as it was. ΔW is drawn from
    ``generator`` in the order of the module docstring, so a server holding the same generator
    state (a shared seed) sees the same draws.

    Args:
        model: the network at initialisation, W0.
        masks: prunable name -> bool mask (True = kept); None or absent names = dense.
        inputs: (N, ...) batch: device data (NTK-Ori) or :func:`gaussian_inputs` (NTK-Rand).
        eps: ε, the variance of ΔW.
        samples: Monte Carlo draws of ΔW.
        generator: source of the ΔW draws.
    """
    full, w0, noise = _setup(model, masks, inputs, eps, samples, generator)
    u = {n: m.to(w0[n].dtype) for n, m in full.items()}
    with _eval_mode(model):
        value = _statistic(model, inputs, u, w0, noise)
    return NTKStatistic(float(value), int(inputs.shape[0]))


def ntk_saliency(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None,
    inputs: Tensor,
    *,
    eps: float = DEFAULT_EPS,
    samples: int = DEFAULT_SAMPLES,
    generator: AnyGenerator,
) -> dict[str, Tensor]:
    """Server side of NTK pruning: ``S(m_j) = |∂I/∂m_j|`` (Eq. 14) by autograd, ΔW held fixed.

    Same arguments and draws as :func:`ntk_forward_statistic` (same generator state, same I).
    Costs one backward through 1 + samples forwards: the server's job, never a device's.

    Returns:
        prunable name -> score (the weight's dtype), 0 at pruned coordinates.
    """
    full, w0, noise = _setup(model, masks, inputs, eps, samples, generator)
    u = {n: m.to(w0[n].dtype).requires_grad_() for n, m in full.items()}
    with _eval_mode(model), torch.enable_grad():
        value = _statistic(model, inputs, u, w0, noise)
        grads = _mask_gradients(value, u)
    return _scores(full, grads)


def ntk_statistic_differences(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None,
    inputs: Tensor,
    spec: ZerothOrderSpec,
    *,
    eps: float = DEFAULT_EPS,
    samples: int = DEFAULT_SAMPLES,
    generator: AnyGenerator,
    seed: int,
) -> Tensor:
    """Device side of data-based NTK pruning: K differences of I under seeded mask perturbations.

    ``ΔI_k = I(m + δ_k) − I(m − δ_k)`` (``central``) or ``I(m + δ_k) − I(m)`` (``forward``), with
    ``δ_k ~ N(0, σ² I)`` on the live coordinates of the mask, drawn by
    :mod:`fedge.estimators.perturbation` from ``seed`` under the prunable weights' names, and the
    ΔW draws (from ``generator``) the same in every evaluation. Forwards only, through
    :func:`fedge.estimators.loss_differences` in lean mode (whatever ``spec.mode``) with I as
    the loss.

    Args:
        model, masks, inputs, eps, samples, generator: as :func:`ntk_forward_statistic`.
        spec: the estimate: ``spec.k`` = K, the number of scalars sent up; ``spec.sigma`` = σ
            of the mask perturbation (the mask is 0/1, so 1e-2 is a 1% change); the scheme,
            as in :mod:`fedge.estimators.zeroth_order`. NTK-BAFFLE's is
            ``NtkBaffleConfig.prune_spec()`` (central).
        seed: the perturbation seed the server sent.

    Returns:
        float32 ``(K,)``.
    """
    full, w0, noise = _setup(model, masks, inputs, eps, samples, generator)
    wrapper = _MaskedStatistic(model, full, w0, noise)
    with _eval_mode(model):
        return loss_differences(
            wrapper,
            _statistic_as_loss,
            (inputs, inputs),
            dataclasses.replace(spec, mode="lean"),
            seed=seed,
            params=list(full),
            masks=full,
        )


def ntk_saliency_from_differences(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None,
    diffs: Tensor,
    spec: ZerothOrderSpec,
    *,
    seed: int,
) -> dict[str, Tensor]:
    """Server side of data-based NTK pruning: ``Ŝ = |∂̂I/∂m|`` from K differences (Stein, Eq. 9).

    ``diffs`` is one device's :func:`ntk_statistic_differences`, or several devices' combined by
    :func:`fedge.estimators.combine_loss_differences` with weights N_i (Eq. 15's 1/N Σ_i), and
    ``spec`` the devices'.
    """
    full = check_masks(model, masks)
    grad = estimate_gradient(
        {n: m.shape for n, m in full.items()}, diffs, spec, seed=seed, masks=full
    )
    return _scores(full, grad)


def ntk_saliency_zeroth_order(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None,
    inputs: Tensor,
    spec: ZerothOrderSpec,
    *,
    eps: float = DEFAULT_EPS,
    samples: int = DEFAULT_SAMPLES,
    generator: AnyGenerator,
    seed: int,
) -> dict[str, Tensor]:
    """Both halves of the data-based protocol on one machine (device differences, server score)."""
    diffs = ntk_statistic_differences(
        model, masks, inputs, spec, eps=eps, samples=samples, generator=generator, seed=seed
    )
    return ntk_saliency_from_differences(model, masks, diffs, spec, seed=seed)


def snip_saliency(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None,
    batch: tuple[Tensor, Tensor],
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
) -> dict[str, Tensor]:
    """SNIP (Lee et al. 2019): ``|∂L/∂m_j| = |∂L/∂W_j · W_j|`` at ``W0 ⊙ m`` on a labelled batch.

    Data-based and uses backprop (one backward): a baseline for a server that holds labelled
    data, never a device computation. Eval mode, scores 0 at pruned coordinates.
    """
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise ConfigError(f"SNIP needs a labelled batch (x, y), got {type(batch).__name__}")
    x, y = batch
    full = check_masks(model, masks)
    params = dict(model.named_parameters())
    u = {n: m.to(params[n].dtype).requires_grad_() for n, m in full.items()}
    with _eval_mode(model), torch.enable_grad():
        weights = {n: params[n].detach() * u[n] for n in full}
        loss = loss_fn(functional_call(model, weights, (x,)), y)
        grads = _mask_gradients(loss, u)
    return _scores(full, grads)


@torch.no_grad()
def magnitude_saliency(model: nn.Module, masks: Mapping[str, Tensor] | None) -> dict[str, Tensor]:
    """``|W0|`` at kept coordinates, 0 at pruned ones (global magnitude pruning)."""
    full = check_masks(model, masks)
    params = dict(model.named_parameters())
    return _scores(full, {n: params[n].detach() for n in full})


def random_saliency(
    model: nn.Module, masks: Mapping[str, Tensor] | None, *, generator: AnyGenerator
) -> dict[str, Tensor]:
    """Uniform ``[0, 1)`` scores from ``generator`` (prunable order): keeping the top ones keeps a
    uniformly random subset of the live coordinates, of exactly the requested size."""
    full = check_masks(model, masks)
    draws = {n: rand(m.shape, generator).to(m.device) for n, m in full.items()}
    return _scores(full, draws)


# --- internals -----------------------------------------------------------------------------


class _Gate(nn.Module):
    """Holds one mask variable u under the weight's attribute name; returns it when called."""

    def forward(self, attr: str) -> Tensor:
        return getattr(self, attr)


class _MaskedStatistic(nn.Module):
    """I(u) as a module whose only parameters are the mask variables u, named exactly like the
    prunable weights, so :func:`fedge.estimators.loss_differences` can perturb them.

    Each u is read through its owning module's forward (the lean estimator swaps the perturbed
    value in with a pre-hook on the owner). The network, W0 and ΔW are held outside the
    parameter tree, so they are neither selected nor perturbed.
    """

    def __init__(
        self, model: nn.Module, masks: dict[str, Tensor], w0: Weights, noise: list[Weights]
    ):
        super().__init__()
        self._fixed = (model, w0, noise)
        for name, mask in masks.items():
            owner_path, _, attr = name.rpartition(".")
            owner: nn.Module = self
            for part in owner_path.split(".") if owner_path else []:
                if part not in owner._modules:
                    owner.add_module(part, _Gate())
                owner = owner._modules[part]  # type: ignore[assignment]
            owner.register_parameter(
                attr, nn.Parameter(mask.to(w0[name].dtype), requires_grad=False)
            )
        self._names = list(masks)

    def forward(self, inputs: Tensor) -> Tensor:
        u: Weights = {}
        for name in self._names:
            owner_path, _, attr = name.rpartition(".")
            u[name] = self.get_submodule(owner_path)(attr) if owner_path else getattr(self, attr)
        model, w0, noise = self._fixed
        return _statistic(model, inputs, u, w0, noise)


def _statistic_as_loss(value: Tensor, _unused: Tensor) -> Tensor:
    return value


def _statistic(
    model: nn.Module, inputs: Tensor, u: Weights, w0: Weights, noise: list[Weights]
) -> Tensor:
    """Eq. 13 and 15: mean over inputs and ΔW draws of ‖f(x; W0 ⊙ u) − f(x; (W0 + ΔW) ⊙ u)‖²."""
    clean = functional_call(model, {n: w0[n] * u[n] for n in u}, (inputs,))  # (N, classes)
    total = clean.new_zeros(())
    for dw in noise:
        pert = functional_call(model, {n: (w0[n] + dw[n]) * u[n] for n in u}, (inputs,))
        total = total + (clean - pert).pow(2).flatten(1).sum(1).mean()
    return total / len(noise)


def _setup(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None,
    inputs: Tensor,
    eps: float,
    samples: int,
    generator: AnyGenerator,
) -> tuple[dict[str, Tensor], Weights, list[Weights]]:
    if not isinstance(inputs, Tensor) or inputs.dim() < 1 or inputs.shape[0] == 0:
        got = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise ConfigError(f"inputs must be a non-empty batch (N, ...), got {got}")
    if (
        isinstance(eps, bool)
        or not isinstance(eps, (int, float))
        or not math.isfinite(eps)
        or eps <= 0
    ):
        raise ConfigError(
            f"eps (the variance of ΔW, Eq. 15) must be a finite number > 0, got {eps!r}"
        )
    check_positive_int("samples", samples)
    full = check_masks(model, masks)
    params = dict(model.named_parameters())
    w0 = {n: params[n].detach() for n in full}
    std = math.sqrt(eps)
    noise = [
        {n: randn(w.shape, generator).to(w.device, w.dtype) * std for n, w in w0.items()}
        for _ in range(samples)
    ]
    return full, w0, noise


def _mask_gradients(value: Tensor, u: Weights) -> Weights:
    """``∂value/∂u`` for each mask variable u, by autograd; 0 where value does not depend on u."""
    grads = torch.autograd.grad(value, list(u.values()), allow_unused=True)
    return {n: torch.zeros_like(u[n]) if g is None else g for n, g in zip(u, grads)}


def _scores(masks: dict[str, Tensor], values: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """|values| at kept coordinates, exactly 0 at pruned ones (a weight the output ignores scores 0)."""
    out = {}
    for n, m in masks.items():
        v = values[n].detach().abs()
        out[n] = torch.where(m.to(v.device), v, torch.zeros((), dtype=v.dtype, device=v.device))
    return out


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
