"""Composable update transforms (optax-style ``init``/``update`` pairs) for server optimizers,
applied to the pseudo-gradient ``g = -Δ`` (Reddi et al., arXiv:2003.00295v5, Algorithm 2).
Design notes: docs/decisions.md#core.

Example:
    >>> params = {"w": torch.zeros(3)}
    >>> grads = {"w": torch.tensor([1.0, -2.0, 0.5])}
    >>> opt = chain(scale_by_adam(b1=0.9, b2=0.99), scale_by_learning_rate(0.01))
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> params = apply_updates(params, updates)
    >>> params["w"]                   # Adam's first step: lr against each gradient's sign
    tensor([-0.0100,  0.0100, -0.0100])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from fedge.core.errors import ConfigError

__all__ = [
    "Params",
    "Transform",
    "adagrad",
    "adam",
    "add_decayed_weights",
    "apply_updates",
    "chain",
    "clip_by_global_norm",
    "ema_init",
    "ema_update",
    "scale",
    "scale_by_adagrad",
    "scale_by_adam",
    "scale_by_ema_momentum",
    "scale_by_exponential_decay",
    "scale_by_learning_rate",
    "scale_by_yogi",
    "scale_by_zo_adamm",
    "sgd",
    "state_from_arrays",
    "state_to_arrays",
    "trace",
    "yogi",
    "zo_adamm",
    "zo_sgdm",
]

Params = dict[str, torch.Tensor]
State = Any


@dataclass(frozen=True)
class Transform:
    """An ``init(params) -> state`` / ``update(grads, state, params) -> (updates, state)`` pair."""

    init: Callable[[Params], State]
    update: Callable[[Params, State, Params], tuple[Params, State]]


def _zeros(params: Params) -> Params:
    return {k: torch.zeros_like(v) for k, v in params.items()}


def _carry(old: Params, new: Params) -> Params:
    """A per-parameter state after an update that touched only ``new``'s keys: the others keep
    their state (as torch's optimizers skip a parameter with no gradient), in ``old``'s order, so
    the state keeps its structure when only some parameters get gradients (BAFFLE's
    ``method.perturb``)."""
    return {k: new[k] if k in new else v for k, v in old.items()}


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


def _unit(name: str, value: float) -> None:
    if not 0 <= value < 1:
        raise ConfigError(f"{name} must be in [0, 1), got {value}")


def chain(*transforms: Transform) -> Transform:
    """Apply ``transforms`` in order; the state is the tuple of their states."""

    def init(params: Params) -> State:
        return tuple(t.init(params) for t in transforms)

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        new_state = []
        for t, s in zip(transforms, state, strict=True):
            grads, s = t.update(grads, s, params)
            new_state.append(s)
        return grads, tuple(new_state)

    return Transform(init, update)


def scale(factor: float) -> Transform:
    """``u = factor · g``."""

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        return {k: g * factor for k, g in grads.items()}, state

    return Transform(lambda params: (), update)


def scale_by_learning_rate(lr: float) -> Transform:
    """``u = -lr · g`` (descent)."""
    _positive("learning rate", lr)
    return scale(-lr)


def scale_by_exponential_decay(lr: float, decay: float) -> Transform:
    """``u = -lr · decay^t · g`` at the t-th update (t = 0, 1, ...): a learning rate multiplied by
    ``decay`` after every round (NTK-BAFFLE, seed 004: "decays to 99.8% after each round")."""
    _positive("learning rate", lr)
    if not 0 < decay <= 1:
        raise ConfigError(f"learning-rate decay must be in (0, 1], got {decay}")

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        factor = -lr * decay ** state["t"]
        return {k: g * factor for k, g in grads.items()}, {"t": state["t"] + 1}

    return Transform(lambda params: {"t": 0}, update)


def add_decayed_weights(weight_decay: float) -> Transform:
    """``u = g + wd · W`` (L2 weight decay, coupled as in ``torch.optim.SGD(weight_decay=...)``)."""
    if not weight_decay >= 0:
        raise ConfigError(f"weight decay must be >= 0, got {weight_decay}")

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        return {k: g + weight_decay * params[k].to(g.dtype) for k, g in grads.items()}, state

    return Transform(lambda params: (), update)


def trace(momentum: float, *, nesterov: bool = False) -> Transform:
    """Heavy-ball momentum ``m ← μ m + g``; ``u = m`` (or ``g + μ m`` with Nesterov)."""
    _unit("momentum", momentum)

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        m = {k: momentum * state[k] + g for k, g in grads.items()}
        out = {k: grads[k] + momentum * m[k] for k in grads} if nesterov else m
        return out, _carry(state, m)

    return Transform(_zeros, update)


def scale_by_adam(
    *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, bias_correction: bool = True
) -> Transform:
    """Adam's direction ``m̂ / (sqrt(v̂) + eps)`` (Kingma & Ba, arXiv:1412.6980v9).

    With ``bias_correction=False`` and ``eps = τ`` this is Reddi et al.'s FedAdam.
    """
    _unit("b1", b1)
    _unit("b2", b2)
    _positive("eps", eps)

    def init(params: Params) -> State:
        return {"m": _zeros(params), "v": _zeros(params), "t": 0}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        t = state["t"] + 1
        m = {k: b1 * state["m"][k] + (1 - b1) * g for k, g in grads.items()}
        v = {k: b2 * state["v"][k] + (1 - b2) * g * g for k, g in grads.items()}
        c1, c2 = (1 - b1**t, 1 - b2**t) if bias_correction else (1.0, 1.0)
        out = {k: (m[k] / c1) / ((v[k] / c2).sqrt() + eps) for k in grads}
        return out, {"m": _carry(state["m"], m), "v": _carry(state["v"], v), "t": t}

    return Transform(init, update)


def scale_by_yogi(
    *, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3, initial_accumulator: float = 1e-6
) -> Transform:
    """Yogi (Zaheer et al. 2018) as FedYogi in Reddi et al., Algorithm 2:

    ``v ← v − (1−β2) g² sign(v − g²)``,  ``u = m / (sqrt(v) + τ)``  with ``τ = eps``.
    """
    _unit("b1", b1)
    _unit("b2", b2)
    _positive("eps", eps)

    def init(params: Params) -> State:
        return {
            "m": _zeros(params),
            "v": {k: torch.full_like(p, initial_accumulator) for k, p in params.items()},
        }

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        m = {k: b1 * state["m"][k] + (1 - b1) * g for k, g in grads.items()}
        v = {}
        for k, g in grads.items():
            g2 = g * g
            v[k] = state["v"][k] - (1 - b2) * g2 * torch.sign(state["v"][k] - g2)
        return {k: m[k] / (v[k].sqrt() + eps) for k in grads}, {
            "m": _carry(state["m"], m),
            "v": _carry(state["v"], v),
        }

    return Transform(init, update)


def scale_by_adagrad(
    *, b1: float = 0.0, eps: float = 1e-3, initial_accumulator: float = 0.0
) -> Transform:
    """FedAdagrad (Reddi et al., Algorithm 2): ``v ← v + g²``, ``u = m / (sqrt(v) + τ)``."""
    _unit("b1", b1)
    _positive("eps", eps)

    def init(params: Params) -> State:
        return {
            "m": _zeros(params),
            "v": {k: torch.full_like(p, initial_accumulator) for k, p in params.items()},
        }

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        m = {k: b1 * state["m"][k] + (1 - b1) * g for k, g in grads.items()}
        v = {k: state["v"][k] + g * g for k, g in grads.items()}
        return {k: m[k] / (v[k].sqrt() + eps) for k in grads}, {
            "m": _carry(state["m"], m),
            "v": _carry(state["v"], v),
        }

    return Transform(init, update)


def clip_by_global_norm(max_norm: float) -> Transform:
    """Scale all gradients together so their joint L2 norm is at most ``max_norm``."""
    _positive("max_norm", max_norm)

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        norm = torch.sqrt(
            sum(
                ((g.double() ** 2).sum() for g in grads.values()),
                torch.zeros((), dtype=torch.float64),
            )
        )
        factor = min(1.0, max_norm / (float(norm) + 1e-12))
        return {k: g * factor for k, g in grads.items()}, state

    return Transform(lambda params: (), update)


def sgd(
    lr: float,
    *,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    lr_decay: float = 1.0,
) -> Transform:
    """SGD with optional (Nesterov) momentum, coupled weight decay and a learning rate multiplied
    by ``lr_decay`` after each update (torch.optim.SGD's order: decay, momentum, step).
    ``sgd(1.0)`` on ``-Δ`` is FedAvg."""
    parts = [add_decayed_weights(weight_decay)] if weight_decay else []
    parts += [trace(momentum, nesterov=nesterov)] if momentum else []
    step = (
        scale_by_learning_rate(lr) if lr_decay == 1.0 else scale_by_exponential_decay(lr, lr_decay)
    )
    return chain(*parts, step)


def adam(
    lr: float,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    bias_correction: bool = True,
    weight_decay: float = 0.0,
    lr_decay: float = 1.0,
) -> Transform:
    """Adam (torch.optim.Adam semantics with ``bias_correction=True``, L2 ``weight_decay`` added
    to the gradient as torch does), learning rate multiplied by ``lr_decay`` after each update."""
    parts = [add_decayed_weights(weight_decay)] if weight_decay else []
    step = (
        scale_by_learning_rate(lr) if lr_decay == 1.0 else scale_by_exponential_decay(lr, lr_decay)
    )
    return chain(
        *parts, scale_by_adam(b1=b1, b2=b2, eps=eps, bias_correction=bias_correction), step
    )


def yogi(lr: float, *, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3) -> Transform:
    """FedYogi server optimizer."""
    return chain(scale_by_yogi(b1=b1, b2=b2, eps=eps), scale_by_learning_rate(lr))


def adagrad(lr: float, *, b1: float = 0.0, eps: float = 1e-3) -> Transform:
    """FedAdagrad server optimizer."""
    return chain(scale_by_adagrad(b1=b1, eps=eps), scale_by_learning_rate(lr))


def scale_by_ema_momentum(beta: float, *, bias_correction: bool = True) -> Transform:
    """Momentum as a running average of zeroth-order estimates: ``m ← β m + (1−β) g``,
    ``u = m / (1 − β^t)`` (``u = m`` without bias correction), t = 1, 2, ...

    ZO-SGD with momentum as reviewed by Liu et al., "A Primer on Zeroth-Order Optimization in
    Signal Processing and Machine Learning" (arXiv:2006.06224, Section on ZO descent
    directions): averaging estimates of consecutive steps cuts the variance of independent
    estimator noise by about (1−β)/(1+β) (a 19x reduction at β = 0.9) while the gradient
    drifts slowly, which is the point for ZO estimates whose cosine with the gradient is only
    about sqrt(K/n). Unlike :func:`trace` (heavy ball, ``m ← μ m + g``), the average keeps
    the estimate's scale, so a learning rate tuned without momentum stays meaningful.
    """
    _unit("beta", beta)

    def init(params: Params) -> State:
        return {"m": _zeros(params), "t": 0}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        t = state["t"] + 1
        m = {k: beta * state["m"][k] + (1 - beta) * g for k, g in grads.items()}
        c = 1 - beta**t if bias_correction else 1.0
        return {k: v / c for k, v in m.items()}, {"m": _carry(state["m"], m), "t": t}

    return Transform(init, update)


def scale_by_zo_adamm(*, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-8) -> Transform:
    """ZO-AdaMM's direction (Chen et al., "ZO-AdaMM: Zeroth-Order Adaptive Momentum Method for
    Black-Box Optimization", NeurIPS 2019, arXiv:1910.06513, Algorithm 1 with constant β1 and
    no constraint set): the AMSGrad form of Adam on the zeroth-order estimate,

        m ← β1 m + (1−β1) g,   v ← β2 v + (1−β2) g²,   v̂ ← max(v̂, v),   u = m / (sqrt(v̂) + eps).

    No bias correction (as the paper). The running maximum v̂ keeps the per-coordinate step
    from growing when a noisy estimate's square happens to be small, which the paper shows
    matters for ZO convergence (its Mahalanobis-distance analysis).
    """
    _unit("b1", b1)
    _unit("b2", b2)
    _positive("eps", eps)

    def init(params: Params) -> State:
        return {"m": _zeros(params), "v": _zeros(params), "vhat": _zeros(params)}

    def update(grads: Params, state: State, params: Params) -> tuple[Params, State]:
        m = {k: b1 * state["m"][k] + (1 - b1) * g for k, g in grads.items()}
        v = {k: b2 * state["v"][k] + (1 - b2) * g * g for k, g in grads.items()}
        vhat = {k: torch.maximum(state["vhat"][k], v[k]) for k in grads}
        return {k: m[k] / (vhat[k].sqrt() + eps) for k in grads}, {
            "m": _carry(state["m"], m),
            "v": _carry(state["v"], v),
            "vhat": _carry(state["vhat"], vhat),
        }

    return Transform(init, update)


def zo_sgdm(lr: float, *, beta: float = 0.9, lr_decay: float = 1.0) -> Transform:
    """ZO-SGD with averaged momentum (:func:`scale_by_ema_momentum`) and learning rate ``lr``."""
    step = (
        scale_by_learning_rate(lr) if lr_decay == 1.0 else scale_by_exponential_decay(lr, lr_decay)
    )
    return chain(scale_by_ema_momentum(beta), step)


def zo_adamm(
    lr: float, *, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-8, lr_decay: float = 1.0
) -> Transform:
    """ZO-AdaMM server optimizer (:func:`scale_by_zo_adamm`, arXiv:1910.06513)."""
    step = (
        scale_by_learning_rate(lr) if lr_decay == 1.0 else scale_by_exponential_decay(lr, lr_decay)
    )
    return chain(scale_by_zo_adamm(b1=b1, b2=b2, eps=eps), step)


def apply_updates(params: Params, updates: Params) -> Params:
    """``params + updates`` for the keys in ``updates`` (others pass through unchanged)."""
    return {k: (p + updates[k].to(p.dtype) if k in updates else p) for k, p in params.items()}


def ema_init(params: Params) -> dict[str, Any]:
    """State of an exponential moving average of parameters (a copy of the start point)."""
    return {"avg": {k: v.detach().clone() for k, v in params.items()}, "n": 0}


def ema_update(
    state: dict[str, Any], params: Params, *, decay: float, warmup: bool = False
) -> dict[str, Any]:
    """``avg ← d·avg + (1−d)·params`` with ``d = decay``, or ``min(decay, (1+n)/(10+n))``
    with ``warmup``, n counting the previous updates (the BAFFLE reference code's torch_ema
    counts the current update too, so its decay is one update ahead: see
    ``docs/methods/baffle.md``, "EMA schedule")."""
    n = state["n"]
    d = min(decay, (1 + n) / (10 + n)) if warmup else decay
    avg = {k: d * a + (1 - d) * params[k].to(a.dtype) for k, a in state["avg"].items()}
    return {"avg": avg, "n": n + 1}


def state_to_arrays(state: State, *, prefix: str = "opt/") -> dict[str, torch.Tensor]:
    """An optimizer state as named tensors for a message: its leaves in ``tree_flatten`` order
    (numbers as 0-dim float64 tensors). :func:`state_from_arrays` inverts it given a template
    state of the same transform (``tx.init(params)``), which fixes the structure and the types."""
    leaves, _ = tree_flatten(state)
    return {
        f"{prefix}{i}": leaf.detach().clone()
        if isinstance(leaf, torch.Tensor)
        else torch.tensor(float(leaf), dtype=torch.float64)
        for i, leaf in enumerate(leaves)
    }


def state_from_arrays(
    arrays: dict[str, torch.Tensor], template: State, *, prefix: str = "opt/"
) -> State:
    """Rebuild an optimizer state from :func:`state_to_arrays`' tensors, shaped like ``template``."""
    leaves, spec = tree_flatten(template)
    out = []
    for i, leaf in enumerate(leaves):
        a = arrays.get(f"{prefix}{i}")
        if a is None:
            raise ConfigError(
                f"optimizer state leaf {prefix}{i} is missing; the state was made by another optimizer"
            )
        if isinstance(leaf, torch.Tensor):
            if a.shape != leaf.shape:
                raise ConfigError(
                    f"optimizer state leaf {prefix}{i} has shape {tuple(a.shape)}; expected {tuple(leaf.shape)}"
                )
            out.append(a.to(leaf.dtype))
        else:
            out.append(type(leaf)(a.item()))
    return tree_unflatten(out, spec)
