"""The ``privacy:`` section of a run config: the DP mechanism (``gaussian``: DP-FedAvg;
``tree``: DP-FTRL), its parameters, the client sampling the accountant assumes, and the noise
source. Design notes: docs/decisions.md#differential-privacy.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from fedge.core.config import ConfigModel
from fedge.core.errors import PrivacyWarning

__all__ = ["Accountant", "Mechanism", "PrivacyConfig", "Sampling"]

Mechanism = Literal["none", "gaussian", "tree"]
Sampling = Literal["poisson", "fixed", "shuffle"]
Accountant = Literal["rdp", "pld"]


class PrivacyConfig(ConfigModel):
    """Validated ``privacy:`` section. ``mechanism: none`` (the default) turns DP off."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    mechanism: Mechanism = Field("none", description="none | gaussian (DP-FedAvg) | tree (DP-FTRL)")
    clip: float = Field(
        1.0, description="L2 bound C on each client's contribution (inf: no clipping, no privacy)"
    )
    noise_multiplier: float = Field(
        0.0, description="z: noise std is z·clip on the sum (per tree node for tree)"
    )
    delta: float = Field(
        1e-6, description="δ at which ε is reported, in (0, 1); well below 1/population"
    )
    sampling: Sampling = Field(
        "fixed", description="poisson | fixed | shuffle: how rounds pick clients"
    )
    accountant: Accountant = Field("rdp", description="rdp | pld (dp-accounting)")
    target_epsilon: float | None = Field(
        None, description="stop the run before ε would exceed this"
    )
    tree_restart_rounds: int | None = Field(
        None, description="tree: restart every this many rounds within a pass (None: once per pass)"
    )
    momentum: float = Field(0.0, description="tree: DP-FTRLM momentum γ in [0, 1)")
    secure_noise: bool = Field(
        False,
        description="draw noise, and the poisson/fixed client sample, from the OS CSPRNG (not reproducible)",
    )

    @field_validator("clip")
    @classmethod
    def _clip(cls, v: float) -> float:
        if math.isnan(v) or v <= 0:
            raise ValueError(
                f"privacy.clip must be > 0, got {v}; set the L2 bound on a client's contribution, e.g. privacy.clip=1.0"
            )
        return v

    @field_validator("noise_multiplier")
    @classmethod
    def _z(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(
                f"privacy.noise_multiplier must be a finite number >= 0, got {v}; "
                "e.g. privacy.noise_multiplier=1.0 (0 adds no noise and gives ε = inf)"
            )
        return v

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not math.isfinite(v) or not 0 < v < 1:
            raise ValueError(
                f"privacy.delta must be in (0, 1), got {v}; use one well below 1/population, e.g. privacy.delta=1e-6"
            )
        return v

    @field_validator("target_epsilon")
    @classmethod
    def _target(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(
                f"privacy.target_epsilon must be a finite number > 0, got {v}; "
                "e.g. privacy.target_epsilon=8, or leave it unset to run every round"
            )
        return v

    @field_validator("tree_restart_rounds")
    @classmethod
    def _restart(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(
                f"privacy.tree_restart_rounds must be >= 1, got {v}; leave it unset to restart once per pass"
            )
        return v

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, v: float) -> float:
        if not math.isfinite(v) or not 0 <= v < 1:
            raise ValueError(
                f"privacy.momentum must be in [0, 1), got {v}; e.g. 0.9 (DP-FTRLM) or 0"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> PrivacyConfig:
        if self.mechanism == "none":
            fields = type(self).model_fields
            moot = [
                f"privacy.{k}={getattr(self, k)!r}"
                for k in fields
                if k != "mechanism" and getattr(self, k) != fields[k].default
            ]
            if moot:
                raise ValueError(
                    f"{', '.join(moot)} set, but privacy.mechanism=none: the run would have no differential "
                    "privacy and these keys no effect; set privacy.mechanism=gaussian (DP-FedAvg) or tree "
                    "(DP-FTRL), or remove them"
                )
        if math.isinf(self.clip) and self.noise_multiplier > 0:
            raise ValueError(
                f"privacy.clip=inf with privacy.noise_multiplier={self.noise_multiplier} would add infinite "
                "noise; set a finite clip, or noise_multiplier=0 for the no-privacy check"
            )
        if self.mechanism == "tree" and self.sampling != "shuffle":
            raise ValueError(
                f"privacy.mechanism=tree with privacy.sampling={self.sampling}: DP-FTRL's accounting "
                "(SingleEpochTreeAggregationDpEvent) needs each client at most once per tree, but "
                f"{self.sampling} sampling can pick a client again in a later round of the same tree "
                "(every client joins every round when clients per round = population); set "
                "privacy.sampling=shuffle (one pass over the population in random order, the tree "
                "restarting each pass), or use privacy.mechanism=gaussian"
            )
        if self.mechanism != "tree" and (
            self.tree_restart_rounds is not None or self.momentum != 0
        ):
            raise ValueError(
                "privacy.tree_restart_rounds and privacy.momentum apply to mechanism=tree only; "
                f"got mechanism={self.mechanism}: remove them or set privacy.mechanism=tree"
            )
        if self.sampling == "fixed" and self.accountant == "pld":
            raise ValueError(
                "privacy.sampling=fixed is accounted with RDP only (dp-accounting's PLD accountant has "
                "no sampling-without-replacement event); set privacy.accountant=rdp or privacy.sampling=poisson"
            )
        if self.enabled and self.noise_multiplier == 0:
            warnings.warn(
                f"privacy.mechanism={self.mechanism} with privacy.noise_multiplier=0 adds no noise: "
                'the run has no differential privacy (ε = inf, written "inf" in summary.json); '
                "set privacy.noise_multiplier > 0 (e.g. 1.0), or keep 0 only as the no-privacy check",
                PrivacyWarning,
                stacklevel=2,
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.mechanism != "none"
