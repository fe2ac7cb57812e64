"""ε for DP-FedAvg and DP-FTRL from ``dp-accounting`` (RDP or PLD): :func:`dp_event` describes a
run, :func:`epsilon` accounts it under the neighbouring relation the event needs. Design notes: docs/decisions.md#differential-privacy.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation as NeighborRel
from dp_accounting.rdp import rdp_privacy_accountant

from fedge.core.errors import ConfigError
from fedge.privacy.dp.config import PrivacyConfig

__all__ = [
    "Accounted",
    "dp_event",
    "epsilon",
    "max_rounds",
    "rounds_per_pass",
    "tree_depth",
    "tree_steps",
]


@dataclass(frozen=True)
class Accounted:
    """A DP event and the neighbouring relation it is accounted under."""

    event: dpa.DpEvent
    relation: NeighborRel


def _check_population(population: int, clients_per_round: int) -> None:
    if not isinstance(population, int) or population < 1:
        raise ConfigError(
            f"population must be an int >= 1 (the number of clients), got {population!r}"
        )
    if not isinstance(clients_per_round, int) or not 1 <= clients_per_round <= population:
        raise ConfigError(
            f"clients per round must be an int in [1, population={population}], got {clients_per_round!r}; "
            "lower clients per round or raise the population"
        )


def rounds_per_pass(population: int, clients_per_round: int) -> int:
    """R = ⌊N/m⌋: full rounds in one shuffled pass (the last N mod m clients wait a pass)."""
    _check_population(population, clients_per_round)
    return population // clients_per_round


def tree_steps(
    rounds: int,
    *,
    population: int,
    clients_per_round: int,
    restart_rounds: int | None,
    skipped: Collection[int] = (),
) -> list[list[int]]:
    """Steps (leaves) of each tree, grouped by pass: trees restart at each pass boundary and every
    ``restart_rounds`` rounds within a pass. E.g. R = 5, restart 2, T = 7 → [[2, 2, 1], [2]].

    A round in ``skipped`` released nothing, so its tree has one leaf fewer; a tree, or a pass,
    left with none drops out. E.g. the same with rounds 3 and 4 skipped → [[2, 1], [2]]."""
    r = rounds_per_pass(population, clients_per_round)
    k = r if restart_rounds is None else min(restart_rounds, r)
    passes = []
    for start in range(0, rounds, r):
        n = min(r, rounds - start)
        passes.append([k] * (n // k) + ([n % k] if n % k else []))
    gone = {s for s in skipped if 1 <= s <= rounds}
    if not gone:
        return passes
    for s in gone:
        p, i = divmod(s - 1, r)
        passes[p][i // k] -= 1
    return [kept for kept in ([n for n in g if n] for g in passes) if kept]


def tree_depth(steps: int) -> int:
    """⌈log₂(steps+1)⌉: tree levels one leaf of a ``steps``-leaf tree can touch (dp-accounting's)."""
    return math.ceil(math.log2(steps + 1))


def dp_event(
    cfg: PrivacyConfig,
    *,
    rounds: int,
    population: int,
    clients_per_round: int,
    skipped: Collection[int] = (),
) -> Accounted:
    """The DP event of rounds 1..``rounds`` of ``cfg``'s mechanism, those in ``skipped``
    releasing nothing (see the module docstring)."""
    if not cfg.enabled:
        raise ConfigError(
            "privacy.mechanism=none has no DP event; set privacy.mechanism=gaussian or tree"
        )
    if not isinstance(rounds, int) or rounds < 0:
        raise ConfigError(f"rounds must be an int >= 0, got {rounds!r}")
    _check_population(population, clients_per_round)
    z, m, n = cfg.noise_multiplier, clients_per_round, population
    gone = {s for s in skipped if 1 <= s <= rounds}
    releases = rounds - len(gone)
    if releases == 0:
        return Accounted(dpa.NoOpDpEvent(), NeighborRel.ADD_OR_REMOVE_ONE)
    if z == 0 or math.isinf(cfg.clip):
        return Accounted(dpa.NonPrivateDpEvent(), NeighborRel.ADD_OR_REMOVE_ONE)
    if cfg.mechanism == "gaussian":
        if cfg.sampling == "poisson":
            ev = dpa.PoissonSampledDpEvent(m / n, dpa.GaussianDpEvent(z))
            return Accounted(dpa.SelfComposedDpEvent(ev, releases), NeighborRel.ADD_OR_REMOVE_ONE)
        if cfg.sampling == "fixed":
            ev = dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(z / 2))
            return Accounted(dpa.SelfComposedDpEvent(ev, releases), NeighborRel.REPLACE_ONE)
        passes = len(
            tree_steps(rounds, population=n, clients_per_round=m, restart_rounds=None, skipped=gone)
        )
        return Accounted(
            dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), passes), NeighborRel.REPLACE_SPECIAL
        )
    groups = tree_steps(
        rounds,
        population=n,
        clients_per_round=m,
        restart_rounds=cfg.tree_restart_rounds,
        skipped=gone,
    )
    if cfg.accountant == "pld":
        events = [dpa.GaussianDpEvent(z / math.sqrt(tree_depth(max(g)))) for g in groups]
    else:
        events = [
            dpa.SingleEpochTreeAggregationDpEvent(z, g if len(g) > 1 else g[0]) for g in groups
        ]
    # equal passes compose as one SelfComposed event (keeps the ledger short for long runs)
    parts: list[dpa.DpEvent] = []
    for ev in events:
        if parts and isinstance(parts[-1], dpa.SelfComposedDpEvent) and parts[-1].event == ev:
            parts[-1] = dpa.SelfComposedDpEvent(ev, parts[-1].count + 1)
        else:
            parts.append(dpa.SelfComposedDpEvent(ev, 1))
    event = parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)
    return Accounted(event, NeighborRel.REPLACE_SPECIAL)


def epsilon(
    cfg: PrivacyConfig,
    *,
    rounds: int,
    population: int,
    clients_per_round: int,
    skipped: Collection[int] = (),
) -> float:
    """ε at ``cfg.delta`` after rounds 1..``rounds``, those in ``skipped`` releasing nothing,
    from ``cfg.accountant`` (inf without noise)."""
    acc = dp_event(
        cfg,
        rounds=rounds,
        population=population,
        clients_per_round=clients_per_round,
        skipped=skipped,
    )
    if isinstance(acc.event, dpa.NoOpDpEvent):
        return 0.0
    if isinstance(acc.event, dpa.NonPrivateDpEvent):
        return math.inf
    if cfg.accountant == "rdp":
        accountant: dpa.PrivacyAccountant = rdp_privacy_accountant.RdpAccountant(
            neighboring_relation=acc.relation
        )
    else:
        accountant = pld_privacy_accountant.PLDAccountant(neighboring_relation=acc.relation)
    accountant.compose(acc.event)
    return float(accountant.get_epsilon(cfg.delta))


def max_rounds(
    cfg: PrivacyConfig,
    target_epsilon: float,
    *,
    population: int,
    clients_per_round: int,
    limit: int = 10**7,
) -> int:
    """The most rounds whose ε stays <= ``target_epsilon`` (ε grows with rounds; bisection)."""

    def ok(t: int) -> bool:
        return (
            epsilon(cfg, rounds=t, population=population, clients_per_round=clients_per_round)
            <= target_epsilon
        )

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi < limit and ok(hi):
        lo, hi = hi, min(2 * hi, limit)
    if hi == limit and ok(hi):
        return limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
