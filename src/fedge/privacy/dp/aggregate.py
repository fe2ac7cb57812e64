"""Method-agnostic DP aggregation, the server side of DP-FedAvg (McMahan et al. 2018, Alg. 1) and
DP-FTRL (Kairouz et al. 2021, Alg. 1) in one object, :class:`DPAggregator`. Design notes: docs/decisions.md#differential-privacy.
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


def clip_contribution(
    contribution: dict[str, Tensor], cfg: PrivacyConfig
) -> tuple[Contribution, float]:
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

    def __init__(
        self, cfg: PrivacyConfig, *, population: int, clients_per_round: int, seed: int
    ) -> None:
        if not cfg.enabled:
            raise ConfigError(
                "privacy.mechanism=none: no DP aggregator; set privacy.mechanism=gaussian or tree"
            )
        rounds_per_pass(population, clients_per_round)  # validates both
        self.cfg, self.population, self.m, self.seed = cfg, population, clients_per_round, seed
        self.expected = clients_per_round  # poisson: q·N = m by construction of q = m/N
        self.std = 0.0 if cfg.noise_multiplier == 0 else cfg.noise_multiplier * cfg.clip
        self.tree = TreeAggregator(self.std) if cfg.mechanism == "tree" else None
        self.prev_noise: Contribution | None = None  # N_{t−1} of the current tree
        self.momentum: Contribution | None = None
        self.round = 0  # the last round released
        self.skipped: list[int] = []  # rounds before it that released nothing

    def _source(self, rnd: int) -> NoiseSource:
        return SECURE if self.cfg.secure_noise else generator(self.seed, "dp-noise", rnd)

    def _tree_of(self, rnd: int) -> tuple[int, int]:
        """(pass, tree within the pass) of round ``rnd`` (1-based): trees restart at pass
        boundaries and every ``tree_restart_rounds`` rounds within a pass."""
        p, i = divmod(rnd - 1, rounds_per_pass(self.population, self.m))
        k = self.cfg.tree_restart_rounds
        return p, 0 if k is None else i // k

    def _skipped_before(self, rnd: int) -> list[int]:
        """The rounds before ``rnd`` that released nothing: those recorded, and every round since
        the last release (rounds run in order, so one not aggregated by now was skipped)."""
        return self.skipped + list(range(self.round + 1, rnd))

    def aggregate(
        self, contributions: list[Contribution], rnd: int, *, like: Contribution | None = None
    ) -> tuple[Contribution, dict[str, float]]:
        """Privatized mean of this round's (already clipped) contributions, and ``{"epsilon"}``.

        Weighting is uniform (each client's clipped contribution counts 1/m): sample-count
        weights would change the sensitivity. A Poisson round can have no client; pass ``like``
        (the contribution's shapes) and the round's mean is the noise alone, as the accountant
        assumes. Rounds between the last one aggregated and ``rnd`` were skipped (no release;
        see the module docstring); ``rnd`` must come after the last one aggregated.
        """
        if rnd <= self.round:
            raise ValueError(
                f"DP rounds must run in order: round {rnd} after round {self.round} was aggregated; each round is "
                "aggregated at most once (to start over, build a new DPAggregator or load_state_dict an earlier state)"
            )
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
            if self.round == 0 or self._tree_of(rnd) != self._tree_of(self.round):
                self.tree.reset()
                self.prev_noise = None
            if self.std > 0:  # (S_t − S_{t−1}) / m = (Σ c)/m + (N_t − N_{t−1})/m
                noise = self.tree.step(mean, source)
                delta = (
                    noise
                    if self.prev_noise is None
                    else {k: noise[k] - self.prev_noise[k] for k in noise}
                )
                mean = add(mean, scale(delta, w))
                self.prev_noise = noise
            if self.cfg.momentum > 0:  # DP-FTRLM: u_t = γ·u_{t−1} + inc_t
                mean = (
                    mean
                    if self.momentum is None
                    else add(scale(self.momentum, self.cfg.momentum), mean)
                )
                self.momentum = mean
        self.skipped = self._skipped_before(rnd)
        self.round = rnd
        return mean, {"epsilon": self.epsilon(rnd)}

    def epsilon(self, rnd: int) -> float:
        """ε after a release in round ``rnd``, counting only releases: the rounds skipped before
        it (see :meth:`_skipped_before`) released nothing."""
        skipped = self._skipped_before(rnd)
        return epsilon(
            self.cfg,
            rounds=rnd,
            population=self.population,
            clients_per_round=self.m,
            skipped=skipped,
        )

    def allows(self, rnd: int) -> bool:
        """Whether a release in round ``rnd`` keeps ε <= ``target_epsilon`` (always, without one)."""
        t = self.cfg.target_epsilon
        return t is None or self.epsilon(rnd) <= t

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "skipped": list(self.skipped),
            "tree": None if self.tree is None else self.tree.state_dict(),
            "prev_noise": self.prev_noise,
            "momentum": self.momentum,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.skipped = [
            int(r) for r in state.get("skipped", [])
        ]  # absent: a checkpoint from before skips were kept
        if (state["tree"] is None) != (self.tree is None):
            raise ValueError(
                "DP state and config disagree on mechanism=tree; resume with the same privacy config"
            )
        if self.tree is not None:
            self.tree.load_state_dict(state["tree"])
        self.prev_noise, self.momentum = state["prev_noise"], state["momentum"]
