"""Saliency scores for foresight pruning: NTK (forward-only on devices), SNIP, magnitude, random.

NTK saliency (seed 004, Sec. 4.2, Eq. 13-15; after NTK-SAP, Wang et al. 2023). The trace of the
NTK at initialisation, ``‖∇_W f(X; W0 ⊙ m)‖²_F`` (Eq. 4-5), is approximated without any gradient
by the output change under a random weight perturbation (Eq. 6, 13, 15)::

    F_i = ‖f(x_i; W0 ⊙ m) − f(x_i; (W0 + ΔW) ⊙ m)‖²₂              (Eq. 13)
    I   = 1/N Σ_i E_{ΔW ~ N(0, ε I)} [F_i]                         (Eq. 15)
    S(m_j) = |∂I / ∂m_j|                                           (Eq. 14)

Choices, and where the paper is silent:

- ``f`` is the network output, the logits (no softmax), as the NTK of Sec. 3 and NTK-SAP's code.
- ``ε`` is the *variance* of ΔW (Eq. 15: ``N(0, ε I)``), so ΔW = √ε · z. The paper gives no
  value; we default to ε = 1e-6 (ΔW of std 1e-3): small next to initial weights (std ~1e-2 to
  1e-1), so Eq. 6 stays a first-order (NTK) approximation, and large next to float32 rounding,
  so the output difference is not rounding noise.
- ``samples`` is the number of Monte Carlo draws of ΔW for the expectation in Eq. 15 (the paper:
  "approximated by the Monte Carlo sampling method", no number); default 1, as NTK-SAP draws one
  ΔW per batch. Only the prunable weights (conv/linear, :mod:`.masks`) are perturbed.
- Draw order (the contract that lets the server regenerate ΔW): for s in range(samples), for each
  prunable weight in ``named_parameters`` order, ``z = torch.randn(shape, generator=generator)``
  (float32, CPU), cast to the weight's dtype, times √ε. Every function that draws takes either a
  ``torch.Generator`` or a :class:`fedge.core.rng.PortableGenerator` (``generator``): the
  portable one draws each tensor (inputs, each ΔW, random scores) as its next call, in the same
  order, the same bits on every machine (:mod:`fedge.core.portable`); the ZO directions of
  NTK-Ori follow ``spec.draws`` (:class:`fedge.estimators.ZerothOrderSpec`).
- Eq. 14's first form, ``∂I/∂m_j``, with the mask shared by both forwards (as NTK-SAP's code,
  which differentiates the shared mask). Eq. 14's second form, ``∂I/∂W0_j · W0_j``, is the
  SNIP/SynFlow identity, exact only when I depends on ``W0 ⊙ m`` alone; here
  ``∂I/∂m_j = (∂I/∂θ_j) W0_j + (∂I/∂θ'_j)(W0_j + ΔW_j)`` with θ = W0 ⊙ m and
  θ' = (W0 + ΔW) ⊙ m, i.e. each forward's weight gradient times that forward's own weight.
  Treating ΔW as a constant not gated by m would drop the ``‖J_j‖²`` term that makes it the NTK
  trace's derivative (for a linear model it would score every weight 0).
- Models run in eval mode (restored afterwards): forwards are deterministic and per sample, and
  nothing is written (BatchNorm uses its running statistics; dropout is off). The model's
  weights are never modified: scores are taken at ``W0 ⊙ m`` through ``functional_call``.
- Scores are exactly 0 at pruned coordinates (NTK-SAP's ``grad * (m != 0)``).

Where it runs (Algorithm 1, lines 4-14):

- NTK-Rand, the paper's default (data-free): ``x ~ N(0, I)`` of the input shape
  (:func:`gaussian_inputs`), and the server computes everything with :func:`ntk_saliency`
  (autograd over Eq. 15 with the ΔW draws fixed): zero communication, devices idle.
- NTK-Ori (data on devices): Algorithm 1 has devices send ``F_i`` (one scalar), but a scalar
  cannot be differentiated by the server, and the paper's cost analysis (Sec. 5.2: worst case
  ``32 T_p n`` bits per device) implies an n-vector per pruning round. We keep devices
  forward-only and the uplink at K scalars (the paper's own BAFFLE trick, Eq. 16-17, with the
  statistic I in place of the loss): the server sends the mask and a seed; the device returns
  ``ΔI_k = I(m + δ_k) − I(m − δ_k)`` for K seeded perturbations ``δ_k ~ N(0, σ² I)`` of the
  *live* mask coordinates, with its ΔW draws held fixed across the 2K evaluations (common random
  numbers, :func:`ntk_statistic_differences`); the server regenerates δ_k and forms
  ``Ŝ = |Σ_k ΔI_k δ_k / (2 K σ²)|`` (:func:`ntk_saliency_from_differences`). Uplink: 4K bytes per
  device per pruning round (plus its sample count N_i for Eq. 15's weighting: combine devices with
  :func:`fedge.estimators.combine_loss_differences`, weights N_i). Downlink: the mask (bitmap,
  :func:`fedge.pruning.masks.encode_masks`) and the 4-byte seed. Device cost: 2K(1 + samples)
  forwards. The zeroth-order error adds to the Monte Carlo error of Eq. 15 (the paper's
  caveat in Sec. 4.2); it shrinks as K grows (Theorem 1: ``‖Σ̂ − I‖ ≤ √(n/K)``).
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
