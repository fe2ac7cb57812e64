"""The in-process federated simulation engine: :class:`Simulation` samples clients, drives each
round's exchanges through a client executor with every message really serialized, meters every
party on its own account, evaluates, logs one metrics line and checkpoints. Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedge.core.context import ClientData, PartyContext, decode_state, encode_state
from fedge.core.errors import ConfigError, MessageError, ResumeError, ShortRoundError
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.core.protocols import ClientProgram, PartyCall, PartySpec, Savepoint, Strategy
from fedge.core.rng import Draws, generator
from fedge.runtime.evaluate import evaluate
from fedge.runtime.executor import (
    SHARED,
    ClientExecutor,
    ClientStates,
    ExchangeOutcome,
    StepSettings,
    local_executor,
)
from fedge.runtime.fairness import PER_CLIENT_KEY, client_accuracies, fairness_stats
from fedge.runtime.fleet import ClientTime, MiB, RoundClock, client_time, cut_exchange
from fedge.runtime.round import (
    RoundRecord,
    RoundTotals,
    check_failures,
    decode_replies,
    drive_round,
    metrics_line,
)

__all__ = [
    "DeviceMemoryWarning",
    "EngineConfig",
    "RoundRecord",
    "Simulation",
    "decode_state",
    "drops_out",
    "encode_state",
    "sample_clients",
]


@dataclass(frozen=True)
class EngineConfig:
    seed: int
    rounds: int
    per_round: int
    eval_every: int = 1
    eval_batch_size: int = 1000
    # evaluate the global model on each client's local test split every N rounds (and after
    # the last); None: on the test evaluation's rounds (eval_every). Needs Simulation.local_tests
    local_eval_every: int | None = None
    workers: int = 0
    measure_flops: bool = True
    measure_memory: bool = False
    dropout: float = 0.0
    min_replies: int | None = None
    draws: Draws = "torch"  # the run's seeded-draw generator (what the Flower handshake checks)
    # the time model (clients.profiles' gflops and links; fedge.runtime.fleet): simulated time
    # logged per round; an exchange's deadline (simulated s); and, under over-selection, the
    # replies the first exchange keeps (the first to arrive; per_round is then the sampled count)
    time_model: bool = False
    deadline_s: float | None = None
    keep_first: int | None = None
    #: where client steps run (their batches, their CUDA peak memory) and evaluation's batches go
    #: (RunConfig.device, resolved: fedge.core.device.resolve_device)
    device: torch.device = torch.device("cpu")

    def step_settings(self, parties: Mapping[str, PartySpec]) -> StepSettings:
        """What every client step is given besides its task, under this config."""
        return StepSettings(
            self.seed, self.measure_flops, self.measure_memory, dict(parties), self.device
        )


class DeviceMemoryWarning(UserWarning):
    """A client step measured a larger memory peak than its device profile's ``memory_mb``."""


def sample_clients(
    seed: int, rnd: int, num_clients: int, per_round: int, eligible: Sequence[int] | None = None
) -> list[int]:
    """The sorted ids of the ``per_round`` clients taking part in round ``rnd``, a uniformly
    random subset of ``eligible`` (default: every client) drawn from the generator
    (seed, "sample", round).

    Floyd's algorithm (Bentley & Floyd, "A sample of brilliance", CACM 1987): k draws give a
    uniform k-subset of n, so a round costs O(per_round) whatever the population (no
    permutation of a million ids): for j = n−k .. n−1, draw t uniform in [0, j] and take t,
    or j if t was already taken.
    """
    n = num_clients if eligible is None else len(eligible)
    if per_round >= n:
        return list(range(num_clients)) if eligible is None else sorted(eligible)
    u = torch.rand(
        per_round, generator=generator(seed, "sample", rnd), dtype=torch.float64
    ).tolist()
    chosen: set[int] = set()
    for j, uj in zip(range(n - per_round, n), u, strict=True):
        t = min(int(uj * (j + 1)), j)
        chosen.add(j if t in chosen else t)
    picked = chosen if eligible is None else {eligible[i] for i in chosen}
    return sorted(picked)


