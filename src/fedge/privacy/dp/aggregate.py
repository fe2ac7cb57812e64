"""Method-agnostic DP aggregation: the server side of DP-FedAvg and DP-FTRL in one object.

The engine (wired by the method layer) calls, per round t = 1, 2, ...:

    clipped, norm = clip_contribution(update, cfg)            # on each client
    mean, metrics = dp.aggregate([clipped, ...], rnd=t)        # on the server
    # apply ``mean`` exactly where the method applied its plain mean of contributions

``gaussian`` (DP-FedAvg, McMahan et al. 2018 Alg. 1): mean = (Σ_i c_i + N(0, (z·C)²)) / m,
m the *expected* clients per round (fixed for ``fixed``/``shuffle``; q·N for ``poisson``,
so the sensitivity of the mean stays C/m when a round's count varies).

``tree`` (DP-FTRL, Kairouz et al. 2021 Alg. 1): the round sums are the leaves of a
:class:`TreeAggregator`; the returned mean is the FTRL increment (S_t − S_{t−1}) / m, so a
server that adds η·mean to its weights computes W_t = W_0 + η·S_t/m exactly as FTRL does
(updates are descent directions here, so the minus sign of Alg. 1 lives in the update). With
``momentum`` γ > 0 the increment goes through heavy-ball momentum u_t = γ·u_{t−1} + inc_t
(DP-FTRLM, Kairouz et al. Sec. 5). Trees restart at pass boundaries and every
``tree_restart_rounds`` rounds; the momentum buffer carries across restarts.

Noise comes from the generator (seed, "dp-noise", t) unless ``secure_noise``. ε after each
round is in ``metrics["epsilon"]``; :meth:`DPAggregator.allows` says whether one more round
keeps ε within ``target_epsilon``. σ = 0 with clip = inf gives back the plain mean exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedge.core.errors import ConfigError, MessageError
from fedge.core.rng import generator
from fedge.privacy.dp.accounting import epsilon, rounds_per_pass
from fedge.privacy.dp.config import PrivacyConfig
from fedge.privacy.dp.mechanisms import (
    SECURE,
    Contribution,
    NoiseSource,
    TreeAggregator,
    add,
    clip_l2,
    gaussian_like,
    scale,
)

__all__ = ["DPAggregator", "clip_contribution"]


def clip_contribution(contribution: dict[str, Tensor], cfg: PrivacyConfig) -> tuple[Contribution, float]:
    """Client side: clip to L2 norm ``cfg.clip``; returns ``(clipped, pre-clip norm)``."""
    return clip_l2(contribution, cfg.clip)


def _weighted_sum(contributions: list[Contribution], w: float) -> Contribution:
    """Σ_c w·c, accumulated as FedAvg's uniform mean is (``a·w`` then ``add_(a, alpha=w)`` in
    client order), so that σ = 0 reproduces the non-private mean bit for bit."""
    out = {k: v * w for k, v in contributions[0].items()}
    for c in contributions[1:]:
        if c.keys() != out.keys():
            raise MessageError(f"contributions disagree on tensors: {sorted(c)} vs {sorted(out)}")
        for k, v in c.items():
            out[k].add_(v, alpha=w)
    return out


class DPAggregator:
    """Server state of one DP run (see the module docstring)."""

    def __init__(self, cfg: PrivacyConfig, *, population: int, clients_per_round: int, seed: int) -> None:
        if not cfg.enabled:
            raise ConfigError("privacy.mechanism=none: no DP aggregator; set privacy.mechanism=gaussian or tree")
        rounds_per_pass(population, clients_per_round)  # validates both
        self.cfg, self.population, self.m, self.seed = cfg, population, clients_per_round, seed
        self.expected = clients_per_round  # poisson: q·N = m by construction of q = m/N
        self.std = 0.0 if cfg.noise_multiplier == 0 else cfg.noise_multiplier * cfg.clip
        self.tree = TreeAggregator(self.std) if cfg.mechanism == "tree" else None
        self.prev_noise: Contribution | None = None  # N_{t−1} of the current tree
        self.momentum: Contribution | None = None
        self.round = 0

    def _source(self, rnd: int) -> NoiseSource:
        return SECURE if self.cfg.secure_noise else generator(self.seed, "dp-noise", rnd)

    def _restarts_at(self, rnd: int) -> bool:
        """Round ``rnd`` (1-based) begins a new tree: at a pass boundary or every k rounds."""
        r = rounds_per_pass(self.population, self.m)
        i = (rnd - 1) % r
        k = self.cfg.tree_restart_rounds
        return i == 0 or (k is not None and i % k == 0)

    def aggregate(
        self, contributions: list[Contribution], rnd: int, *, like: Contribution | None = None
    ) -> tuple[Contribution, dict[str, float]]:
        """Privatized mean of this round's (already clipped) contributions, and ``{"epsilon"}``.

        Weighting is uniform (each client's clipped contribution counts 1/m): sample-count
        weights would change the sensitivity. A Poisson round can have no client; pass ``like``
        (the contribution's shapes) and the round's mean is the noise alone, as the accountant
        assumes.
        """
        if rnd != self.round + 1:
            raise ValueError(f"DP rounds must run in order: expected round {self.round + 1}, got {rnd}")
        w = 1.0 / self.expected
        if contributions:
            mean = _weighted_sum(contributions, w)  # Σ c / m
        elif like is not None:
            mean = {k: torch.zeros_like(v) for k, v in like.items()}
        else:
            raise ValueError(
                f"round {rnd}: no contributions; pass like= (the contribution's shapes) to add the noise alone"
            )
        source = self._source(rnd)
        if self.tree is None:
            if self.std > 0:  # (Σ c + N(0, σ²)) / m
                mean = add(mean, scale(gaussian_like(mean, self.std, source), w))
        else:
            if self._restarts_at(rnd):
                self.tree.reset()
                self.prev_noise = None
            if self.std > 0:  # (S_t − S_{t−1}) / m = (Σ c)/m + (N_t − N_{t−1})/m
                noise = self.tree.step(mean, source)
                delta = noise if self.prev_noise is None else {k: noise[k] - self.prev_noise[k] for k in noise}
                mean = add(mean, scale(delta, w))
                self.prev_noise = noise
            if self.cfg.momentum > 0:  # DP-FTRLM: u_t = γ·u_{t−1} + inc_t
                mean = mean if self.momentum is None else add(scale(self.momentum, self.cfg.momentum), mean)
                self.momentum = mean
        self.round = rnd
        return mean, {"epsilon": self.epsilon(rnd)}

    def epsilon(self, rounds: int) -> float:
        return epsilon(self.cfg, rounds=rounds, population=self.population, clients_per_round=self.m)

    def allows(self, rnd: int) -> bool:
        """Whether running round ``rnd`` keeps ε <= ``target_epsilon`` (always, without one)."""
        t = self.cfg.target_epsilon
        return t is None or self.epsilon(rnd) <= t

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "tree": None if self.tree is None else self.tree.state_dict(),
            "prev_noise": self.prev_noise,
            "momentum": self.momentum,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        if (state["tree"] is None) != (self.tree is None):
            raise ValueError("DP state and config disagree on mechanism=tree; resume with the same privacy config")
        if self.tree is not None:
            self.tree.load_state_dict(state["tree"])
        self.prev_noise, self.momentum = state["prev_noise"], state["momentum"]
