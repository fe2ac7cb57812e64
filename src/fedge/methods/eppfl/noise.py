"""The Laplace noise EPPFL's device adds to its released activations (``method.dp``), by
``method.dp.sensitivity``: ``rigorous`` is :class:`fedge.privacy.dp.laplace.LaplaceMechanism`
(per-sample L1 clip C, ``Lap(2C/ε)`` on every coordinate: ε-DP per release), and ``paper`` is
:class:`PaperLaplace`, the per-channel data-dependent scale of the paper (seed 003, Eq. 6-7) as
its authors' code computes it, which is **not** differentially private: it exists to reproduce
the paper's Figs. 4/5 beside the rigorous mechanism (``docs/methods/eppfl.md``, "Paper vs code").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from fedge.core.errors import ConfigError
from fedge.privacy.dp.laplace import LaplaceMechanism, laplace_noise
from fedge.privacy.dp.mechanisms import NoiseSource

__all__ = ["ActivationNoise", "PaperLaplace", "activation_noise"]


class ActivationNoise(Protocol):
    def release(
        self, v: torch.Tensor, *, generator: NoiseSource
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class PaperLaplace:
    """The paper's release: each released value of sample b, channel k gets ``Lap(s_bk)`` with
    ``s_bk = max_j |a_bkj| / ε``, the largest magnitude among that sample's released values of that
    channel (Eq. 6's Δf_c^k estimated from the data, as the authors' ``add_noise_channel`` does
    with ``torch.max(channel) / epsilon`` on the non-negative activations after the cut's ReLU;
    ``|·|`` keeps the scale non-negative for a cut without one). Nothing is clipped; a channel
    whose released values are all 0 gets no noise.

    No DP guarantee: the scale is computed from the data it protects (the build warns).

    Args:
        epsilon: the paper's per-release ε (> 0).
    """

    epsilon: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and self.epsilon > 0):
            raise ConfigError(f"epsilon must be a number > 0, got {self.epsilon!r}")

    def scales(self, v: torch.Tensor) -> torch.Tensor:
        """``(B, C, 1)``: each sample's and channel's Laplace scale for values ``v`` of shape
        ``(B, C, k)`` (the released values, per sample and channel)."""
        if v.dim() != 3:
            raise ValueError(f"expected released values of shape (B, C, k), got {tuple(v.shape)}")
        return v.detach().abs().amax(dim=-1, keepdim=True) / self.epsilon

    def release(
        self, v: torch.Tensor, *, generator: NoiseSource
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(``v`` itself — differentiable, noise-free, for the owner's backward pass — and the
        released ``v + Lap(scales)``, detached). The noise is unit Laplace draws (float64, as
        :func:`~fedge.privacy.dp.laplace.laplace_noise`) times the scales."""
        unit = laplace_noise(tuple(v.shape), 1.0, generator=generator, dtype=torch.float64)
        noise = (unit * self.scales(v).to(torch.float64)).to(v.dtype)
        return v, v.detach() + noise


def activation_noise(epsilon: float, sensitivity: str, clip: float | None) -> ActivationNoise:
    """The mechanism ``method.dp`` names: :class:`LaplaceMechanism` (``rigorous``, with ``clip``)
    or :class:`PaperLaplace` (``paper``)."""
    if sensitivity == "rigorous":
        if clip is None:
            raise ConfigError("method.dp.sensitivity=rigorous needs method.dp.clip (e.g. 100.0)")
        return LaplaceMechanism(epsilon, clip)
    if sensitivity == "paper":
        return PaperLaplace(epsilon)
    raise ConfigError(
        f"method.dp.sensitivity={sensitivity!r}: expected 'rigorous' (DP) or 'paper' (no guarantee)"
    )