def drops_out(seed: int, p: float, rnd: int, phase: int, cid: int) -> bool:
    """Whether client ``cid`` drops out before replying to exchange ``phase`` (0-based) of round
    ``rnd`` under ``clients.dropout = p``: a uniform draw from the generator (seed, "dropout",
    round, exchange, client) below ``p``, so a run loses the same clients whatever the runtime."""
    if p <= 0:
        return False
    return (
        float(
            torch.rand(
                1, generator=generator(seed, "dropout", rnd, phase, cid), dtype=torch.float64
            )
        )
        < p
    )


class Simulation:
    """Runs a Strategy, a ClientProgram and the side parties over a population of clients.

    Args:
        strategy: the server side.
        program: the client side (stateless; per-client state lives in the engine).
        clients: one :class:`ClientData` per client id.
        test: (x, y) test tensors for evaluation.
        validation: (x, y) held out from the training data, evaluated like the test set every
            evaluation round (``val_accuracy``, ``val_loss``); the record keeps the test
            accuracy at the round of best validation accuracy, the figure to report when
            choices were tuned on validation.
        local_tests: per client, its local test split (x, y), or None for a client without
            one: the global model is evaluated on each every ``config.local_eval_every``
            rounds, and the line carries the per-client accuracies and q-FFL's four
            statistics of them (:mod:`fedge.runtime.fairness`).
        config: :class:`EngineConfig`.
        parties: side parties by name (:class:`~fedge.core.protocols.PartySpec`).
        profiles: one device profile per client (``clients.profiles``), offered to
            ``strategy.eligible_client(cid, profile)`` before sampling; None: every client is eligible.
        executor: what runs the client steps (:class:`~fedge.runtime.executor.ClientExecutor`);
            default: this process, or ``config.workers`` forked worker processes.
        on_round: called after each completed round with (metrics dict, engine); the run
            writer uses it to append metrics and checkpoint.
        on_progress: called as clients finish within a round with (round, exchange,
            clients done, clients in the exchange), for progress displays.
        on_savepoint: called at each :class:`~fedge.core.protocols.Savepoint` a round reaches,
            with (engine, round, savepoint); :meth:`state_dict` then holds the part of the round
            done, from which :meth:`run` after :meth:`load_state_dict` continues the round. The
            run writer checkpoints there. None: savepoints are passed over.
    """

    def __init__(
        self,
        *,
        strategy: Strategy,
        program: ClientProgram,
        clients: Sequence[ClientData],
        test: tuple[torch.Tensor, torch.Tensor],
        num_classes: int,
        config: EngineConfig,
        parties: Mapping[str, PartySpec] | None = None,
        profiles: Sequence[Mapping[str, Any]] | None = None,
        validation: tuple[torch.Tensor, torch.Tensor] | None = None,
        local_tests: Sequence[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
        executor: ClientExecutor | None = None,
        on_round: Callable[[dict[str, Any], Simulation], None] | None = None,
        on_progress: Callable[[int, int, int, int], None] | None = None,
        on_savepoint: Callable[[Simulation, int, Savepoint], None] | None = None,
    ) -> None:
        self.strategy, self.program, self.clients = strategy, program, clients
        self.test, self.num_classes, self.cfg = test, num_classes, config
        self.parties = dict(parties or {})
        for name, spec in self.parties.items():
            if name != spec.name:
                raise ConfigError(
                    f"side party registered as {name!r} is named {spec.name!r}; use one name"
                )
        if profiles is not None and len(profiles) != len(clients):
            raise ConfigError(
                f"got {len(profiles)} device profiles for {len(clients)} clients; give one per client"
            )
        self.profiles = profiles
        self.validation = validation
        if local_tests is not None and len(local_tests) != len(clients):
            raise ConfigError(
                f"got {len(local_tests)} local test splits for {len(clients)} clients; give one "
                "per client (None for a client without one)"
            )
        self.local_tests = local_tests
        self.on_round, self.on_progress = on_round, on_progress
        self.on_savepoint = on_savepoint
        # the round so far, while on_savepoint runs; a checkpointed part of a round, to go on from
        self._partial: dict[str, Any] | None = None
        self._continue: dict[str, Any] | None = None
        self.executor = executor or local_executor(
            program, clients, config.step_settings(self.parties), config.workers
        )
        if config.time_model and profiles is None:
            raise ConfigError(
                "EngineConfig.time_model=True needs a device profile per client (profiles=...)"
            )
        self.states = ClientStates(self.parties)
        self.record = RoundRecord()
        self._clock = RoundClock()
        self._memory_warned: set[str] = set()

    @property
    def client_states(self) -> dict[int, bytes]:
        """Each client's persistent state (encoded), by client id."""
        return self.states.client

    @property
    def party_states(self) -> dict[str, dict[int, bytes]]:
        """Each side party's states (encoded), by party name and key (client id, or SHARED)."""
        return self.states.party

    # -- checkpointing -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self.executor.collect_states(
            self.states, self.record.round, strict=self.cfg.min_replies is None
        )
        r = self.record
        partial = {} if self._partial is None else {"partial": self._partial}
        return {
            **partial,
            "strategy": self.strategy.state_dict(),
            "client_states": dict(self.states.client),
            "party_states": {k: dict(v) for k, v in self.states.party.items()},
            "record": {
                "round": r.round,
                "cum_bytes_down": r.cum_bytes_down,
                "cum_bytes_up": r.cum_bytes_up,
                "cum_client_flops": r.cum_client_flops,
                "best_test_accuracy": r.best_test_accuracy,
                "last_test_accuracy": r.last_test_accuracy,
                "extra": dict(r.extra),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.strategy.load_state_dict(state["strategy"])
        self.states.client = dict(state["client_states"])
        saved = state.get("party_states", {})
        self.states.party = {name: dict(saved.get(name, {})) for name in self.parties}
        self.record = RoundRecord(**state["record"])
        # a checkpoint taken at a savepoint of round record.round + 1: that round goes on from it
        self._continue = state.get("partial")
        self.executor.restore_states(self.states)

    # -- running -----------------------------------------------------------------
    def sample(self, rnd: int) -> list[int]:
        """The clients of round ``rnd``: the strategy's own draw if it makes one, else
        ``per_round`` of those it finds eligible."""
        own = self.strategy.select_clients(rnd, len(self.clients), self.cfg.per_round)
        if own is not None:
            return sorted(own)
        eligible = None
        if self.profiles is not None:
            eligible = [
                c for c, p in enumerate(self.profiles) if self.strategy.eligible_client(c, p)
            ]
            if not eligible:
                raise ConfigError(
                    f"round {rnd}: no client's device profile is eligible for this method; "
                    "check clients.profiles against the method's requirements"
                )
        return sample_clients(self.cfg.seed, rnd, len(self.clients), self.cfg.per_round, eligible)

    def run_round(self, rnd: int) -> dict[str, Any]:
        """Sample, drive the strategy's round, account, evaluate: round ``rnd``'s metrics line.
        After :meth:`load_state_dict` of a checkpoint taken at a savepoint of round ``rnd``, the
        round goes on from there, with the clients, counters and time of its part done."""
        t0 = time.perf_counter()
        cfg = self.cfg
        ids = self.sample(rnd)
        cont, self._continue = self._continue, None
        if cont is not None and int(cont["round"]) != rnd:
            cont = None
        if cont is None:
            totals = RoundTotals(transport=dict.fromkeys(self.executor.metric_keys, 0))
            self._clock = RoundClock()
        else:
            if list(cont["ids"]) != ids:
                raise ResumeError(
                    f"round {rnd} was checkpointed inside the round with clients {list(cont['ids'])[:10]}, but "
                    f"it samples {ids[:10]} now: the run's config or data changed since; start the run anew "
                    "into another --out"
                )
            totals = RoundTotals.from_state(cont["totals"])
            self._clock = RoundClock.from_state(cont["clock"])
            t0 -= float(cont["wall_s"])
        aggregate = self._play(rnd, ids, totals, t0, cont)
        self.record.add(rnd, totals)
        if cfg.time_model:
            total = self.record.extra.get("sim_time_total_s", 0.0) + self._clock.duration_s
            self.record.extra["sim_time_total_s"] = total
            aggregate = {
                "sim_time_s": self._clock.duration_s,
                "sim_time_total_s": total,
                **({"clients_straggled": len(self._clock.stragglers)} if self._cuts() else {}),
                **aggregate,
            }
        line = metrics_line(
            rnd,
            len(ids),
            totals,
            self.record,
            figures=self._evaluate_round(rnd),
            aggregate=aggregate,
            failed=len(totals.failed) if cfg.min_replies is not None else None,
            parties=bool(self.parties),
            memory=cfg.measure_memory,
            flops=cfg.measure_flops,
            more=self.strategy.round_metrics,
        )
        if cfg.time_model:
            line["sim_clients"] = self._clock.per_client()
        line["wall_s"] = time.perf_counter() - t0
        return line

    def _cuts(self) -> bool:
        """Whether exchanges may drop stragglers (a deadline, or over-selection)."""
        return self.cfg.deadline_s is not None or self.cfg.keep_first is not None

    def _play(
        self,
        rnd: int,
        ids: list[int],
        totals: RoundTotals,
        t0: float,
        cont: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """Drive the strategy's round ``rnd`` over ``ids`` (begun at ``t0``; ``cont``: the part
        done, checkpointed at a savepoint): what it returned. Under ``min_replies`` a round too
        short to complete is skipped: the strategy's state is put back as before the round (then
        told, :meth:`Strategy.round_skipped`), and the round returns ``{"round_skipped": 1}``.
        Round states never outlive the round."""
        self.states.round.clear()
        # a round too short to complete is skipped under min_replies: the strategy as before it
        if cont is not None:
            before = cont["before"]
        else:
            before = (
                copy.deepcopy(self.strategy.state_dict())
                if self.cfg.min_replies is not None
                else None
            )

        def savepoint(point: Savepoint, index: int) -> None:
            if self.on_savepoint is None:
                return
            if self.states.round:
                raise MessageError(
                    f"round {rnd}: {type(self.strategy).__name__} yielded a Savepoint ({point.phase}) while "
                    f"clients {sorted(self.states.round)[:10]} hold round state, which never goes to disk; "
                    "yield it where no client keeps ctx.round_state"
                )
            self._partial = {
                "round": rnd,
                "ids": list(ids),
                "exchange": index,
                "totals": totals.state_dict(),
                "clock": self._clock.state_dict(),
                "before": before,
                "wall_s": time.perf_counter() - t0,
            }
            try:
                self.on_savepoint(self, rnd, point)
            finally:
                self._partial = None

        steps = self.strategy.round(rnd, ids)
        try:
            driven = drive_round(
                rnd,
                ids,
                steps,
                exchange=lambda phase, messages: self._exchange(rnd, phase, messages, totals),
                call=lambda call: self._server_call(rnd, call, totals),
                savepoint=savepoint,
                first=0 if cont is None else int(cont["exchange"]),
            )
        except ShortRoundError as short:
            if before is None:
                raise
            steps.close()
            self.strategy.load_state_dict(before)
            # e.g. privacy the round spent, which the restore must not undo
            self.strategy.round_skipped(rnd)
            self.record.extra.setdefault("skipped_rounds", {})[str(rnd)] = str(short)
            return {"round_skipped": 1}
        finally:
            self.states.round.clear()  # round secrets never outlive the round
        self._record_aggregated(rnd, driven.replied)
        return driven.value

    def _exchange(
        self, rnd: int, phase: int, messages: dict[int, Message], totals: RoundTotals
    ) -> dict[int, Message]:
        """Send ``messages`` (exchange ``phase`` of round ``rnd``), run the addressed clients
        on the executor, return the decoded replies of those that delivered (all of them,
        unless the strategy takes partial replies)."""
        outgoing, failed = self._address(rnd, phase, messages, totals)
        progress = None
        if self.on_progress is not None:
            on_progress = self.on_progress

            def progress(done: int, total: int) -> None:
                on_progress(rnd, phase, done, total)

        before = self._snapshot([cid for cid, _ in outgoing]) if self._cuts() else None
        outcome = self.executor.run(rnd, phase, outgoing, self.states, progress)
        totals.add_transport(outcome.transport)
        failed.update(outcome.failed)
        if self.profiles is not None:
            self._check_memory(rnd, outcome)
        if self.cfg.time_model:
            # lost now (dropped out, a node failed), not known gone from an earlier exchange
            lost = any(cid not in totals.failed for cid in failed)
            failed.update(self._time_exchange(phase, outgoing, outcome, lost, before))
        if failed:
            totals.fail(failed)
            check_failures(
                rnd,
                phase,
                len(messages),
                len(outcome.results),
                failed,
                min_replies=self.cfg.min_replies,
                partial_replies=self.strategy.partial_replies,
                method=type(self.strategy).__name__,
            )
        totals.received(outcome.results)
        totals.exchanges += 1
        return decode_replies(rnd, outcome.results)

    def _snapshot(self, cids: list[int]) -> dict[int, tuple[Any, ...]]:
        """The states of clients ``cids`` now (bytes: kept as they are), to put back after a
        straggler's step."""
        per_client = [n for n, spec in self.parties.items() if spec.scope == "client"]
        st = self.states
        return {
            c: (st.client.get(c), st.round.get(c), [st.party[n].get(c) for n in per_client])
            for c in cids
        }

    def _restore(self, cid: int, snapshot: tuple[Any, ...]) -> None:
        """Put client ``cid``'s states back as :meth:`_snapshot` saw them: a straggler's step
        is undone, as if it had not run."""
        per_client = [n for n, spec in self.parties.items() if spec.scope == "client"]
        client, rnd_state, party = snapshot
        for store, value in ((self.states.client, client), (self.states.round, rnd_state)):
            if value is None:
                store.pop(cid, None)
            else:
                store[cid] = value
        for name, value in zip(per_client, party, strict=True):
            if value is None:
                self.states.party[name].pop(cid, None)
            else:
                self.states.party[name][cid] = value

    def _time_exchange(
        self,
        phase: int,
        outgoing: list[tuple[int, bytes]],
        outcome: ExchangeOutcome,
        lost: bool,
        before: dict[int, tuple[Any, ...]] | None,
    ) -> dict[int, str]:
        """Time the exchange's client steps on their devices (:mod:`fedge.runtime.fleet`), add
        it to the round's clock, and drop the stragglers (a deadline, over-selection): their
        results leave ``outcome``, their states go back to before the step. Why each
        straggler failed, by client id."""
        assert self.profiles is not None
        down = {cid: len(b) for cid, b in outgoing}
        times: dict[int, ClientTime] = {
            cid: client_time(
                self.profiles[cid],
                flops=r.stats.flops,
                bytes_down=down[cid],
                bytes_up=len(r.reply),
            )
            for cid, r in outcome.results.items()
        }
        cut = cut_exchange(
            {cid: t.total_s for cid, t in times.items()},
            deadline_s=self.cfg.deadline_s,
            keep=self.cfg.keep_first if phase == 0 else None,
            lost=lost,
        )
        self._clock.add(times, cut)
        for cid in cut.stragglers:
            del outcome.results[cid]
            if before is not None:
                self._restore(cid, before[cid])
        return cut.stragglers

    def _check_memory(self, rnd: int, outcome: ExchangeOutcome) -> None:
        """Warn, once per profile, when a client step's measured tensor peak exceeds its
        profile's ``memory_mb``: the device could not have run this method's step."""
        assert self.profiles is not None
        over: dict[str, list[tuple[int, int]]] = {}
        for cid, r in sorted(outcome.results.items()):
            p = self.profiles[cid]
            mb, peak = p.get("memory_mb"), r.stats.tensor_peak_bytes
            if mb is not None and peak is not None and peak > mb * MiB:
                over.setdefault(str(p.get("name")), []).append((cid, peak))
        seen = self.record.extra.setdefault("memory_over", {})
        for name, hits in over.items():
            need = max(b for _, b in hits) / MiB
            mb = self.profiles[hits[0][0]]["memory_mb"]
            seen[name] = {
                "memory_mb": mb,
                "need_mb": max(need, seen.get(name, {}).get("need_mb", 0)),
            }
            if name not in self._memory_warned:
                self._memory_warned.add(name)
                ids = (
                    ("client " if len(hits) == 1 else "clients ")
                    + ", ".join(str(c) for c, _ in hits[:5])
                    + (" ..." if len(hits) > 5 else "")
                )
                warnings.warn(
                    f"round {rnd}: {type(self.strategy).__name__}'s client step needs {need:.3g} MiB "
                    f"(measured tensor peak) on {ids} of device profile {name!r}, which has "
                    f"memory_mb={mb:g}: such a device could not run it. Give that profile more "
                    "memory_mb, or a method or model whose step fits",
                    DeviceMemoryWarning,
                    stacklevel=2,
                )
        if not seen:
            del self.record.extra["memory_over"]

    def _address(
        self, rnd: int, phase: int, messages: dict[int, Message], totals: RoundTotals
    ) -> tuple[list[tuple[int, bytes]], dict[int, str]]:
        """Encode ``messages`` (a broadcast once), counting each one sent: the (client, bytes)
        to run, and why each other client gets no step (it failed earlier this round, or
        drops out now by ``dropout``, after its message was sent)."""
        encoded: dict[int, bytes] = {}  # id(message) -> bytes: a broadcast is encoded once
        outgoing: list[tuple[int, bytes]] = []
        failed: dict[int, str] = {}
        for cid in sorted(messages):
            if cid in totals.failed:  # failed earlier this round: nothing more is sent to it
                failed[cid] = f"failed earlier this round ({totals.failed[cid]})"
                continue
            m = messages[cid]
            b = encoded.get(id(m))
            if b is None:
                b = encoded[id(m)] = m.to_bytes()
            totals.sent(len(b))
            if drops_out(self.cfg.seed, self.cfg.dropout, rnd, phase, cid):
                failed[cid] = f"dropped out (clients.dropout={self.cfg.dropout:g})"
                continue
            outgoing.append((cid, b))
        return outgoing, failed

    def _record_aggregated(self, rnd: int, replied: list[int]) -> None:
        """Note, for each client, the first completed round that aggregated its reply
        (``record.extra["first_aggregated"]``, client id -> round): the clients the strategy
        names (:meth:`~fedge.core.protocols.Strategy.aggregated_clients`: secure aggregation's
        survivors, PPFL's opened uploads, EPPFL's uploads not lost), else those that replied to
        the round's last exchange. A client never sampled, one that dropped out and every client
        of a skipped round are absent: the global model after round r trained on the samples of
        exactly the clients noted at a round <= r (membership inference draws its members there)."""
        own = self.strategy.aggregated_clients()
        first = self.record.extra.setdefault("first_aggregated", {})
        for cid in replied if own is None else own:
            first.setdefault(str(cid), rnd)  # str keys: the record is written as JSON

    def _evaluate_round(self, rnd: int) -> dict[str, Any]:
        """The round's evaluation figures: the global model's and each side model's (prefixed
        with its name) on an evaluation round, else ``test_accuracy`` and ``test_loss`` None."""
        cfg, r = self.cfg, self.record
        figures: dict[str, Any]
        if not (rnd % cfg.eval_every == 0 or rnd == cfg.rounds):
            figures = {"test_accuracy": None, "test_loss": None}
        else:
            figures = self._evaluate(rnd, self.strategy.eval_model())
            r.last_test_accuracy = figures["test_accuracy"]
            r.best_test_accuracy = max(r.best_test_accuracy or 0.0, figures["test_accuracy"])
            for name, model in self.strategy.side_eval_models().items():
                figures.update(self._evaluate(rnd, model, prefix=f"{name}_"))
        every = cfg.local_eval_every or cfg.eval_every
        if self.local_tests is not None and (rnd % every == 0 or rnd == cfg.rounds):
            accs = client_accuracies(
                self.strategy.eval_model(),
                self.local_tests,
                num_classes=self.num_classes,
                batch_size=cfg.eval_batch_size,
            )
            figures.update(fairness_stats(accs))
            figures[PER_CLIENT_KEY] = accs
        return figures

    def _evaluate(self, rnd: int, model: torch.nn.Module, *, prefix: str = "") -> dict[str, Any]:
        """``model``'s test figures (and validation figures, as ``val_*``) under ``prefix``;
        the record keeps, per prefix, the test accuracy at the round of best validation
        accuracy (``{prefix}test_at_best_val``, ``{prefix}best_val_accuracy``,
        ``{prefix}best_val_round`` in ``record.extra``)."""
        cfg, r = self.cfg, self.record
        ev = evaluate(
            model, *self.test, batch_size=cfg.eval_batch_size, num_classes=self.num_classes
        )
        figures = {prefix + k: v for k, v in ev.items()}
        if self.validation is not None:
            val = evaluate(
                model,
                *self.validation,
                batch_size=cfg.eval_batch_size,
                num_classes=self.num_classes,
            )
            figures.update({prefix + k.replace("test_", "val_"): v for k, v in val.items()})
            if val["test_accuracy"] > r.extra.get(f"{prefix}best_val_accuracy", -1.0):
                r.extra.update(
                    {
                        f"{prefix}best_val_accuracy": val["test_accuracy"],
                        f"{prefix}test_at_best_val": ev["test_accuracy"],
                        f"{prefix}best_val_round": rnd,
                    }
                )
        return figures

    def _server_call(self, rnd: int, call: PartyCall, totals: RoundTotals) -> Message:
        """A strategy's call to a server-side party, metered on the party's account."""
        spec = self.parties.get(call.party)
        if spec is None:
            raise ConfigError(
                f"round {rnd}: the strategy called side party {call.party!r}; known: {sorted(self.parties)}"
            )
        key = SHARED if spec.scope == "shared" or call.key is None else call.key
        up = call.message.to_bytes()
        meter = Meter(
            flops=self.cfg.measure_flops, memory=self.cfg.measure_memory, device=self.cfg.device
        )
        states = self.states.party[spec.name]
        ctx = PartyContext(
            spec.name,
            None if key == SHARED else key,
            rnd,
            decode_state(states.get(key)),
            generator(self.cfg.seed, "party", spec.name, key, rnd, "server"),
            meter,
        )
        with meter.measure():
            reply = spec.factory().handle(Message.from_bytes(up), ctx)
        if not isinstance(reply, Message):
            raise MessageError(
                f"side party {spec.name!r} returned {type(reply).__name__}; expected a Message"
            )
        down = reply.to_bytes()
        if ctx.state:
            states[key] = encode_state(ctx.state)
        else:
            states.pop(key, None)
        totals.add_party(spec.name, meter.stats)
        totals.add_link(f"server->{spec.name}", len(up))
        totals.add_link(f"{spec.name}->server", len(down))
        return Message.from_bytes(down)

    def run(self, *, start_round: int | None = None) -> RoundRecord:
        """Run rounds ``record.round + 1 .. rounds`` (after a restore, the remaining ones),
        where the executor reaches the clients."""
        try:
            return self.executor.host(lambda: self._run_rounds(start_round))
        finally:
            self.close()

    def _run_rounds(self, start_round: int | None) -> RoundRecord:
        first = start_round if start_round is not None else self.record.round + 1
        for rnd in range(first, self.cfg.rounds + 1):
            reason = self.strategy.stop_reason(rnd)
            if reason is not None:
                self.record.extra["stopped"] = reason
                break
            line = self.run_round(rnd)
            if self.on_round is not None:
                self.on_round(line, self)
        return self.record

    def close(self) -> None:
        self.executor.close()
