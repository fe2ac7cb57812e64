"""The settings of one zeroth-order estimate (K, σ, scheme, directions, ...) as one frozen value,
:class:`ZerothOrderSpec`, built once from a method's config and passed whole to the client and
the server so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from fedge.core.config import check_positive_int
from fedge.core.errors import ConfigError
from fedge.core.rng import Draws, check_draws
from fedge.estimators.directions import DirectionKind, Directions

__all__ = ["Mode", "Scheme", "ZerothOrderSpec", "resolve_spec"]

Scheme = Literal["central", "forward"]
Mode = Literal["lean", "fast", "jvp"]

_DTYPES = (None, torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True, kw_only=True)
class ZerothOrderSpec:
    """How to estimate ∇L from forwards: BAFFLE's Stein estimator (seed 000, Eq. 6),

        ĝ = 1 / (c · K · σ²) · Σ_k ΔL_k · δ_k,   δ_k = σ z_k,

    with c = 2 for ``central`` and c = 1 for ``forward`` (:mod:`fedge.estimators.zeroth_order`).

    Attributes:
        k: K, the number of loss differences a client computes and uploads.
        sigma: σ, the perturbation scale (the paper uses 1e-4).
        scheme: ``"central"`` (ΔL = L(W + δ) − L(W − δ), 2K forwards) or ``"forward"``
            (twice-FD: L(W + δ) − L(W), K + 1 forwards).
        directions: the law of z_k, ``"gaussian"`` (BAFFLE's i.i.d. N(0, I)),
            ``"orthogonal"`` or ``"block"`` (:mod:`fedge.estimators.directions`); or a
            :class:`~fedge.estimators.directions.Directions` already built for the selection
            and K (e.g. :func:`~fedge.estimators.directions.remembered`).
        draws: the generator of the directions: ``"torch"`` (today's numbers, bit-identical
            only on identical hardware; what earlier records used) or ``"portable"``
            (:mod:`fedge.core.portable`: the same bits on every machine). A given
            :class:`~fedge.estimators.directions.Directions` must have been built with the same.
        mode: ``"lean"`` (least memory) or ``"fast"`` (batched or threaded throughput);
            the same ΔL up to float rounding. ``"jvp"``: forward-mode differentiation, not
            inference only: ΔL_k = c·σ·∇L·z_k exactly, one ``torch.func.jvp`` pass per direction
            (:func:`~fedge.estimators.zeroth_order.directional_derivatives`), the finite
            differences' limit as σ → 0, so the server's rebuild is unchanged.
        chunk: fast mode: perturbations per batched pass (None: ~512 model-samples a pass).
        dtype: forward precision: None (the parameters' dtype), ``torch.float32``,
            ``torch.bfloat16`` or ``torch.float16`` (autocast).
        workers: fast mode: threads the K perturbations are split over when they are not
            batched (None: ``torch.get_num_threads()``).
        prefix_once: run the model's leading layers that hold no perturbed coordinate (frozen,
            or outside the selection) once per call, and the K perturbed forwards through the
            rest only (:func:`~fedge.estimators.zeroth_order.split_prefix`; an ``nn.Sequential``
            model). The losses are those of the full forwards (the prefix's output is the same
            tensor each time); the FLOPs drop by the prefix's share. The fast mode's batched pass
            already shares the prefix; this extends it to the lean and threaded loops.
        device: where the directions are drawn (portable Gaussians made there, the same bits
            as on the CPU; :func:`~fedge.estimators.directions.make_directions`) and where the
            server's rebuild of ĝ is accumulated; None: the CPU (a CPU device is stored as
            None, so specs equal but for spelling compare equal). The run's ``device``.

    Example (BAFFLE's defaults: K = 100, σ = 1e-4, twice-FD):
        >>> spec = ZerothOrderSpec(k=100, sigma=1e-4, scheme="forward", mode="fast")
        >>> g = zeroth_order_gradient(model, F.cross_entropy, (x, y), spec, seed=7)  # doctest: +SKIP

    Invalid values raise :class:`~fedge.core.errors.ConfigError` when the spec is built.
    """

    k: int
    sigma: float
    scheme: Scheme
    directions: DirectionKind | Directions = "gaussian"
    draws: Draws = "torch"
    mode: Mode = "lean"
    chunk: int | None = None
    dtype: torch.dtype | None = None
    workers: int | None = None
    prefix_once: bool = False
    device: torch.device | None = None

    def __post_init__(self) -> None:
        check_positive_int("k", self.k)
        check_sigma(self.sigma)
        check_scheme(self.scheme)
        if not isinstance(self.directions, Directions) and self.directions not in get_args(
            DirectionKind
        ):
            raise ConfigError(
                f"directions must be one of {list(get_args(DirectionKind))}, got "
                f"{self.directions!r}; gaussian is BAFFLE's i.i.d. N(0, I)"
            )
        check_draws(self.draws)
        if isinstance(self.directions, Directions) and self.directions.draws != self.draws:
            raise ConfigError(
                f"the given directions draw from {self.directions.draws!r} but the spec names "
                f"draws={self.draws!r}; build them with make_directions(..., draws={self.draws!r})"
            )
        if self.mode not in get_args(Mode):
            raise ConfigError(f"mode must be one of {get_args(Mode)}, got {self.mode!r}")
        if self.chunk is not None:
            check_positive_int("chunk", self.chunk)
        if self.workers is not None:
            check_positive_int("workers", self.workers)
        if not isinstance(self.prefix_once, bool):
            raise ConfigError(f"prefix_once must be a bool, got {self.prefix_once!r}")
        if self.device is not None and not isinstance(self.device, torch.device):
            raise ConfigError(
                f"device must be a torch.device or None, got {self.device!r}; pass "
                "fedge.core.device.resolve_device('cuda') (or leave it None for the CPU)"
            )
        if self.device is not None and self.device.type == "cpu":  # one spelling of the CPU
            object.__setattr__(self, "device", None)
        if self.dtype not in _DTYPES:
            raise ConfigError(
                f"dtype must be None, torch.float32, torch.bfloat16 or torch.float16, got "
                f"{self.dtype!r}; leave dtype=None to compute in the parameters' own dtype"
            )

    @property
    def normalizer(self) -> float:
        """c in Eq. (6): 2 for ``central`` (ΔL ≈ 2 δᵀ∇L, Eq. 2), 1 for ``forward`` (Eq. 1)."""
        return 2.0 if self.scheme == "central" else 1.0


def resolve_spec(spec: ZerothOrderSpec | None, settings: Mapping[str, Any]) -> ZerothOrderSpec:
    """``spec``, or the spec that keyword ``settings`` (its field names) describe: the keyword
    form of the estimator functions, e.g. ``loss_differences(..., k=4, sigma=1e-3, ...)``."""
    if spec is None:
        names = {f.name for f in dataclasses.fields(ZerothOrderSpec)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise ConfigError(
                f"unknown zeroth-order setting(s) {unknown}; the settings are {sorted(names)}"
            )
        return ZerothOrderSpec(**settings)
    if not isinstance(spec, ZerothOrderSpec):
        raise ConfigError(f"spec must be a ZerothOrderSpec, got {type(spec).__name__}")
    if settings:
        raise ConfigError(
            f"got a ZerothOrderSpec and the settings {sorted(settings)} as keywords; pass one "
            "or the other (to change a spec: dataclasses.replace(spec, ...))"
        )
    return spec


def check_scheme(scheme: str) -> None:
    if scheme not in get_args(Scheme):
        raise ConfigError(f"scheme must be one of {sorted(get_args(Scheme))}, got {scheme!r}")


def check_sigma(sigma: float) -> None:
    if not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma <= 0:
        raise ConfigError(f"sigma must be a finite number > 0 (BAFFLE uses 1e-4), got {sigma!r}")
