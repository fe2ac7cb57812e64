"""Membership inference against a run: the run re-run from its config for the models it
released or broadcast, the clients it trained on, and shadow models trained the same way.

:func:`membership_attacks` attacks the final (released) model, :func:`membership_by_round`
the global model after each listed round (what every method broadcasts, so an
honest-but-curious holder of the broadcasts can attack it); both with the loss threshold and,
with shadows, Shokri et al.'s shadow-model attack and offline LiRA
(:mod:`fedge.attacks.membership`). Members are samples of the clients a round aggregated (the
engine's ``first_aggregated`` record, :func:`trained_by`): a client the run never sampled, or
lost, holds samples the model never saw. Non-members and the attacker's own data (shadow
training, a withheld classifier's completion) come from the test split, disjoint from both.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from fedge.core.config import RunConfig
from fedge.core.errors import ConfigError
from fedge.core.rng import generator
from fedge.experiment.build import BuiltRun, build_run

__all__ = [
    "Replay",
    "attack_name",
    "example_rounds",
    "membership_attacks",
    "membership_by_round",
    "replay",
    "round_models",
    "shadow_models",
    "trained_by",
    "trained_clients",
]


@dataclass(frozen=True)
class Replay:
    """A run re-run from its own config (same seed, same data, so the same rounds): the global
    model after each kept round, and for each client the first completed round that aggregated
    its reply (the engine's ``first_aggregated`` record,
    :meth:`~fedge.runtime.engine.Simulation._record_aggregated`; a skipped round counts no one)."""

    models: dict[int, torch.nn.Module]
    first_aggregated: dict[int, int]

    def trained_by(self, rnd: int) -> list[int]:
        """The clients aggregated in at least one completed round ``<= rnd``: those whose
        samples the global model after round ``rnd`` was trained on."""
        return trained_by(self.first_aggregated, rnd)


def trained_by(first_aggregated: Mapping[Any, int], rnd: int) -> list[int]:
    """The clients of a ``first_aggregated`` record (client id -> first round that aggregated
    it; the run summary's, with string keys, or a :class:`Replay`'s) aggregated by round ``rnd``."""
    return sorted(int(c) for c, r in first_aggregated.items() if r <= rnd)


def trained_clients(
    built: BuiltRun,
    summary: Mapping[str, Any],
    before_replay: Callable[[], None] | None = None,
) -> list[int]:
    """The clients whose samples the run's final model trained on: the run's own record
    (``first_aggregated`` in its summary), else — a run written before fedge recorded it — the
    run's rounds re-run from its config (same seed and data, so the same clients; a Flower
    deployment's node failures are not replayed; ``before_replay`` is called first). Trains
    ``built``'s strategy in that case."""
    last = built.config.rounds
    if "first_aggregated" in summary:
        return trained_by(summary["first_aggregated"], last)
    if before_replay is not None:
        before_replay()
    return replay(built, [last]).trained_by(last)


def attack_name(shadows: int, *, withheld: bool = False, by_round: bool = False) -> str:
    """What a membership result measured: the loss threshold, with ``shadows`` the shadow-model
    attack and offline LiRA; on a completed model when the run ``withheld`` its classifier; or
    against the global model after each round (``by_round``)."""
    if by_round:
        what = "loss threshold (Yeom et al. 2018)" + (
            ", shadow models (Shokri et al. 2017), offline LiRA (Carlini et al. 2022)"
            if shadows
            else ""
        )
        return f"{what}, against the global model broadcast after each round (the run re-run from its config)"
    if shadows:
        return "loss threshold (Yeom et al. 2018), shadow models (Shokri et al. 2017), offline LiRA (Carlini et al. 2022)"
    what = "loss-threshold (Yeom et al. 2018)"
    if withheld:
        what += (
            ", on the released layers completed with a classifier the attacker trains on its own data "
            "(the run kept its last layer in the enclaves)"
        )
    return what


def _run_rounds(built: BuiltRun, rounds: int) -> torch.nn.Module:
    return _replay(built, [rounds]).models[rounds]


def _replay(built: BuiltRun, keep: list[int]) -> Replay:
    """Run rounds 1..max(``keep``) and keep a copy of the global model after each round in
    ``keep``: the model the server broadcasts at the start of the next round (and, after the
    last round, the released one); with the engine's record of who each round aggregated."""
    want = set(keep)
    out: dict[int, torch.nn.Module] = {}
    sim = built.simulation()
    try:
        for t in range(1, max(want) + 1):
            sim.run_round(t)
            if t in want:
                out[t] = copy.deepcopy(sim.strategy.eval_model())
    finally:
        sim.close()
    first = sim.record.extra.get("first_aggregated", {})
    return Replay(out, {int(c): r for c, r in first.items()})


