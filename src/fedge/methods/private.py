"""User-level differential privacy for any method whose server averages client contributions
(fedavg, fedsgd, fedprox, scaffold, fedpt, fedkseed, decomfl, feedsign, baffle in both modes): the
``privacy:`` section of a run.

- **Clients** clip their whole contribution (every array of the reply, one L2 norm) to
  ``privacy.clip`` (:class:`PrivateClient`): a FedAvg delta, a FedSGD gradient, a FedPT
  trainable delta — or BAFFLE batch mode's K loss differences, so the sensitivity lives in K
  scalars (a very low-dimensional DP-BAFFLE no seed paper has).
- **The server** (:class:`DifferentialPrivacy`) averages the clipped contributions uniformly
  (each counts 1/m, m the expected clients per round: sample-count weights would change the
  sensitivity, so ``method.weighting`` is not used under DP), adds the mechanism's noise —
  DP-FedAvg's Gaussian N(0, (z·C)²) on the sum (McMahan et al., arXiv:1710.06963v3) or
  DP-FTRL's tree-aggregated noise (Kairouz et al., arXiv:2103.00039v3, as FedPT uses it) —
  and hands the noisy mean to the method's own update (:meth:`Summable.apply_mean`). The
  server re-clips what arrives in the clear, so a client that skips its clip cannot break the
  bound; under secure aggregation it sees only the sum and cannot, so the bound then rests on
  the clients clipping (honest clients, as secure aggregation's threat model).
- The clients of a round are drawn as the accountant assumes (``privacy.sampling``: fixed
  size, Poisson, or shuffled passes), ε is logged every round (``epsilon``), and with
  ``privacy.target_epsilon`` the run stops before a round that would exceed it, and says so.

With secure aggregation on, DP composes underneath it: clients clip, the masked sum is all the
server learns, and the noise is added to that sum (central DP on a securely aggregated sum).
Noise comes from the run's generators (reproducible); ``privacy.secure_noise`` draws it from
the OS's CSPRNG instead, as a deployment must, and the clients of each round too (``poisson``,
``fixed``): amplification by subsampling assumes the adversary does not know the sample.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError, MessageError, PrivacyWarning
from fedge.core.messages import Message
from fedge.core.protocols import ClientProgram, Round, Strategy, StrategyWrapper
from fedge.core.rng import Draws
from fedge.methods.secure import SecureAggregationOptions, Summable, secure
from fedge.privacy.dp.aggregate import DPAggregator, clip_contribution
from fedge.privacy.dp.config import PrivacyConfig
from fedge.privacy.dp.schedule import poisson_clients, secret_clients, shuffled_clients

__all__ = ["DifferentialPrivacy", "PrivateClient", "protect"]

_SLACK = 1 + 1e-6  # float rounding of a client's own clip


class PrivateClient:
    """Client side: the method's reply with its arrays clipped to L2 norm ``clip`` together;
    per-client metrics (a training loss) are dropped, since DP covers only the contribution."""

    def __init__(self, inner: ClientProgram, cfg: PrivacyConfig) -> None:
        self.inner, self.cfg = inner, cfg

    def run(self, message: Message, ctx: ClientContext) -> Message:
        reply = self.inner.run(message, ctx)
        clipped, _ = clip_contribution(dict(reply.arrays), self.cfg)
        return Message(clipped, config=reply.config)


class DifferentialPrivacy(StrategyWrapper):
    """Server side: the noisy uniform mean of clipped contributions, then the method's update.

    Args:
        inner: a :class:`~fedge.methods.secure.Summable` strategy.
        cfg: the validated ``privacy:`` section.
        population, clients_per_round, seed: the run's, for sampling and accounting.
    """

    weighted = False  # uniform: the clipped contributions each count 1/m

    def __init__(
        self,
        inner: Strategy,
        cfg: PrivacyConfig,
        *,
        population: int,
        clients_per_round: int,
        seed: int,
    ) -> None:
        if not isinstance(inner, Summable):
            raise ConfigError(
                f"privacy.mechanism={cfg.mechanism} needs a method whose server averages client "
                f"contributions; {type(inner).__name__} does not (set privacy.mechanism=none)"
            )
        super().__init__(inner)
        self.summable: Summable = inner
        self.cfg, self.seed, self.population, self.per_round = (
            cfg,
            seed,
            population,
            clients_per_round,
        )
        self.dp = DPAggregator(
            cfg, population=population, clients_per_round=clients_per_round, seed=seed
        )
        self.summable.summands()  # a method that cannot say what it sums fails here, at build
        self.last_epsilon = 0.0

    @property
    def template(self) -> dict[str, torch.Tensor]:
        """Zeros shaped as this round's contributions (:meth:`Summable.summands`: a pruned tensor
        contributes its kept coordinates, which can change when the model is pruned)."""
        return {
            k: torch.zeros(shape, dtype=dtype)
            for k, (shape, dtype) in self.summable.summands().items()
        }

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return self.summable.summands()

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        """One exchange: the method's message, then this wrapper's noisy aggregate."""
        return Strategy.round(self, rnd, client_ids)

    def select_clients(self, rnd: int, num_clients: int, per_round: int) -> list[int] | None:
        """The round's clients as the accountant assumes them (fixed size: the engine's draw).

        With ``secure_noise`` the ``poisson`` and ``fixed`` draws come from the OS CSPRNG too:
        the accountant's amplification by subsampling holds only against an adversary who does
        not know which clients a round drew, and the run's generators would tell anyone who knows
        the seed. (``shuffle`` claims no amplification; its passes stay seeded.)
        """
        kw = dict(population=num_clients, clients_per_round=per_round)
        if self.cfg.secure_noise and self.cfg.sampling in ("poisson", "fixed"):
            return secret_clients(
                self.cfg.sampling, population=num_clients, clients_per_round=per_round
            )
        if self.cfg.sampling == "poisson":
            return poisson_clients(self.seed, rnd, **kw)
        if self.cfg.sampling == "shuffle":
            return shuffled_clients(self.seed, rnd, **kw)
        return self.inner.select_clients(rnd, num_clients, per_round)

    def stop_reason(self, rnd: int) -> str | None:
        if not self.dp.allows(rnd):
            return (
                f"privacy.target_epsilon={self.cfg.target_epsilon} reached: round {rnd} would bring ε to "
                f"{self.dp.epsilon(rnd):.4g} (δ={self.cfg.delta}); stopped after round {rnd - 1}"
            )
        return self.inner.stop_reason(rnd)

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        contributions = []
        template = self.template
        for cid, reply in replies.items():
            got = {k: reply.arrays.get(k) for k in template}
            bad = [k for k, v in got.items() if v is None or v.shape != template[k].shape]
            if bad or set(reply.arrays) != set(template):
                raise MessageError(
                    f"round {rnd}, client {cid}: expected arrays {sorted(template)}, got {sorted(reply.arrays)}"
                )
            # the server's own bound check: a client that clipped less is clipped here
            clipped, _ = clip_contribution({k: reply.arrays[k] for k in template}, self.cfg)
            contributions.append(clipped)
        return self._update(rnd, contributions, sorted(replies))

    def apply_mean(
        self, rnd: int, mean: dict[str, torch.Tensor], *, weight: float, clients: Sequence[int] = ()
    ) -> dict[str, float]:
        """Secure aggregation's unmasked mean over ``weight`` clients (uniform weights): the sum
        is ``weight · mean``, and the noise goes on that sum."""
        return self._update(rnd, [{k: v * weight for k, v in mean.items()}], clients)

    def _update(
        self, rnd: int, contributions: list[dict[str, torch.Tensor]], clients: Sequence[int]
    ) -> dict[str, float]:
        template = self.template
        mean, metrics = self.dp.aggregate(contributions, rnd, like=template)
        out = self.summable.apply_mean(
            rnd,
            {k: v.to(template[k].dtype) for k, v in mean.items()},
            weight=float(len(contributions)),
            clients=clients,
        )
        self.last_epsilon = metrics["epsilon"]
        return {**out, **metrics}

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "dp": self.dp.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.dp.load_state_dict(state["dp"])


def protect(
    strategy: Strategy,
    program: ClientProgram,
    options: SecureAggregationOptions,
    *,
    privacy: PrivacyConfig | None,
    seed: int,
    weighted: bool,
    population: int,
    clients_per_round: int,
    draws: Draws = "torch",
) -> tuple[Strategy, ClientProgram]:
    """A summing method's two sides with differential privacy (``privacy``, when enabled)
    underneath secure aggregation (``options.secure_aggregation``); unchanged when both are off."""
    if privacy is not None and privacy.enabled:
        if weighted:
            warnings.warn(
                "privacy: client contributions are averaged uniformly under DP (sample-count weights would change "
                "the sensitivity the accountant assumes); the method's sample-count weights (method.weighting=samples, "
                "or BAFFLE's, which always weighs by samples) are not used",
                PrivacyWarning,
                stacklevel=2,
            )
        strategy = DifferentialPrivacy(
            strategy, privacy, population=population, clients_per_round=clients_per_round, seed=seed
        )
        program = PrivateClient(program, privacy)
        weighted = False
    return secure(strategy, program, options, seed=seed, weighted=weighted, draws=draws)
