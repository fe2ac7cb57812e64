"""PPFL's server REE (seed 001, Algorithm 1-2): the untrusted side of the server, which runs the
stage schedule, selects clients by enclave memory (S_l(b), :func:`~.stages.stage_need`), relays the
sealed messages between the client enclaves and the server enclave (``server_tee``, called with
``PartyCall``), holds only the released layers, and evaluates the stage model by ECALLs into the
server enclave. Details, parties and limits: ``docs/methods/ppfl.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

from fedge.core.errors import ConfigError, MessageError, ResumeError, ShortRoundError
from fedge.core.messages import Message
from fedge.core.protocols import Exchange, PartyCall, Round, Strategy
from fedge.methods.ppfl.config import PpflConfig
from fedge.methods.ppfl.enclaves import EnclaveSpec, _cv
from fedge.methods.ppfl.evaluation import EnclaveEval
from fedge.methods.ppfl.stages import Stage, frozen_net, stage_need
from fedge.privacy.tee import MiB, platform_id, platform_path

__all__ = ["PpflStrategy"]


class PpflStrategy(Strategy):
    def __init__(
        self, cfg: PpflConfig, spec: EnclaveSpec, *, num_clients: int, rounds: int
    ) -> None:
        self.cfg, self.spec, self.num_clients, self.rounds = cfg, spec, num_clients, rounds
        self.stages = spec.stages
        self.model = spec.model_fn()  # the REE's copy: released layers only (the rest never loaded)
        self.stage = cfg.freeze_from_init
        if self.stage >= len(self.stages):
            raise ConfigError(
                f"method.freeze_from_init={self.stage} leaves no stage to train (the model has {len(self.stages)})"
            )
        self.released: dict[str, torch.Tensor] = {}
        for st in self.stages[: self.stage]:
            self.released.update(_stage_arrays(st, spec.init_arrays))
        self._load_released()
        nets = [spec.net(i) for i in range(len(self.stages))]
        self.need = [
            partial(stage_need, n, st.in_shape) for n, st in zip(nets, self.stages, strict=True)
        ]
        self.rounds_in_stage = 0
        self.best = -1.0
        self.bad = 0
        self.val_best = -1.0  # the stage's best validation accuracy (stage_patience)
        self.val_bad = 0  # evaluated rounds since it last rose by stage_min_delta
        self.advance = False
        self._rnd = 0
        self.client_has: dict[int, int] = {}
        self.attested: set[int] = set()
        self.refused: set[int] = set()
        self.eval_blob: bytes | None = None
        self.budgets: dict[int, int] = {}
        self._checked = False  # the no-fit check over every stage has run
        self.final_release = 0  # the round whose end released the stage in training (0: none yet)
        self.stage_aggregated = False  # the server enclave averaged a cohort for the current stage
        self._aggregated: list[int] | None = (
            None  # the last completed round's clients whose uploads opened
        )

    # -- selection ---------------------------------------------------------------
    def min_batch(self) -> int:
        return self.cfg.min_batch_size or self.cfg.batch_size

    def batch_for(self, budget: int, stage: int) -> int | None:
        """The largest batch in [min_batch, batch_size] whose S_l fits ``budget`` (None: none)."""
        for b in range(self.cfg.batch_size, self.min_batch() - 1, -1):
            if self.need[stage](b) <= budget:
                return b
        return None

    @property
    def profile_fields(self) -> frozenset[str]:
        return frozenset({"enclave_mb"})

    def eligible_client(self, cid: int, profile: Mapping[str, Any]) -> bool:
        mb = profile.get("enclave_mb")
        budget = int((self.cfg.tee.client_mb if mb is None else mb) * MiB)
        self.budgets[cid] = budget
        if (
            not self._checked and len(self.budgets) == self.num_clients
        ):  # every client's enclave known
            self._checked = True
            self.check_fits(list(self.budgets.values()))
        return self.batch_for(budget, self.stage) is not None

    def eligible(self, profile: Mapping[str, Any]) -> bool:
        """Without a client id: whether a client with this profile fits the current stage
        (the engine asks :meth:`eligible_client`, which also records the client's enclave)."""
        mb = profile.get("enclave_mb")
        return (
            self.batch_for(int((self.cfg.tee.client_mb if mb is None else mb) * MiB), self.stage)
            is not None
        )

    def check_fits(self, budgets: list[int]) -> None:
        """ConfigError (before training) if some stage fits no client's enclave, or fewer clients'
        enclaves than ``method.min_cohort`` (its rounds could then never be averaged). ``budgets``:
        every client's enclave size, or one size that all share."""
        largest = max(budgets)
        every = budgets if len(budgets) == self.num_clients else [largest] * self.num_clients
        for st in self.stages[self.stage :]:
            if self.batch_for(largest, st.index) is None:
                raise ConfigError(
                    f"ppfl stage {st.index} ({'+'.join(st.prefixes)}) needs S_l = {self.need[st.index](self.min_batch()) / MiB:.2f} MiB "
                    f"of enclave memory at batch {self.min_batch()}, but the largest client enclave is {largest / MiB:.2f} MiB; "
                    "give clients larger enclaves (clients.profiles enclave_mb or method.tee.client_mb), allow smaller "
                    "batches (method.min_batch_size) or use a smaller model"
                )
            fits = sum(self.batch_for(b, st.index) is not None for b in every)
            if fits < self.cfg.min_cohort:
                raise ConfigError(
                    f"ppfl stage {st.index} ({'+'.join(st.prefixes)}) fits the enclaves of {fits} client(s), fewer than "
                    f"method.min_cohort={self.cfg.min_cohort} the server enclave averages, so none of its rounds could "
                    "complete; give more clients enclaves that fit (clients.profiles enclave_mb), allow smaller batches "
                    "(method.min_batch_size) or lower method.min_cohort"
                )

    def check_profiles(self, profiles: list[Mapping[str, Any]]) -> None:
        """:meth:`check_fits` for the clients' device profiles (``clients.profiles``, one per
        client), before anything is written: a :class:`ConfigError` naming the profile whose
        enclave is too small, its ``enclave_mb``, the stage's need and the fix."""
        kinds: dict[str, tuple[float | None, int]] = {}
        for p in profiles:
            mb, n = p.get("enclave_mb"), kinds.get(p["name"], (None, 0))[1]
            kinds[p["name"]] = (mb, n + 1)

        def size(mb: float | None) -> float:
            return self.cfg.tee.client_mb if mb is None else mb

        def named(name: str, mb: float | None) -> str:
            given = (
                f"enclave_mb={mb:g}"
                if mb is not None
                else f"no enclave_mb (method.tee.client_mb={self.cfg.tee.client_mb:g})"
            )
            return f"clients.profiles {name!r} ({given})"

        b = self.min_batch()
        for st in self.stages[self.stage :]:
            need_mb = self.need[st.index](b) / MiB
            fit = {
                k: v for k, v in kinds.items() if self.batch_for(int(size(v[0]) * MiB), st.index)
            }
            short = [named(k, v[0]) for k, v in kinds.items() if k not in fit]
            where = (
                f"ppfl stage {st.index} ({'+'.join(st.prefixes)}) needs S_l = {need_mb:.2f} MiB of "
                f"enclave memory at batch {b}"
            )
            fix = (
                f"set enclave_mb to at least {math.ceil(need_mb * 100) / 100:.2f} in clients.profiles, "
                "allow smaller "
                "batches (method.min_batch_size) or use a smaller model"
            )
            if not fit:
                raise ConfigError(
                    f"{where}, more than any client's enclave: {', '.join(short)}; {fix}"
                )
            fits = sum(n for _, n in fit.values())
            if fits < self.cfg.min_cohort:
                raise ConfigError(
                    f"{where}; only the {fits} client(s) of {', '.join(map(repr, fit))} have it, fewer "
                    f"than method.min_cohort={self.cfg.min_cohort} the server enclave averages, so none "
                    f"of its rounds could complete ({', '.join(short)} too small); {fix}, or lower "
                    "method.min_cohort"
                )

    def _budget(self, cid: int) -> int:
        return self.budgets.get(cid, int(self.cfg.tee.client_mb * MiB))

    # -- the round ---------------------------------------------------------------
    @property
    def partial_replies(self) -> bool:
        """Yes. A new client whose attestation reply is missing is neither attested nor refused
        (it attests when next sampled); a client whose training reply is missing is left out of
        the server enclave's weighted mean, and the REE does not record it as holding the layers
        it was sent (if it did get them, they are sent again: harmless). A sealed message a
        client never opened leaves a gap in the counters, which the receiver allows (it needs
        only increasing counters); a reply lost after the client enclave sealed leaves the REE
        with that enclave's older sealed state, whose counter the next upload reuses — under
        a fresh random nonce part (:mod:`fedge.privacy.tee.channel`). A round left with fewer
        than ``method.min_cohort`` uploads that open is a :class:`ShortRoundError`: skipped
        under ``clients.min_replies``."""
        return True

    def aggregated_clients(self) -> list[int] | None:
        """The clients whose sealed uploads the server enclave averaged last round: not those
        sent ``skip`` (not attested, or the stage does not fit their enclave), nor a rejected
        upload. Each trained the stage's layer (and head) on its data; a client that trained an
        earlier stage's layer is in the released model through it."""
        return self._aggregated

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        metrics: dict[str, float] = {}
        if not self._checked:  # no clients.profiles: every enclave is method.tee.client_mb
            self._checked = True
            self.check_fits([int(self.cfg.tee.client_mb * MiB)])
        if (
            self.advance
        ):  # the stage ended last round (the stage number already moved on, for sampling)
            yield from self._release(
                self.stage - 1
            )  # asked again after a skipped round: the same arrays
        self._rnd = rnd
        new = [c for c in client_ids if c not in self.attested and c not in self.refused]
        if new:
            hello = yield PartyCall(
                "server_tee", Message(config={"op": "hello", "ids": ",".join(map(str, new))})
            )
            skip = Message(config={"op": "skip"})
            msgs = {c: skip for c in client_ids}
            for c in new:
                msgs[c] = Message(
                    config={
                        "op": "attest",
                        "challenge": hello.config[f"challenge/{c}"],
                        **{
                            k: hello.config[k]
                            for k in ("server_measurement", "server_pk", "server_signature")
                        },
                    }
                )
            replies = yield Exchange(msgs)
            answered = [c for c in new if c in replies]  # the others failed (clients.min_replies)
            if answered:
                reg: dict[str, Any] = {"op": "register", "ids": ",".join(map(str, answered))}
                for c in answered:
                    for k in ("measurement", "pk", "signature"):
                        reg[f"{k}/{c}"] = replies[c].config[k]
                out = yield PartyCall("server_tee", Message(config=reg))
                refused = [int(x) for x in out.config["refused"].split(",") if x]
                self.refused.update(refused)
                self.attested.update(c for c in answered if c not in refused)
        ids = [
            c
            for c in client_ids
            if c in self.attested and self.batch_for(self._budget(c), self.stage) is not None
        ]
        stage = self.stage
        if len(ids) < self.cfg.min_cohort:  # the server enclave would refuse to average them
            raise ShortRoundError(
                self._short(
                    rnd, f"{len(ids)} of the sampled clients are attested and fit stage {stage}"
                )
            )
        bc = yield PartyCall(
            "server_tee",
            Message(
                config={
                    "op": "broadcast",
                    "stage": stage,
                    "rnd": rnd,
                    "ids": ",".join(map(str, ids)),
                }
            ),
        )
        upto = self.stage_start_units()
        skip = Message(config={"op": "skip"})
        msgs = {c: skip for c in client_ids}
        for c in ids:
            have = self.client_has.get(c, 0)
            arrays = {}
            for st in self.stages[have:stage]:
                arrays.update(_stage_arrays(st, self.released))
            msgs[c] = Message(
                arrays,
                {
                    "op": "train",
                    "stage": stage,
                    "rnd": rnd,
                    "blob": bc.config[f"c/{c}"],
                    "batch_size": self.batch_for(self._budget(c), stage),
                    "budget": self._budget(c),
                    "epochs": self.cfg.local_epochs,
                    "frozen_upto": upto,
                },
            )
        replies = yield Exchange(msgs)
        ids = [
            c for c in ids if c in replies
        ]  # a client that failed (clients.min_replies) is left out
        for c in ids:
            self.client_has[c] = stage
        agg: dict[str, Any] = {
            "op": "aggregate",
            "stage": stage,
            "rnd": rnd,
            "ids": ",".join(map(str, ids)),
        }
        for c in ids:  # weighted by the sample counts sealed inside (the enclave's own count)
            agg[f"u/{c}"] = replies[c].config["upload"]
        out = yield PartyCall("server_tee", Message(config=agg))
        rejected = [int(x) for x in _cv(out.config, "rejected", str).split(",") if x]
        if rejected and self.cfg.on_bad_upload == "abort":
            raise MessageError(
                f"round {rnd}: the server enclave rejected the sealed uploads of clients {rejected} "
                "(failed authentication); stopping as method.on_bad_upload=abort"
            )
        if "short" in out.config:
            raise ShortRoundError(
                self._short(rnd, f"the server enclave did not aggregate: {out.config['short']}")
            )
        self.eval_blob = out.config["eval"]
        self.stage_aggregated = True
        self._aggregated = [c for c in ids if c not in rejected]
        eligible = sum(
            1 for c in range(self.num_clients) if self.batch_for(self._budget(c), stage) is not None
        )
        r = [replies[c].metrics for c in ids]
        metrics.update(
            stage=stage,
            stage_rounds=self.rounds_in_stage + 1,
            eligible_clients=eligible,
            trained_clients=len(ids) - len(rejected),
            batch_size_min=min((_cv(msgs[c].config, "batch_size", int) for c in ids), default=0),
            rejected_clients=len(rejected),
            tee_need_bytes=self.need[stage](self.cfg.batch_size),
            tee_peak_bytes=max((m["peak"] for m in r), default=0),
            tee_budget_min_bytes=min((self._budget(c) for c in ids), default=0),
            server_tee_peak_bytes=out.metrics.get("server_tee_peak", 0),
            seal_s=sum(m["seal_s"] for m in r),
            client_ree_s=sum(m["ree_s"] for m in r),
            client_tee_s=sum(m["tee_s"] for m in r),
            client_open_s=sum(m["open_s"] for m in r),
            client_train_s=sum(m["train_s"] for m in r),
            client_upload_s=sum(m["upload_s"] for m in r),
            train_loss=out.metrics[
                "train_loss"
            ],  # the server enclave's mean over the uploads it averaged
        )
        if (
            rnd == self.rounds
        ):  # the run ends: the REE gets this stage's layers (the last one only if not kept)
            if self.keeps(stage):
                metrics["tee_kept_params"] = sum(
                    v.numel()
                    for k, v in self.model.state_dict().items()
                    if self._in_stage(k, stage)
                )
            else:
                yield from self._release(stage, final=True)
                self.final_release = rnd
        return metrics

    def _short(self, rnd: int, why: str) -> str:
        return (
            f"round {rnd}: {why}; the server enclave averages at least method.min_cohort={self.cfg.min_cohort} "
            "uploads (fewer would hand the REE one client's update). Set clients.min_replies to skip such rounds, "
            "sample more clients (clients.per_round), or lower method.min_cohort"
        )

    def keeps(self, stage: int) -> bool:
        """Whether ``stage``'s layers stay in the enclaves at the run's end (the last stage,
        under ``method.keep_last_in_tee``)."""
        return self.cfg.keep_last_in_tee and stage == len(self.stages) - 1

    def _in_stage(self, key: str, stage: int) -> bool:
        return self.stages[stage].holds(key)

    def stage_start_units(self) -> int:
        return self.stage

    def _release(self, stage: int, final: bool = False) -> Round:
        out = yield PartyCall("server_tee", Message(config={"op": "release", "stage": stage}))
        self.released.update(out.arrays)
        self._load_released()
        if not final:
            self.advance = False
            self.eval_blob = None
        elif stage == len(self.stages) - 1:  # the whole model is in the REE now: evaluate it there
            self.eval_blob = None
        return {}

    def _load_released(self) -> None:
        if self.released:
            self.model.load_state_dict(self.released, strict=False)

    def round_metrics(self, line: Mapping[str, Any]) -> dict[str, Any]:
        acc = line.get("test_accuracy")
        self.rounds_in_stage += 1
        if acc is not None:
            if acc > self.best:
                self.best, self.bad = acc, 0
            else:
                self.bad += 1
        c = self.cfg
        if c.stage_patience is not None:
            self._track_validation(line)
        done = (
            (c.rounds_per_stage is not None and self.rounds_in_stage >= c.rounds_per_stage)
            or (c.patience is not None and self.bad >= c.patience)
            or (c.stage_patience is not None and self.val_bad >= c.stage_patience)
            or (c.target_accuracy is not None and acc is not None and acc >= c.target_accuracy)
        )
        last = self.stage == len(self.stages) - 1
        if (
            done and not self.stage_aggregated
        ):  # every round of it skipped: it trains on (nothing to release)
            done = False
        if done and not last and self._rnd < self.rounds:
            # the next round samples by the next stage's need; its first step releases this stage
            self.advance = True
            self.stage += 1
            self.rounds_in_stage, self.best, self.bad = 0, -1.0, 0
            self.val_best, self.val_bad = -1.0, 0
            self.stage_aggregated = False
        return {"stage_done": int(bool(done))}

    def _track_validation(self, line: Mapping[str, Any]) -> None:
        """Count the evaluated rounds since the stage's validation accuracy last rose above its
        best by more than ``stage_min_delta`` (the stage's first evaluation always counts as a
        rise; a smaller rise leaves the best where it was)."""
        if line.get("test_accuracy") is None:
            return  # not an evaluation round
        val = line.get("val_accuracy")
        if val is None:
            raise ConfigError(
                "method.stage_patience ends a stage on its validation accuracy, but this run "
                "evaluates none; set dataset.validation (e.g. 0.1) or use method.patience"
            )
        if self.val_best < 0 or val > self.val_best + self.cfg.stage_min_delta:
            self.val_best, self.val_bad = float(val), 0
        else:
            self.val_bad += 1

    def eval_model(self) -> nn.Module:
        st = self.stages[self.stage - 1 if self.advance else self.stage]
        if self.eval_blob is None:  # after a release at the run's end: the REE's own model
            return self.model
        return EnclaveEval(
            frozen_net(self.model, self.stages, st.index),
            self.eval_blob,
            self.spec,
            st.index,
            self.released,
        )

    def state_dict(self) -> dict[str, Any]:
        """Everything the REE keeps between rounds; the stage model and the session keys are
        not here but in the enclaves' sealed party states, which the engine checkpoints."""
        return {
            "platform": platform_id(),
            "rnd": self._rnd,
            "rounds": self.rounds,
            "stage": self.stage,
            "rounds_in_stage": self.rounds_in_stage,
            "best": self.best,
            "bad": self.bad,
            "val_best": self.val_best,
            "val_bad": self.val_bad,
            "advance": self.advance,
            "released": dict(self.released),
            "client_has": dict(self.client_has),
            "attested": sorted(self.attested),
            "refused": sorted(self.refused),
            "eval_blob": self.eval_blob,
            "budgets": dict(self.budgets),
            "checked": self._checked,
            "final_release": self.final_release,
            "stage_aggregated": self.stage_aggregated,
        }

    def check_resume(self, state: dict[str, Any], rounds: int) -> None:
        """The enclaves' sealed state opens only on the platform that sealed it (see
        :mod:`fedge.privacy.tee.attest`): another platform is refused by name. A finished run
        whose last round released the stage in training cannot be extended (the server enclave
        let go of it); one whose last stage stayed in the enclaves (``keep_last_in_tee``) can."""
        if "platform" not in state:
            raise ResumeError(
                "this ppfl run was checkpointed by a fedge that could not resume ppfl runs; start it again"
            )
        here = platform_id()
        if state["platform"] != here:
            raise ResumeError(
                f"this ppfl run's enclave state was sealed on TEE platform {state['platform']}, and this machine is "
                f"platform {here} ({str(platform_path())!r}): sealed storage opens only where it was sealed. Resume "
                "it where it ran (with the same $FEDGE_TEE_PLATFORM file), or start it again"
            )
        if rounds > state["rounds"] and state["final_release"]:
            raise ResumeError(
                f"this ppfl run cannot be extended: at its last round ({state['final_release']}) the server enclave "
                f"released stage {state['stage']}'s layers to the REE and dropped the stage's model; start a run with "
                f"rounds={rounds} instead"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the REE's state as it was; whether the enclaves' sealed state can go on here
        is :meth:`check_resume`'s question (a finished run's model loads anywhere, and a
        checkpoint of an older fedge, which kept less, loads for that)."""
        self.stage, self.rounds_in_stage = state["stage"], state["rounds_in_stage"]
        self.best, self.bad, self.advance = state["best"], state["bad"], state["advance"]
        self.val_best, self.val_bad = state.get("val_best", -1.0), state.get("val_bad", 0)
        self.released = dict(state["released"])
        self._load_released()
        self._rnd = state.get("rnd", 0)
        self.client_has, self.budgets = (
            dict(state.get("client_has", {})),
            dict(state.get("budgets", {})),
        )
        self.attested, self.refused = set(state.get("attested", ())), set(state.get("refused", ()))
        self.eval_blob, self._checked = state.get("eval_blob"), state.get("checked", False)
        self.final_release = state.get("final_release", 0)
        self.stage_aggregated = state.get("stage_aggregated", self.eval_blob is not None)


def _stage_arrays(st: Stage, arrays: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in arrays.items() if st.holds(k)}
