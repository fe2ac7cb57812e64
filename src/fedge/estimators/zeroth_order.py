"""Zeroth-order gradient estimate from forward passes only: BAFFLE's Stein estimator (Eq. 4-7),
ĝ = 1/(c·K·σ²) Σ_k ΔL_k δ_k with central (c = 2) or forward (c = 1) differences, in ``lean``
or ``fast`` mode. Design notes: docs/decisions.md#estimators.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from fedge.core.config import check_positive_int
from fedge.core.errors import ConfigError, MessageError, NonFiniteError
from fedge.core.rng import Draws
from fedge.core.threads import torch_threads
from fedge.estimators import batched
from fedge.estimators.directions import DirectionKind, Directions, make_directions, remembered
from fedge.estimators.lean import LeanEvaluator, LossFn
from fedge.estimators.perturbation import Selection, check_masks, select
from fedge.estimators.spec import Mode, Scheme, ZerothOrderSpec, check_scheme, resolve_spec

__all__ = [
    "Mode",
    "PrecisionWarning",
    "Scheme",
    "ZerothOrderSpec",
    "ZerothOrderWarning",
    "combine_loss_differences",
    "estimate_gradient",
    "forward_budget",
    "loss_differences",
    "num_differences",
    "directional_derivatives",
    "flat_layers",
    "split_prefix",
    "zeroth_order_gradient",
]

_LOW_PRECISION = (torch.bfloat16, torch.float16)
# Above this much work per forward (FLOPs of one forward of the batch, torch's flop counter) one
# plain forward already runs near the kernels' speed, and the batched pass only adds layout and
# stacking work: fast mode runs the lean loop, split over threads. Below it, a forward is
# overhead-bound and batching the perturbed models pays. Work, not batch size, decides, because
# models differ 20x in FLOPs per sample. Measured on one thread (K = 100, forward scheme; lean /
# batched time): BAFFLE's LeNet (10.7 MFLOP a sample) 2.6x at batch 2 (21 MFLOP), 1.5x at 8
# (85 MFLOP), 0.96x at 16 (171 MFLOP); LeNet-5 (0.56 MFLOP a sample) 1.7x at batch 64 (36 MFLOP),
# 1.9x at 128 (72 MFLOP), 1.4x at 256 (144 MFLOP). 90 MFLOP keeps BAFFLE's LeNet exactly where a
# batch-size rule of 8 put it (batched up to 8, lean from 9) and batches LeNet-5 up to 159.
_MAX_BATCHED_WORK = 90e6
_FLOPS_PER_SAMPLE: dict[
    tuple, float
] = {}  # (model structure, input shape, dtype) -> FLOPs of one sample's forward
# Perturbed models per batched pass by default: about 512 model-samples, within [8, 32]. Tuned on
# a LeNet (B = 8..64) on a 2-core CPU: it keeps the widest stacked activation to a few MB, where
# larger passes got up to 1.6x slower per model.
_MODEL_SAMPLES_PER_PASS, _MIN_MODELS, _MAX_MODELS = 512, 8, 32
# zeroth_order_gradient in fast mode keeps the client's draws for its own rebuild of ĝ up to this
# many bytes (see directions.remembered): K = 100 directions of LeNet-5 (62k parameters) take
# 25 MB, of BAFFLE's LeNet 11 MB; a larger selection keeps its first directions only.
_REMEMBER_BYTES = 64 << 20


class ZerothOrderWarning(UserWarning):
    """A legal but unsafe zeroth-order setting (results may be noise or irreproducible)."""


class PrecisionWarning(ZerothOrderWarning):
    """σ is too small for the forward precision: W ± δ rounds back to W."""


def forward_budget(k: int, scheme: Scheme) -> int:
    """Forward passes to produce ``k`` loss differences: ``2k`` (central) or ``k + 1`` (forward)."""
    check_scheme(scheme)
    check_positive_int("k", k)
    return 2 * k if scheme == "central" else k + 1


def num_differences(budget: int, scheme: Scheme) -> int:
    """The largest ``k`` whose :func:`forward_budget` fits in ``budget`` forwards.

    Example (BAFFLE's equal-cost comparison of Figure 3):
        >>> num_differences(forward_budget(100, "central"), "forward")
        199
    """
    check_scheme(scheme)
    k = budget // 2 if scheme == "central" else budget - 1
    if k < 1:
        raise ConfigError(
            f"a budget of {budget} forwards buys no {scheme} loss difference; "
            f"it needs at least {forward_budget(1, scheme)}"
        )
    return k


def loss_differences(
    model: nn.Module,
    loss_fn: LossFn,
    batch: tuple[Tensor, Tensor],
    spec: ZerothOrderSpec | None = None,
    *,
    seed: int,
    params: Sequence[str] | None = None,
    masks: Mapping[str, Tensor] | None = None,
    **settings: Any,
) -> Tensor:
    """Client side of BAFFLE (Algorithm 1, lines 11-12): K loss differences, forwards only.

    Args:
        model: the network, in the mode (train/eval) the loss should be computed in. Its
            parameters and buffers are left exactly as they were.
        loss_fn: ``loss_fn(logits, y) -> scalar`` mean loss, e.g. ``F.cross_entropy``.
        batch: ``(x, y)``.
        spec: K, σ, scheme, directions, mode, chunk, dtype and workers
            (:class:`~fedge.estimators.spec.ZerothOrderSpec`); the server must use the same
            K, σ, scheme and directions. ``chunk`` and ``workers`` apply to fast mode only
            (lean never copies the model); a ``dtype`` of ``torch.bfloat16`` or
            ``torch.float16`` runs the forwards under autocast (perturbed weights are formed in
            the parameters' dtype, then cast per layer, as a low-precision device would).
        seed: perturbation seed (the 4 bytes the server sends, Algorithm 1 line 7).
        params: names of the perturbed parameters; None = every ``requires_grad`` parameter.
        masks: optional name -> bool mask; only True coordinates are perturbed.
        **settings: instead of ``spec``, its fields as keywords (``k=..., sigma=...,
            scheme=...``): the spec they describe is used.

    Returns:
        float32 tensor ``(k,)``: ``ΔL_k`` for ``k = 0..K-1``, each the difference of two losses
        taken in float64, so no extra rounding is added to the forward's own.

    Warns:
        PrecisionWarning: σ < eps(dtype) · max|W| for a selected parameter.
        ZerothOrderWarning: dropout is active (forwards see different masks), or every ΔL is 0.
    """
    spec = resolve_spec(spec, settings)
    _check_seed(seed)
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise ConfigError(f"batch must be a pair (x, y), got {type(batch).__name__}")
    k, sigma, mode = spec.k, spec.sigma, spec.mode
    sel = _with_directions(
        select(model, params, masks), spec.directions, k, spec.draws, spec.device
    )
    autocast = _autocast_dtype(sel, spec.dtype)
    _warn_if_unsafe(model, sel, None if mode == "jvp" else sigma, spec.dtype)
    x, y = batch

    blocks = (1.0, -1.0) if spec.scheme == "central" else (1.0,)  # signs s of W + s·δ_k
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        with torch.no_grad(), _maybe_autocast(x, autocast):
            result: tuple[Tensor, Tensor] | None = None
            if mode == "fast" and batched_pays(model, x):
                fast = batched.BatchedEvaluator.build(model, sel, seed, x, loss_fn, y)
                try:
                    if fast is not None:
                        step = spec.chunk or _default_chunk(x, len(blocks))
                        result = _run(fast, k, step, blocks, sigma)
                except batched.Unsupported:  # found only at run time (e.g. a rank-3 input)
                    result = None
            net, h = model, x
            split = split_prefix(model, sel) if result is None and spec.prefix_once else None
            if split is not None:  # the unperturbed prefix once, the K forwards through the rest
                prefix, net = split
                for m in prefix:
                    h = m(h)
            if mode == "jvp":  # exact: ΔL_k = c·σ·∇L·(z_k ⊙ m), c·σ·L'(W; z_k) in float64
                d = directional_derivatives(net, sel, seed, (h, y), loss_fn, k)
                result = (d * (spec.normalizer * sigma), torch.zeros(k, dtype=torch.float64))
            spans = min(k, spec.workers or torch.get_num_threads()) if mode == "fast" else 1
            if result is None and spans > 1:
                result = _run_threaded(
                    net, sel, seed, (h, y), loss_fn, blocks, spans, autocast, k=k, sigma=sigma
                )
            if result is None:  # lean, or a model the batched path cannot run
                lean = LeanEvaluator(net, sel, seed, h, loss_fn, y, reuse_directions=mode == "fast")
                result = _run(lean, k, k, blocks, sigma)
    finally:
        for b, saved in buffers:  # e.g. BatchNorm running stats updated by train-mode forwards
            b.copy_(saved)
    plus, minus = result
    diffs = (plus - minus).to(torch.float32)
    if not bool(diffs.ne(0).any()):
        warnings.warn(
            "every loss difference is exactly 0: the perturbations did not change the loss; "
            "raise sigma, use a wider dtype, or check that the model reads its parameters "
            "inside its modules' forward",
            ZerothOrderWarning,
            stacklevel=2,
        )
    return diffs


def estimate_gradient(
    shapes_or_params: Mapping[str, Tensor | torch.Size | Sequence[int]],
    loss_diffs: Tensor,
    spec: ZerothOrderSpec | None = None,
    *,
    seed: int,
    masks: Mapping[str, Tensor] | None = None,
    **settings: Any,
) -> dict[str, Tensor]:
    """Server side of BAFFLE (Algorithm 1, line 16; Eq. 6): rebuild ĝ from K loss differences.

        ĝ = 1 / (c · K · σ²) · Σ_k ΔL_k · δ_k = 1 / (c · K · σ) · Σ_k ΔL_k · z_k ⊙ m,

    with c = 2 for ``central`` (ΔL ≈ 2δᵀ∇L, Eq. 2 and Eq. 6) and c = 1 for ``forward``
    (ΔL ≈ δᵀ∇L, Eq. 1), K = ``len(loss_diffs)``. For other ``directions`` the 1/K becomes
    the directions' weights w_k (:mod:`fedge.estimators.directions`).

    Args:
        shapes_or_params: name -> parameter tensor or shape; the keys are the selection and
            must be the names the client perturbed. Tensors give the output's dtype and device;
            shapes give float32 on the CPU.
        loss_diffs: ``(K,)`` from :func:`loss_differences` or :func:`combine_loss_differences`.
        spec, seed, masks: as given to :func:`loss_differences` (``mode``, ``chunk``,
            ``dtype`` and ``workers`` play no part here).
        **settings: instead of ``spec``, its fields as keywords (``k`` defaults to
            ``len(loss_diffs)``).

    Returns:
        name -> estimated gradient, exactly zero at masked-out coordinates.
    """
    diffs = _check_diffs(loss_diffs)
    k = diffs.numel()
    spec = resolve_spec(spec, {"k": k, **settings} if spec is None else settings)
    _check_seed(seed)
    if spec.k != k:
        raise MessageError(
            f"got {k} loss differences for a spec with k={spec.k}; every client of a step must "
            "send K = spec.k of them"
        )
    sigma = spec.sigma
    shapes = {n: _shape_of(v) for n, v in shapes_or_params.items()}
    if not shapes:
        raise ConfigError("shapes_or_params is empty; pass the parameters the client perturbed")
    mask_of = check_masks(shapes, masks)
    dirs = _directions(spec.directions, shapes, k, mask_of, spec.draws, spec.device)
    if dirs.kind in ("block", "guided"):  # w_k = 1 / K_b, or guided's (directions.py)
        coef = (diffs * dirs.weights / (spec.normalizer * sigma)).to(torch.float32)  # (K,)
    else:  # w_k = 1 / K, as BAFFLE Eq. (6) writes it
        coef = (diffs / (spec.normalizer * k * sigma)).to(torch.float32)
    device = spec.device or torch.device("cpu")
    coef = coef.to(device)
    out: dict[str, Tensor] = {}
    for name, shape in shapes.items():
        acc = torch.zeros(math.prod(shape), device=device)
        for start in range(0, k, 64):  # (P, numel) noise at a time: O(64 · largest parameter)
            ks = range(start, min(k, start + 64))
            z = dirs.draw(seed, ks, name, shape).view(len(ks), -1)
            acc.addmv_(z.t(), coef[start : start + len(ks)])
        g = acc.view(shape)
        if name in mask_of:
            g = torch.where(mask_of[name].to(g.device), g, torch.zeros((), dtype=g.dtype))
        ref = shapes_or_params[name]
        out[name] = g.to(ref.device, ref.dtype) if isinstance(ref, Tensor) else g
    return out


def combine_loss_differences(loss_diffs: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """BAFFLE Eq. (7): Σ_c w_c ΔL_c with weights normalized to sum 1 (pass N_c or N_c / N).

    With perturbations shared through one seed, ``estimate_gradient(combined)`` equals
    ``Σ_c w_c · estimate_gradient(ΔL_c)`` (the estimate is linear in ΔL) at the cost of one
    regeneration instead of C. Summed in float64, returned as float32 ``(K,)``.
    """
    if len(loss_diffs) != len(weights) or not loss_diffs:
        raise ConfigError(
            f"need one weight per client: got {len(loss_diffs)} loss-difference vectors and {len(weights)} weights"
        )
    w = torch.tensor([float(v) for v in weights], dtype=torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ConfigError(
            f"weights must be finite, non-negative and not all zero, got {w.tolist()}; "
            "pass each client's sample count N_c"
        )
    diffs = [_check_diffs(d) for d in loss_diffs]
    k = diffs[0].numel()
    if any(d.numel() != k for d in diffs):
        raise MessageError(
            f"clients sent different numbers of loss differences: {[d.numel() for d in diffs]}; "
            "every client of a round must use the same k"
        )
    total = sum(wc * d.to(torch.float64) for wc, d in zip((w / w.sum()).tolist(), diffs))
    return torch.as_tensor(total).to(torch.float32)


def zeroth_order_gradient(
    model: nn.Module,
    loss_fn: LossFn,
    batch: tuple[Tensor, Tensor],
    spec: ZerothOrderSpec | None = None,
    *,
    seed: int,
    params: Sequence[str] | None = None,
    masks: Mapping[str, Tensor] | None = None,
    **settings: Any,
) -> dict[str, Tensor]:
    """Both halves on one device (BAFFLE's epoch-level mode, Section 3.2): ĝ for ``model``.

    Same arguments as :func:`loss_differences`; returns name -> estimate in each parameter's
    dtype and device, for exactly the selected parameters: bit for bit
    ``estimate_gradient(loss_differences(...))``. In ``fast`` mode the rebuild reuses the
    directions the forwards drew instead of drawing them again (up to ``_REMEMBER_BYTES`` of
    them; :func:`~fedge.estimators.directions.remembered`); ``lean`` keeps its one-parameter
    memory and draws twice.
    """
    sel = select(model, params, masks)
    spec = resolve_spec(spec, settings)
    dirs = _directions(
        spec.directions,
        {n: p.shape for n, p in sel.params.items()},
        spec.k,
        sel.masks,
        spec.draws,
        spec.device,
    )
    if spec.mode in ("fast", "jvp"):
        dirs = remembered(dirs, _REMEMBER_BYTES)
    step = dataclasses.replace(spec, directions=dirs)  # both halves draw the same directions
    diffs = loss_differences(model, loss_fn, batch, step, seed=seed, params=params, masks=masks)
    return estimate_gradient(dict(sel.params), diffs, step, seed=seed, masks=sel.masks)


def _run(
    evaluator: LeanEvaluator | batched.BatchedEvaluator,
    k: int,
    step: int,
    blocks: tuple[float, ...],
    sigma: float,
) -> tuple[Tensor, Tensor]:
    """float64 (L(W + δ_k), L(W − δ_k) or L(W)) for k = 0..K-1, ``step`` perturbations a pass."""
    plus = torch.empty(k, dtype=torch.float64)
    minus = torch.empty(k, dtype=torch.float64)
    with evaluator:
        for start in range(0, k, step):
            ks = list(range(start, min(k, start + step)))
            baseline = len(blocks) == 1 and start == 0  # forward scheme: L(W) once
            losses = evaluator.losses(ks, blocks, sigma, baseline)  # (len(blocks)·P [+ 1],)
            n = len(ks)
            plus[start : start + n] = losses[:n]
            if len(blocks) == 2:
                minus[start : start + n] = losses[n:]
            elif baseline:
                minus[:] = losses[n]
    return plus, minus


def _run_threaded(
    model: nn.Module,
    sel: Selection,
    seed: int,
    batch: tuple[Tensor, Tensor],
    loss_fn: LossFn,
    blocks: tuple[float, ...],
    spans: int,
    autocast: torch.dtype | None,
    *,
    k: int,
    sigma: float,
) -> tuple[Tensor, Tensor]:
    """:func:`_run` of the lean loop with k = 0..K-1 split into ``spans`` contiguous spans, one
    thread each, every thread on a shallow copy of ``model`` (Parameters shared, never written;
    module objects and buffers copied, because the lean hooks swap entries of a module's
    ``_parameters`` and a train-mode forward may update buffers). Every copy perturbs the
    selection ``sel`` (its Parameters are the copies' own: they are shared), so ``model`` may be
    a suffix of the network whose parameter names differ. Intra-op threads are set to 1 for the
    duration (torch ops release the GIL, so the spans run in parallel)."""
    x, y = batch

    bounds = [round(i * k / spans) for i in range(spans + 1)]
    memo: dict[int, object] = {id(p): p for p in model.parameters()}
    replicas = [model] + [copy.deepcopy(model, memo=dict(memo)) for _ in range(spans - 1)]
    plus = torch.empty(k, dtype=torch.float64)
    minus = torch.empty(k, dtype=torch.float64)
    # Dispatch modes (FLOP counter, tensor accountant) are thread-local too: the workers
    # re-enter the caller's, outermost first, so what they run is metered as on one thread.
    modes = _get_current_dispatch_mode_stack()

    def span(i: int) -> None:
        lo, hi = bounds[i], bounds[i + 1]
        ev = LeanEvaluator(replicas[i], sel, seed, x, loss_fn, y, reuse_directions=True)
        # Grad mode and autocast are thread-local: enter them in the worker.
        with contextlib.ExitStack() as stack:
            for mode in modes:
                stack.enter_context(mode)
            stack.enter_context(torch.no_grad())
            stack.enter_context(_maybe_autocast(x, autocast))
            stack.enter_context(ev)
            losses = ev.losses(
                list(range(lo, hi)), blocks, sigma, baseline=len(blocks) == 1 and i == 0
            )
        n = hi - lo
        plus[lo:hi] = losses[:n]
        if len(blocks) == 2:
            minus[lo:hi] = losses[n : 2 * n]
        elif i == 0:
            minus[:] = losses[n]

    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            span(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(e)

    with torch_threads(1):
        workers = [
            threading.Thread(target=guarded, args=(i,), name=f"fedge-zo-{i}") for i in range(spans)
        ]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    if errors:
        raise errors[0]
    return plus, minus


def split_prefix(model: nn.Module, sel: Selection) -> tuple[list[nn.Module], nn.Sequential] | None:
    """The leading layers of ``model`` that hold no perturbed coordinate, and the rest.

    ``model`` must be an ``nn.Sequential`` running ``Sequential.forward`` (nested ones that do
    too are flattened to their layers; any other module is one layer). The prefix is the
    longest run of leading layers that own no parameter of the selection ``sel`` and draw no
    randomness (no active dropout): its output is the same for every perturbed model, so it can
    be computed once and fed to the returned suffix, an ``nn.Sequential`` of the very same
    layer objects (their Parameters, hence the selection's names, unchanged). None when the
    model is not a plain ``Sequential`` or its first layer is already perturbed."""
    if not isinstance(model, nn.Sequential) or type(model).forward is not nn.Sequential.forward:
        return None
    layers = _layers(model)
    owned = {id(p) for p in sel.params.values()}
    first = 0
    for m in layers:
        random = any(
            isinstance(s, nn.modules.dropout._DropoutNd) and s.training and s.p > 0
            for s in m.modules()
        )
        if random or any(id(p) in owned for p in m.parameters()):
            break
        first += 1
    if first == 0 or first == len(layers):
        return None
    return layers[:first], nn.Sequential(*layers[first:])


def directional_derivatives(
    model: nn.Module,
    sel: Selection,
    seed: int,
    batch: tuple[Tensor, Tensor],
    loss_fn: LossFn,
    k: int,
) -> Tensor:
    """Forward-mode differentiation (``mode="jvp"``; Baydin et al. 2022, "Gradients without
    backpropagation"): ∇L(W)·(z_k ⊙ m) for k = 0..K-1, float64 ``(K,)``, each exact (no
    finite-difference error) from one ``torch.func.jvp`` pass of ``model`` on ``batch``: the
    forward carries a tangent beside every activation (about 2-3 forwards' work, no stored
    activations), so this is not inference only. The tangents are the selection's seeded
    directions ``sel.draw`` (zero off its masks), the very directions the finite-difference
    modes perturb along, so the server's rebuild is unchanged. ``model`` may be a suffix of the
    network (:func:`split_prefix`): the selection's Parameters are found in it by identity."""
    from torch.func import functional_call, jvp

    x, y = batch
    name_in = {id(p): n for n, p in model.named_parameters()}
    missing = [n for n, p in sel.params.items() if id(p) not in name_in]
    if missing:
        raise ConfigError(f"parameters {missing} of the selection are not in the model run")
    keys = [name_in[id(p)] for p in sel.params.values()]
    primals = tuple(p.detach() for p in sel.params.values())

    def loss_of(*weights: Tensor) -> Tensor:
        out = functional_call(model, dict(zip(keys, weights, strict=True)), (x,))
        return loss_fn(out.to(torch.float64), y)

    out = torch.empty(k, dtype=torch.float64)
    with torch.enable_grad():  # forward-mode AD needs no graph, but jvp refuses no_grad's
        for i in range(k):
            tangents = []
            for name, p in sel.params.items():
                z = sel.draw(seed, [i], name, p.shape)[0].to(device=p.device, dtype=p.dtype)
                mask = sel.masks.get(name)
                tangents.append(z * mask if mask is not None else z)
            out[i] = float(jvp(loss_of, primals, tuple(tangents))[1])
    return out


def flat_layers(model: nn.Module) -> list[nn.Module] | None:
    """The layers ``model`` runs one after the other, nested plain ``nn.Sequential`` flattened;
    None when ``model`` is not a plain ``nn.Sequential`` (one running ``Sequential.forward``)."""
    if not isinstance(model, nn.Sequential) or type(model).forward is not nn.Sequential.forward:
        return None
    return _layers(model)


def _layers(seq: nn.Sequential) -> list[nn.Module]:
    out: list[nn.Module] = []
    for m in seq:
        if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward:
            out.extend(_layers(m))
        else:
            out.append(m)
    return out


def batched_pays(model: nn.Module, x: Tensor) -> bool:
    """Whether fast mode should batch the perturbed models for this forward: the batch's forward
    costs at most ``_MAX_BATCHED_WORK`` FLOPs (see there). FLOPs per sample come from one forward
    of ``x[:2]`` under torch's flop counter, once per model structure and input shape, run with
    the caller's dispatch modes (fedge's FLOP meter, memory accounting) switched off and the global
    RNG restored, so the probe is neither metered as client work nor changes a later draw."""
    if x.dim() == 0 or x.shape[0] == 0:
        return False
    key = (
        type(model),
        tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()),
        tuple(x.shape[1:]),
        x.dtype,
    )
    per_sample = _FLOPS_PER_SAMPLE.get(key)
    if per_sample is None:
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils.flop_counter import FlopCounterMode

        probe = x[:2]
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
        try:
            with _disable_current_modes(), torch.random.fork_rng(devices=[]), torch.no_grad():
                counter = FlopCounterMode(display=False)
                with counter:
                    model(probe)
        finally:
            for b, saved in buffers:  # a train-mode BatchNorm updated its running stats
                b.copy_(saved)
        per_sample = _FLOPS_PER_SAMPLE[key] = counter.get_total_flops() / probe.shape[0]
    return x.shape[0] * per_sample <= _MAX_BATCHED_WORK


def _with_directions(
    sel: Selection,
    directions: DirectionKind | Directions,
    k: int,
    draws: Draws,
    device: torch.device | None = None,
) -> Selection:
    """``sel`` drawing the step's ``directions`` (built from the selection's shapes and K)."""
    shapes = {n: p.shape for n, p in sel.params.items()}
    dirs = _directions(directions, shapes, k, sel.masks, draws, device)
    return dataclasses.replace(sel, draw=dirs.draw, draw_many=dirs.draw_many)


def _directions(
    directions: DirectionKind | Directions,
    shapes: Mapping[str, Sequence[int]],
    k: int,
    masks: Mapping[str, Tensor],
    draws: Draws,
    device: torch.device | None = None,
) -> Directions:
    """The step's directions: built from a kind (block's sized by the masks' kept coordinates)
    with ``draws``' generator, drawn on ``device``, or a given set checked against K."""
    if not isinstance(directions, Directions):
        return make_directions(directions, shapes, k, masks, draws=draws, device=device)
    if directions.k != k:
        raise ConfigError(
            f"the given directions were made for k={directions.k}, but this step has k={k}; "
            "build them with make_directions(kind, shapes, k, masks) for the same k (and masks)"
        )
    return directions


def _default_chunk(x: Tensor, models_per_perturbation: int) -> int:
    batch = x.shape[0] if x.dim() else 1
    models = min(_MAX_MODELS, max(_MIN_MODELS, _MODEL_SAMPLES_PER_PASS // max(1, batch)))
    return max(1, models // models_per_perturbation)


def _autocast_dtype(sel: Selection, dtype: torch.dtype | None) -> torch.dtype | None:
    """The autocast dtype for ``dtype`` (None when the forward runs in the weights' dtype)."""
    if dtype is None:
        return None
    have = {p.dtype for p in sel.params.values()}
    if dtype in _LOW_PRECISION:
        return None if have == {dtype} else dtype
    if dtype == torch.float32 and have == {torch.float32}:
        return None
    raise ConfigError(
        f"dtype must be None, torch.float32, torch.bfloat16 or torch.float16 (float32 only for "
        f"a float32 model), got {dtype} for parameters in {sorted(map(str, have))}; "
        "leave dtype=None to compute in the parameters' own dtype"
    )


def _maybe_autocast(x: Tensor, dtype: torch.dtype | None) -> torch.autocast:
    return torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None)


def _warn_if_unsafe(
    model: nn.Module, sel: Selection, sigma: float | None, dtype: torch.dtype | None
) -> None:
    """σ below the forward precision (``sigma`` None: no finite difference to check), or
    active dropout."""
    worst: tuple[float, str, float, torch.dtype] | None = None
    for name, p in sel.params.items():
        if sigma is None:
            break
        dt = dtype or p.dtype
        wmax = float(p.detach().abs().max()) if p.numel() else 0.0
        need = torch.finfo(dt).eps * wmax
        if sigma < need and (worst is None or need > worst[0]):
            worst = (need, name, wmax, dt)
    if worst is not None:
        need, name, wmax, dt = worst
        warnings.warn(
            f"sigma={sigma:g} is below eps({dt})·max|W| = {need:.3g} for {name!r} "
            f"(max|W| = {wmax:.3g}): W ± δ rounds back to W for most coordinates and the loss "
            f"differences are mostly rounding noise; raise sigma to at least {need:.2g} or use "
            "a wider dtype",
            PrecisionWarning,
            stacklevel=3,
        )
    active = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]
    if active:
        warnings.warn(
            f"dropout is active in {active}: each forward draws a new dropout mask from the "
            "global RNG, so loss differences mix perturbation and dropout noise and are not "
            "reproducible; call model.eval() (or set p=0) before estimating",
            ZerothOrderWarning,
            stacklevel=3,
        )


def _shape_of(v: Tensor | torch.Size | Sequence[int]) -> torch.Size:
    if isinstance(v, Tensor):
        return v.shape
    try:
        return torch.Size([int(d) for d in v])
    except (TypeError, ValueError):
        raise ConfigError(
            f"shapes_or_params values must be tensors or shapes, got {type(v).__name__}"
        ) from None


def _check_diffs(d: Tensor) -> Tensor:
    if not isinstance(d, Tensor) or d.dim() != 1 or d.numel() == 0:
        got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
        raise MessageError(f"loss differences must be a non-empty 1-D tensor (K,), got {got}")
    bad = ~torch.isfinite(d)
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise NonFiniteError(
            f"loss differences hold {int(bad.sum())} non-finite values (first at k={first}); "
            "the client's forward overflowed: drop this client's message or lower sigma/lr",
            cause=f"loss differences hold {int(bad.sum())} non-finite values",
        )
    return d.detach().cpu().to(torch.float64)


def _check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int, got {seed!r}")