def example_rounds(last: int) -> str:
    """An example ``--rounds`` value for a run of ``last`` rounds, made of its own rounds:
    the first, the middle and the last (``1,5,10`` for 10; ``1`` for a 1-round run)."""
    return ",".join(str(r) for r in sorted({1, (last + 1) // 2, last}))


def replay(built: BuiltRun, rounds: list[int]) -> Replay:
    """The intermediate global models a holder of the broadcasts sees: the run re-run from its
    own config (same seed, same data, so the same models) with the global model copied after
    each round in ``rounds`` (every method broadcasts it to the next round's clients), and
    whose replies each round aggregated. Trains ``built``'s own strategy: pass a fresh build."""
    bad = [r for r in rounds if not 1 <= r <= built.config.rounds]
    if not rounds or bad:
        raise ConfigError(
            f"rounds {bad or rounds} are not rounds of this run; expected round numbers in 1..{built.config.rounds}, "
            f"e.g. --rounds {example_rounds(built.config.rounds)}"
        )
    return _replay(built, sorted(set(rounds)))


def round_models(built: BuiltRun, rounds: list[int]) -> dict[int, torch.nn.Module]:
    """:func:`replay`'s models: the global model after each round in ``rounds``."""
    return replay(built, rounds).models


def shadow_models(
    cfg: RunConfig,
    aux: tuple[torch.Tensor, torch.Tensor],
    *,
    train_size: int,
    shadows: int,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> list[
    tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
]:
    """Shadow models trained the way the target was — the run's own method, config and number
    of rounds, with a different run seed — on a random half of the attacker's data ``aux``
    (at most ``train_size`` samples, split IID over the run's clients in their proportions);
    each comes with its training set and an equally large held-out set of ``aux``."""
    return [
        (ms[cfg.rounds], inside, outside)
        for ms, inside, outside in _shadow_runs(
            cfg,
            aux,
            train_size=train_size,
            shadows=shadows,
            seed=seed,
            keep=[cfg.rounds],
            progress=progress,
        )
    ]


def _shadow_runs(
    cfg: RunConfig,
    aux: tuple[torch.Tensor, torch.Tensor],
    *,
    train_size: int,
    shadows: int,
    seed: int,
    keep: list[int],
    progress: Callable[[int, int], None] | None = None,
) -> list[
    tuple[
        dict[int, torch.nn.Module],
        tuple[torch.Tensor, torch.Tensor],
        tuple[torch.Tensor, torch.Tensor],
    ]
]:
    """:func:`shadow_models`, each shadow's global model kept after every round in ``keep``. A
    shadow's training set is the samples of its clients aggregated by round ``min(keep)``
    (:meth:`Replay.trained_by`; all of them when every client takes part), the held-out set as
    large: when the run samples clients, the others never trained on theirs."""
    from fedge.core.context import ClientData  # noqa: PLC0415

    x, y = aux
    n = min(train_size, len(y) // 2)
    if n < 2:
        raise ConfigError(
            f"shadow models need auxiliary data: got {len(y)} samples; raise dataset.limit_test"
        )
    out = []
    for i in range(shadows):
        g = generator(seed, "shadow", i)
        perm = torch.randperm(len(y), generator=g)
        inside, outside = perm[:n], perm[n : 2 * n]
        built = build_run(cfg.model_copy(update={"seed": cfg.seed + 1_000_003 * (i + 1)}))
        sizes = torch.tensor([c.num_samples for c in built.clients], dtype=torch.float64)
        bounds = (sizes.cumsum(0) / sizes.sum() * n).round().long().tolist()
        parts = [inside[a:b] for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]
        built = replace(
            built, clients=[ClientData(x, y, p if len(p) else inside[:1]) for p in parts]
        )
        rep = _replay(built, keep)
        trained = rep.trained_by(min(keep))
        if len(trained) < len(
            parts
        ):  # some shadow client never trained (else: inside as drawn, as ever)
            inside = (
                torch.cat([built.clients[c].indices for c in trained]).unique()
                if trained
                else inside[:0]
            )
            outside = outside[: len(inside)]
        out.append((rep.models, (x[inside], y[inside]), (x[outside], y[outside])))
        if progress is not None:
            progress(i + 1, shadows)
    return out


def _mia_split(
    built: BuiltRun,
    samples: int,
    seed: int,
    trained: Collection[int] | None = None,
    *,
    when: str = "in any round",
    fix: str = "",
) -> tuple[Any, Any, torch.Tensor, int]:
    """(members, non-members, the attacker's own test indices, number of training samples).

    Members: ``samples`` of the training samples of the clients in ``trained`` (None: every
    client), a uniform draw from their indices concatenated in client order; non-members:
    ``samples`` test samples. With every client in ``trained`` the draws are those of every
    client's samples. A ConfigError, naming ``when`` the clients were aggregated and the ways
    out (``fix`` first), if ``trained``'s clients hold fewer than ``min(samples, all training
    samples)``: fewer members than asked only because some clients never trained."""
    ds = built.dataset
    n_train = sum(len(c.indices) for c in built.clients)
    chosen = built.clients if trained is None else [built.clients[c] for c in sorted(set(trained))]
    idx = torch.cat([c.indices for c in chosen]) if chosen else torch.zeros(0, dtype=torch.long)
    if len(idx) < min(samples, n_train):
        c = built.config.clients
        raise ConfigError(
            f"membership inference draws samples={samples} members from the clients whose samples the model trained "
            f"on, but the {len(chosen)} of {c.num} clients aggregated {when} hold {len(idx)} samples (clients.per_round="
            f"{c.per_round}{f', clients.dropout={c.dropout:g}' if c.dropout else ''}: the others never trained); "
            f"lower samples (--samples) to at most {len(idx)}{fix}, or run with clients.per_round={c.num}"
        )
    g = generator(seed, "attack", "mia")
    members = idx[torch.randperm(len(idx), generator=g)[:samples]]
    test = torch.randperm(len(ds.y_test), generator=g)
    non, rest = test[:samples], test[samples:]
    return (
        (ds.x_train[members], ds.y_train[members]),
        (ds.x_test[non], ds.y_test[non]),
        rest,
        n_train,
    )


def membership_attacks(
    built: BuiltRun,
    model: torch.nn.Module,
    *,
    samples: int,
    shadows: int = 0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    withheld: tuple[str, ...] = (),
    trained: Collection[int] | None = None,
) -> dict[str, Any]:
    """The loss-threshold attack and, with ``shadows`` > 0, Shokri et al.'s shadow-model attack
    and offline LiRA, on ``model``, the run's final model: ``samples`` of the training samples
    it was trained on (members) vs ``samples`` test samples (non-members); the rest of the test
    split is the attacker's own data for the shadow models (disjoint from both).

    Members come only from clients aggregated in at least one round of the run (``trained``;
    None: found by re-running the run from its config, :func:`replay`, which costs one run's
    training: pass :meth:`Replay.trained_by` when you hold a replay). When the run samples
    clients (``clients.per_round`` < ``clients.num``), drops them (``clients.dropout``), skips
    rounds (``clients.min_replies``) or its method leaves some out (secure aggregation's
    survivors, EPPFL's lost uploads, PPFL's clients whose enclave no stage fits), a client never
    aggregated holds samples the model never saw; counting them as members would pull every
    figure towards chance. When every client is aggregated the members are those of every
    client, the same draws as ever. Too few such samples for ``samples`` is a ConfigError. The
    replay is the engine's: a run whose clients failed for real (Flower nodes) or that drew its
    clients from the OS CSPRNG (``privacy.secure_noise``) is not reproduced by it; pass
    ``trained`` from the run's own record there.

    ``withheld``: the model's classifier tensors the attacker does not hold (PPFL's
    ``keep_last_in_tee``): the attacker completes the model with a classifier of its own,
    trained atop the released layers on its own data (the same rest of the test split;
    :func:`~fedge.attacks.completion.complete_classifier`), and the loss-threshold attack runs
    on the completed model. Shadow attacks are not run on such a model (a ConfigError)."""
    from fedge.attacks.membership import lira_offline, loss_threshold_attack, shadow_attack  # noqa: PLC0415

    ds = built.dataset
    if trained is None:  # a fresh build: ``built``'s own strategy may have trained already
        fresh = replace(build_run(built.config), clients=built.clients)
        trained = _replay(fresh, [built.config.rounds]).trained_by(built.config.rounds)
    m, nm, rest, n_train = _mia_split(built, samples, seed, trained)
    out: dict[str, Any] = {"method": built.config.method.name, "chance_auc": 0.5}
    if withheld:
        if shadows:
            raise ConfigError(
                "the run kept its last layer in the enclaves (PPFL's method.keep_last_in_tee): shadow "
                "attacks on the attacker's completed model are not built; run --attack mia"
            )
        from fedge.attacks.completion import complete_classifier  # noqa: PLC0415

        model = complete_classifier(
            model, (ds.x_test[rest], ds.y_test[rest]), generator=generator(seed, "attack", "head")
        )
        with torch.no_grad():
            acc = {
                k: float((model(x).argmax(-1) == y).double().mean())
                for k, (x, y) in (("members", m), ("non_members", nm))
            }
        out["completed"] = {"withheld": list(withheld), "aux_samples": len(rest), "accuracy": acc}
    out["loss"] = loss_threshold_attack(model, m, nm).__dict__
    if shadows:
        sh = shadow_models(
            built.config,
            (ds.x_test[rest], ds.y_test[rest]),
            train_size=n_train,
            shadows=shadows,
            seed=seed,
            progress=progress,
        )
        out["shadows"] = shadows
        out["shadow_train_size"] = len(sh[0][1][1])
        out["shadow"] = shadow_attack(model, sh, m, nm).__dict__
        out["lira"] = lira_offline(model, [s[0] for s in sh], m, nm).__dict__
    return out


def membership_by_round(
    built: BuiltRun,
    rounds: list[int],
    *,
    samples: int,
    shadows: int = 0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """:func:`membership_attacks` against the global model after each round in ``rounds``
    (:func:`replay`): the same members and non-members for every round; with ``shadows``, the
    shadow models' own round-r models for round r (trained the same way for the same number of
    rounds). Per round: the attacks' results, the model's test accuracy and its accuracy on the
    members (``train_accuracy``). Trains ``built``'s own strategy: pass a fresh build.

    Members are drawn once, from the clients aggregated by the *earliest* round in ``rounds``
    (:meth:`Replay.trained_by`): every reported model was trained on each of them, so a
    change across rounds is the model's, not the member set's. (A set per round, from the
    clients aggregated by that round, would be larger late in the run but would compare
    different samples round to round; the union over the run would count, at early rounds,
    samples of clients not yet sampled, as if trained on.) With every client in every round
    that is every client, the same draws as ever. When the run samples clients and those
    aggregated by the earliest round hold fewer than ``samples`` samples (and fewer than all
    training samples), a ConfigError names the ways out: fewer samples, a later first round, or
    ``clients.per_round`` = ``clients.num``. The shadow runs' training sets follow the same rule."""
    from fedge.attacks.membership import lira_offline, loss_threshold_attack, shadow_attack  # noqa: PLC0415

    ds = built.dataset
    keep = sorted(set(rounds))
    rep = replay(built, keep)
    targets, first = rep.models, keep[0]
    m, nm, rest, n_train = _mia_split(
        built,
        samples,
        seed,
        rep.trained_by(first),
        when=f"by round {first}",
        fix=f", report from a later first round than {first} (--rounds)",
    )
    sh = (
        _shadow_runs(
            built.config,
            (ds.x_test[rest], ds.y_test[rest]),
            train_size=n_train,
            shadows=shadows,
            seed=seed,
            keep=keep,
            progress=progress,
        )
        if shadows
        else []
    )
    per: dict[str, Any] = {}
    for r in keep:
        model = targets[r]
        model.eval()
        with torch.no_grad():
            acc = float((model(ds.x_test).argmax(-1) == ds.y_test).double().mean())
            fit = float((model(m[0]).argmax(-1) == m[1]).double().mean())
        row: dict[str, Any] = {
            "test_accuracy": acc,
            "train_accuracy": fit,
            "loss": loss_threshold_attack(model, m, nm).__dict__,
        }
        if sh:
            row["shadow"] = shadow_attack(model, [(ms[r], i, o) for ms, i, o in sh], m, nm).__dict__
            row["lira"] = lira_offline(model, [ms[r] for ms, _, _ in sh], m, nm).__dict__
        per[str(r)] = row
    out: dict[str, Any] = {"method": built.config.method.name, "chance_auc": 0.5, "rounds": per}
    if shadows:
        out["shadows"] = shadows
        out["shadow_train_size"] = len(sh[0][1][1])
    return out
