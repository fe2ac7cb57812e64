"""The Laplace mechanism on per-sample vectors with per-sample L1 clipping (``b = Δ₁ / ε``,
``Δ₁ = 2C`` under replace-one adjacency), and its accounting by ``dp-accounting``.
Design notes: docs/decisions.md#differential-privacy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from fedge.core.errors import ConfigError
from fedge.privacy.dp.mechanisms import NoiseSource, SecureNoise, secure_uniform

__all__ = ["LaplaceMechanism", "clip_l1", "laplace_epsilon", "laplace_noise", "pld_interval"]


def clip_l1(v: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row (dim 0 = samples) scaled to L1 norm at most ``clip``; differentiable."""
    if not clip > 0:
        raise ConfigError(f"L1 clip bound must be > 0, got {clip!r}")
    flat = v.reshape(v.shape[0], -1)
    norms = flat.abs().sum(dim=1)
    factor = torch.clamp(clip / torch.clamp(norms, min=1e-12), max=1.0)
    return v * factor.reshape((-1,) + (1,) * (v.dim() - 1))


def laplace_noise(
    shape: tuple[int, ...],
    scale: float,
    *,
    generator: NoiseSource,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """i.i.d. Lap(0, scale) samples: the difference of two Exp(1) draws, times ``scale``
    (drawn in float64 from ``generator`` — a ``torch.Generator``, or :data:`SECURE` for 53-bit
    uniforms from ``secrets.token_bytes`` — then cast). Like the Gaussian sampler, the
    floating-point sampler is not hardened against Mironov's (CCS 2012) attacks."""
    if isinstance(generator, SecureNoise):
        u = torch.from_numpy(secure_uniform(2 * math.prod(shape))).reshape((2, *shape))
    else:
        u = torch.rand((2, *shape), generator=generator, dtype=torch.float64)
    e = -torch.log1p(-u)  # Exp(1); u < 1 so finite
    return (scale * (e[0] - e[1])).to(dtype)


@dataclass(frozen=True)
class LaplaceMechanism:
    """Per-sample release ``clip_l1(v, clip) + Lap(2·clip/ε)`` (replace-one adjacency).

    Args:
        epsilon: ε of one release of one sample (> 0).
        clip: per-sample L1 bound C (> 0).
    """

    epsilon: float
    clip: float

    def __post_init__(self) -> None:
        if not (
            isinstance(self.epsilon, (int, float))
            and math.isfinite(self.epsilon)
            and self.epsilon > 0
        ):
            raise ConfigError(
                f"Laplace epsilon must be a finite number > 0, got {self.epsilon!r}; use e.g. 1, 5 or 10"
            )
        if not (isinstance(self.clip, (int, float)) and math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(f"Laplace L1 clip must be a finite number > 0, got {self.clip!r}")

    @property
    def sensitivity(self) -> float:
        """Δ₁ = 2C (replace-one)."""
        return 2.0 * self.clip

    @property
    def scale(self) -> float:
        """b = Δ₁ / ε."""
        return self.sensitivity / self.epsilon

    def release(
        self, v: torch.Tensor, *, generator: NoiseSource
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(clipped v — differentiable, noise-free, for the owner's backward pass — and the
        released ``clipped + noise``, detached)."""
        clipped = clip_l1(v, self.clip)
        noise = laplace_noise(tuple(v.shape), self.scale, generator=generator, dtype=v.dtype)
        return clipped, clipped.detach() + noise


def pld_interval(epsilon_step: float) -> float:
    """The PLD accountant's discretization: its default 1e-4 up to ε_step = 10, then
    ε_step·1e-5 (the privacy-loss range grows with ε; a fixed 1e-4 grid for ε_step = 1000
    would hold 10^7 points)."""
    return 1e-4 if epsilon_step <= 10 else epsilon_step * 1e-5


@lru_cache(maxsize=256)
def laplace_epsilon(epsilon_step: float, count: int, delta: float) -> dict[str, float]:
    """Cumulative privacy of ``count`` Laplace releases of ε_step each.

    Returns ``{"pure": count·ε_step, "rdp": ε(δ) from the RDP accountant, "pld": ε(δ) from
    the PLD accountant}``; 0 for ``count == 0``.
    """
    if not epsilon_step > 0:
        raise ConfigError(f"epsilon_step must be > 0, got {epsilon_step!r}")
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
    if count < 0:
        raise ConfigError(f"count must be >= 0, got {count!r}")
    if count == 0:
        return {"pure": 0.0, "rdp": 0.0, "pld": 0.0}
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.LaplaceDpEvent(1.0 / epsilon_step), count
    )
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(event)
    pld = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=pld_interval(epsilon_step)
    )
    pld.compose(event)
    return {
        "pure": count * epsilon_step,
        "rdp": float(rdp.get_epsilon(delta)),
        "pld": float(pld.get_epsilon(delta)),
    }
