"""EPPFL's configuration (seed 003): the cut, local training (SGD with momentum, Sec. 3), the
activation and gradient selection fractions θ_a and θ_g, the Laplace DP on the released activations
(``method.dp``), the third-party masks in the fixed-point ring of :data:`FIXED_POINT`, and the
warnings the build gives when a protection is off or batch statistics weaken the DP accounting.
Details: ``docs/methods/eppfl.md``.
"""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import Field, model_validator
from torch import nn

from fedge.core.errors import PrivacyWarning
from fedge.methods.base import MethodConfigBase
from fedge.methods.eppfl.split import Split
from fedge.privacy.secagg import FixedPoint

__all__ = [
    "FIXED_POINT",
    "EppflConfig",
    "EppflDpConfig",
    "warn_batch_coupling",
    "warn_paper_sensitivity",
    "warn_unprotected",
]

FIXED_POINT = FixedPoint(bits=64, frac_bits=32)


class EppflDpConfig(MethodConfigBase):
    """``method.dp``: Laplace noise on the released activations (omit or null: no noise)."""

    epsilon: float = Field(gt=0, description="ε of one release of one sample's activations")
    sensitivity: Literal["rigorous", "paper"] = Field(
        "rigorous",
        description="rigorous: per-sample L1 clip C, Lap(2C/ε), ε-DP per release. paper: the paper's "
        "and its code's per-channel data-dependent scale max|a|/ε — NO DP guarantee (the scale depends on "
        "the data it protects); only to reproduce the paper's Figs. 4/5",
    )
    clip: float | None = Field(
        None,
        gt=0,
        description="per-sample L1 bound C of the released activations (Δ₁ = 2C); required with "
        "sensitivity rigorous, refused with paper (which clips nothing)",
    )
    delta: float = Field(
        1e-5, gt=0, lt=1, description="δ at which the cumulative ε is reported (RDP, PLD)"
    )
    secure_noise: bool = Field(
        False,
        description="draw the Laplace noise from the OS CSPRNG (a deployment; not reproducible). Off: from "
        "the run's generators, so anyone who knows the seed, the edge server included, can subtract it",
    )

    @model_validator(mode="after")
    def _clip_matches_sensitivity(self) -> EppflDpConfig:
        if self.sensitivity == "rigorous" and self.clip is None:
            raise ValueError(
                "clip is required with sensitivity rigorous (the per-sample L1 bound C that makes "
                "Lap(2C/ε) ε-DP); give it, e.g. {epsilon: 5.0, clip: 100.0}"
            )
        if self.sensitivity == "paper" and self.clip is not None:
            raise ValueError(
                f"clip={self.clip!r} has no effect with sensitivity paper (the paper's mechanism clips "
                "nothing: its scale is each channel's max |activation| / ε); remove clip"
            )
        return self


class EppflConfig(MethodConfigBase):
    name: Literal["eppfl"] = "eppfl"
    cut: str | None = Field(None, description="module to cut after (null: first conv + activation)")
    local_epochs: int = Field(2, ge=1, description="E_loc")
    batch_size: int = Field(16, ge=1)
    lr: float = Field(0.01, gt=0, description="SGD learning rate, device and edge server")
    momentum: float = Field(0.5, ge=0, lt=1)
    theta_a: float = Field(
        1.0, gt=0, le=1, description="fraction of each channel's activations sent"
    )
    theta_g: float = Field(
        1.0,
        gt=0,
        le=1,
        description="fraction of each channel's released activations whose gradient is returned (largest |dA|)",
    )
    dp: EppflDpConfig | None = None
    masks: bool = Field(True, description="third-party additive masks on the uploaded M_c")
    upload_dropout: float = Field(
        0.0, ge=0, lt=1, description="simulated fraction of uploads lost each round"
    )


def warn_unprotected(cfg: EppflConfig) -> None:
    """A :class:`PrivacyWarning` for each of EPPFL's two protections that is off (its paper
    relies on both; the preset ``eppfl-fmnist-vgg`` has both on)."""
    if cfg.dp is None:
        warnings.warn(
            "method.dp is not set: each device's edge server receives its cut-layer activations without noise "
            "(EPPFL releases them under Laplace DP), and activations this close to the input can be inverted to it "
            "(fedge attack --attack dlg on an EPPFL run measures that); set method.dp (e.g. {epsilon: 5.0, clip: "
            "100.0}, as configs/eppfl-fmnist-vgg.yaml) unless you are measuring exactly this",
            PrivacyWarning,
            stacklevel=3,
        )
    if not cfg.masks:
        warnings.warn(
            "method.masks=false: the aggregation server sees each device's model half M_c in the clear (EPPFL hides "
            "it under a third party's additive masks), from which a device's update, and its data, can be attacked; "
            "keep the masks unless you are measuring exactly this",
            PrivacyWarning,
            stacklevel=3,
        )


def warn_batch_coupling(cfg: EppflConfig, split: Split) -> None:
    """A :class:`PrivacyWarning` when DP is on and the device half normalizes with batch
    statistics: each released row then depends on every sample of its batch, so the logged ε
    (a sample's own releases, ε each) understates what one sample's batch releases reveal."""
    norms = sorted(
        {
            type(m).__name__
            for m in split.device.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        }
    )
    if cfg.dp is None or cfg.dp.sensitivity == "paper" or not norms:
        return  # paper: no ε is a bound anyway (warn_paper_sensitivity)
    warnings.warn(
        f"method.dp with {'/'.join(norms)} in the device half (cut {cfg.cut or 'default'}): batch statistics make every "
        f"released row depend on all {cfg.batch_size} samples of its batch, so a sample's privacy loss per batch can "
        f"reach {cfg.batch_size}·ε, not the ε each release is accounted at; use a model whose device half has no batch "
        "statistics (e.g. model.norm: group) or cut before the norm, for the logged ε to bound it",
        PrivacyWarning,
        stacklevel=3,
    )


def warn_paper_sensitivity(cfg: EppflConfig) -> None:
    """A loud :class:`PrivacyWarning` when ``method.dp.sensitivity`` is ``paper``: the noise scale
    is computed from the activations it noises, so the release is not differentially private."""
    if cfg.dp is None or cfg.dp.sensitivity != "paper":
        return
    warnings.warn(
        f"NO DP GUARANTEE: method.dp.sensitivity=paper scales each sample's Laplace noise by its own "
        f"channels' max |activation| / ε (ε={cfg.dp.epsilon:g}; the paper's Eq. 6-7 as its code computes "
        "them): the scale depends on the data it protects, so the released values' spread reveals each "
        "channel's max and no ε bounds what a release reveals about its sample (no cumulative ε is logged for it). "
        "Use it only to reproduce the paper's Figs. 4/5 beside "
        "the rigorous mechanism (method.dp.sensitivity=rigorous with a clip), never to protect data",
        PrivacyWarning,
        stacklevel=3,
    )
