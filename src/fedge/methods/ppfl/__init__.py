"""PPFL (seed 001: "PPFL: Privacy-preserving Federated Learning with Trusted Execution
Environments", Mo et al., MobiSys 2021): greedy layer-wise (or block-wise) federated
learning with the layer under training inside enclaves on the clients and the server.

**Stages** (Algorithm 1-2, :mod:`.stages`). Stage l trains layer l (or a block of
``block_layers`` conv blocks) plus a classifier head inside each client's enclave, on
features the client's REE computes with the frozen, already released layers 1..l-1. After
the last conv stage the classifier atop all convs is trained. A stage ends after
``rounds_per_stage`` rounds, or when test accuracy has not improved for ``patience`` rounds,
or when it reaches ``target_accuracy`` (the first that holds); ``stage`` is logged.

**Parties.**

==================  =========================================  ==================================
party               here                                       holds in plaintext
==================  =========================================  ==================================
client REE          :class:`PpflClient`                        data, released (frozen) layers
client enclave      :class:`.enclaves.ClientEnclave` (``tee``)   the stage's layer + head while training
server REE          :class:`PpflStrategy`                       released layers, sealed blobs
server enclave      :class:`.enclaves.ServerEnclave`             session keys, the aggregated stage model
                    (``server_tee``, via ``PartyCall``)
==================  =========================================  ==================================

Before a client first trains, it and the server enclave attest each other (Ed25519 reports
over measurement = SHA-256 of the enclaves' code, the model's code and the config, lr and
momentum included) and agree a session key (X25519 + HKDF); every model message between
enclaves is AES-GCM sealed (nonce: direction, counter, random bytes; associated data: round,
stage, client, direction, counter; :mod:`fedge.privacy.tee.channel`). An upload that fails to
open is rejected: the round aggregates the others (``on_bad_upload: drop``) or stops
(``abort``). The server enclave averages at least ``min_cohort`` uploads (default 2), weighted
by the sample counts sealed inside them; a round with fewer is a
:class:`~fedge.core.errors.ShortRoundError` (skipped under ``clients.min_replies``). What each
enclave lets out, and the limits (no rollback protection for sealed state; the server's
report is not fresh): :mod:`.enclaves`.

**Client selection by enclave memory** (Algorithm 1). S_l(b) (:func:`.stages.stage_need`)
counts the stage's layer and head, their gradients and momentum, and per sample the input
batch and every leaf's activation and its gradient. A client's enclave size is its
``clients.profiles`` ``enclave_mb`` (or ``method.tee.client_mb``); it is eligible for stage l
if S_l(min_batch_size) fits, and trains with the largest batch ≤ ``batch_size`` that fits. The
engine asks ``Strategy.eligible_client(cid, profile)`` before every round's sampling, so the
answer follows the current stage (a stage's end is decided in ``round_metrics``, so the next
round's sampling already uses the next stage's need), and the strategy records each client's
enclave size by its id (for its batch size). If some stage fits no client the run stops
before training (checked over every stage once every client's enclave is known, on the first
sampling). The enclave enforces its budget on the
tensors it really holds (:class:`fedge.privacy.tee.EnclaveMemory`); its peak is logged.

**Costs** (per round, summed over its clients): ``client_open_s`` (the client enclave
opening the sealed broadcast and building the stage model), ``client_train_s`` (the REE's
frozen forward and the enclave's training steps), ``client_upload_s`` (packing and sealing
the upload; ``seal_s`` is its AES-GCM part); the server enclave's broadcast and aggregation
are its ``wall_s.server_tee`` (per call: ``benchmarks/ppfl_tables.py`` times them for Table 4).

**Evaluation.** The untrusted server never sees the stage's plaintext layer, so the per-round
test accuracy is computed by an ECALL into the server enclave: the evaluation model is the
REE's frozen layers followed by a handle holding only the sealed stage model; each call
unseals it inside the "enclave" and returns logits. The REE learns test predictions (as any
served model leaks) but no weights; the stage's layers reach the REE only when the stage
ends (Algorithm 1: "save θ_l from TEE as θ_l^0 in REE"), and only as a mean of at least
``min_cohort`` clients' updates (a stage whose every round was skipped goes on until one
aggregates). The released layers stay in the server enclave until the next stage's first
aggregate, so a round skipped right after a release asks for them again and gets them.

**Simulation limits.** The enclaves run in-process; their plaintext lives only in the party
objects during a call, and the state the engine keeps between calls is sealed under the
platform's hardware keys (:mod:`fedge.privacy.tee.attest`: simulated fuses kept in a file per
machine). So an interrupted PPFL run resumes on the machine that ran it (``fedge run --resume``,
attested sessions and all) and is refused by name elsewhere; clients run sequentially
(``clients.workers: 0``). A run that ends mid-stage releases that stage's layers (not its
head) at the last round, so it cannot be extended; one whose last stage stayed in the
enclaves can.

**The last layer stays in the enclaves** (Sec. 3, "Privacy-by-design Guarantee": "PPFL can
keep the last layer inside the clients TEEs after training", which the paper credits for its
MIA precision of ~0.5 in Table 2). With ``keep_last_in_tee`` (the default) the last stage —
the classifier atop the convs, trained as one stage, so for a classifier of several FC layers
all of them: the paper's "last layer" is one layer, but releasing the FC layers trained jointly
with it would hand the REE all but one matrix of the same stage — is never released: the run's
``model.safetensors`` holds the layers before it, the final evaluation is an ECALL into the
server enclave, and the last round logs ``tee_kept_params``. ``fedge export`` and
:func:`~fedge.experiment.export.load_trained_model` refuse such a run by name (there is no complete model
outside the enclaves); ``fedge attack --attack mia`` attacks what a holder of the released
layers can build: a classifier of its own atop them. ``keep_last_in_tee: false`` releases
everything, with a :class:`~fedge.core.errors.PrivacyWarning`. What this does not cover: the
server's REE computes test accuracy by ECALLs into its enclave, so while it keeps that
enclave it can query the kept model's logits on inputs of its choice (a black-box oracle;
``fedge attack --attack mia --rounds`` measures that view, round by round); the paper does
not say how its server evaluates. The attack on a finished run measures a holder of the
released layers, with no oracle.

**Transfer** (Sec. 6.4): ``init_from`` (a ``model.safetensors`` or a run directory holding
one) initialises every layer from a pretrained model; ``freeze_from_init: k`` treats the
first k stages as already trained (released, frozen) and starts at stage k.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from fedge.core.context import ClientContext
from fedge.core.errors import (
    ConfigError,
    MessageError,
    PrivacyWarning,
    ResumeError,
    ShortRoundError,
)
from fedge.core.messages import Message
from fedge.core.protocols import Exchange, PartyCall, PartySpec, Round, Strategy
from fedge.methods.base import MethodBuild, MethodConfigBase, MethodEnv
from fedge.methods.ppfl.enclaves import (
    ClientEnclave,
    EnclaveSpec,
    ServerEnclave,
    _cv,
    open_eval_blob,
)
from fedge.methods.ppfl.stages import Stage, frozen_net, plan_stages, stage_need
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities
from fedge.privacy.tee import MiB, platform_id, platform_path

__all__ = ["PpflConfig", "PpflStrategy", "PpflClient", "PpflTeeConfig", "build"]


class PpflTeeConfig(MethodConfigBase):
    client_mb: float = Field(
        16.0, gt=0, description="client enclave size when its profile gives no enclave_mb"
    )
    server_mb: float = Field(256.0, gt=0, description="server enclave size")


class PpflConfig(MethodConfigBase):
    name: Literal["ppfl"] = "ppfl"
    block_layers: int = Field(
        1, ge=1, description="conv blocks trained together per stage (Table 5)"
    )
    rounds_per_stage: int | None = Field(None, ge=1, description="fixed schedule: rounds per stage")
    patience: int | None = Field(
        None, ge=1, description="end a stage after this many rounds without a better test accuracy"
    )
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="end a stage when test accuracy reaches this"
    )
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(16, ge=1)
    min_batch_size: int | None = Field(
        None, ge=1, description="smallest batch a client may shrink to (null: no shrinking)"
    )
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    tee: PpflTeeConfig = PpflTeeConfig()
    on_bad_upload: Literal["drop", "abort"] = "drop"
    min_cohort: int = Field(
        2,
        ge=1,
        description="fewest uploads the server enclave averages: a round with fewer that "
        "open is skipped (under clients.min_replies) or stops the run, so the REE never gets one "
        "client's update as a stage's layers; 1 allows exactly that",
    )
    keep_last_in_tee: bool = Field(
        True,
        description="when training ends, keep the last stage (the classifier) inside the "
        "enclaves: the REE and model.safetensors get only the layers before it (Sec. 3, "
        "PPFL's defence against membership inference)",
    )
    init_from: str | None = Field(
        None, description="pretrained model.safetensors, or a run directory holding one"
    )
    freeze_from_init: int = Field(0, ge=0, description="stages taken as trained from init_from")

    @model_validator(mode="after")
    def _check(self) -> PpflConfig:
        if self.rounds_per_stage is None and self.patience is None and self.target_accuracy is None:
            raise ValueError(
                "ppfl needs a stage schedule: set method.rounds_per_stage, method.patience or method.target_accuracy"
            )
        if self.min_batch_size is not None and self.min_batch_size > self.batch_size:
            raise ValueError(
                f"method.min_batch_size={self.min_batch_size} exceeds batch_size={self.batch_size}"
            )
        if self.freeze_from_init and self.init_from is None:
            raise ValueError(
                "method.freeze_from_init needs method.init_from (the pretrained model)"
            )
        return self


class _EnclaveEval(nn.Module):
    """Evaluation model: REE frozen layers, then an ECALL into the server enclave holding
    only the sealed stage model (see the module docstring)."""

    def __init__(
        self,
        frozen: nn.Sequential,
        blob: bytes | None,
        spec: EnclaveSpec,
        stage: int,
        released: dict[str, torch.Tensor],
    ) -> None:
        super().__init__()
        self.frozen = frozen
        self._blob, self._spec, self._stage, self._released = blob, spec, stage, released

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """What the REE holds: the released layers, under the model's names (a run's
        ``model.safetensors``; usable as ``method.init_from``)."""
        return dict(self._released)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.frozen(x)
        if self._blob is None:
            raise MessageError("ppfl: no stage model aggregated yet to evaluate")
        return _ecall_eval(self._spec, self._stage, self._blob, f)


def _ecall_eval(spec: EnclaveSpec, stage: int, blob: bytes, f: torch.Tensor) -> torch.Tensor:
    net = spec.net(stage, open_eval_blob(blob)).eval()
    return net(f).detach()


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
        done = (
            (c.rounds_per_stage is not None and self.rounds_in_stage >= c.rounds_per_stage)
            or (c.patience is not None and self.bad >= c.patience)
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
            self.stage_aggregated = False
        return {"stage_done": int(bool(done))}

    def eval_model(self) -> nn.Module:
        st = self.stages[self.stage - 1 if self.advance else self.stage]
        if self.eval_blob is None:  # after a release at the run's end: the REE's own model
            return self.model
        return _EnclaveEval(
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


class PpflClient:
    """The client's REE: runs the frozen layers on its data and feeds the enclave batch by batch."""

    def __init__(self, spec: EnclaveSpec) -> None:
        self.spec = spec

    def run(self, message: Message, ctx: ClientContext) -> Message:
        c = message.config
        if c["op"] == "skip":
            return Message()
        tee = ctx.link("tee")
        if c["op"] == "attest":
            return tee.call(Message(config=dict(c)))
        model = self.spec.model_fn()
        frozen_arrays = {k: v for k, v in ctx.state.items() if isinstance(v, torch.Tensor)}
        frozen_arrays.update(message.arrays)
        ctx.state.update(message.arrays)
        stage = _cv(c, "stage", int)
        model.load_state_dict(frozen_arrays, strict=False)
        frozen = frozen_net(model, self.spec.stages, stage)
        t_start = time.perf_counter()
        tee.call(
            Message(config={"op": "begin", **{k: c[k] for k in ("blob", "rnd", "stage", "budget")}})
        )
        tee_s = open_s = time.perf_counter() - t_start
        for _ in range(_cv(c, "epochs", int)):
            for x, y in ctx.data.batches(_cv(c, "batch_size", int), generator=ctx.generator):
                with torch.no_grad():
                    f = frozen(x)
                t1 = time.perf_counter()
                tee.call(Message({"x": f, "y": y}, {"op": "batch"}))
                tee_s += time.perf_counter() - t1
        t1 = time.perf_counter()
        out = tee.call(Message(config={"op": "end"}))
        upload_s = time.perf_counter() - t1
        tee_s += upload_s
        ree_s = time.perf_counter() - t_start - tee_s  # frozen layers' forward and batching
        train_s = t1 - t_start - open_s
        return Message(
            config={"upload": out.config["upload"]},
            metrics={
                **out.metrics,
                "tee_s": tee_s,
                "ree_s": max(0.0, ree_s),
                "open_s": open_s,
                "train_s": train_s,
                "upload_s": upload_s,
            },
        )


def _stage_arrays(st: Stage, arrays: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in arrays.items() if st.holds(k)}


def _init_arrays(cfg: PpflConfig, env: MethodEnv) -> dict[str, torch.Tensor]:
    model = env.model_fn()
    arrays = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if cfg.init_from is None:
        return arrays
    path = Path(cfg.init_from)
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise ConfigError(
            f"method.init_from={cfg.init_from!r}: no such file (expected a model.safetensors or a run directory holding one)"
        )
    from safetensors.torch import load_file

    loaded = load_file(str(path))
    unknown = sorted(set(loaded) - set(arrays))
    if unknown:
        raise ConfigError(
            f"method.init_from={cfg.init_from!r} holds tensors {unknown[:5]} this model lacks; pretrain the same model"
        )
    for k, v in loaded.items():
        if v.shape != arrays[k].shape:
            raise ConfigError(
                f"method.init_from: {k} has shape {tuple(v.shape)}, the model expects {tuple(arrays[k].shape)}"
            )
        arrays[k] = v.to(arrays[k].dtype)
    return arrays


@declare_method(
    "ppfl",
    "PPFL: greedy layer-wise FL, the layer under training inside attested, memory-budgeted, sealed enclaves",
    config=PpflConfig,
    capabilities=Capabilities(),  # layer-wise aggregation inside its own enclave
    upload=lambda cfg: "ciphertext",
)
def build(cfg: PpflConfig, env: MethodEnv) -> MethodBuild:
    """Build PPFL: the strategy, the client REE program, and the enclaves ``tee`` and ``server_tee``."""
    if env.workers:
        raise ConfigError(
            f"ppfl needs clients.workers=0 (got {env.workers}): its enclaves' device keys live in one process"
        )
    stages = plan_stages(env.model_fn(), tuple(env.input_shape), cfg.block_layers)
    spec = EnclaveSpec(
        env.model_fn,
        stages,
        env.seed,
        _init_arrays(cfg, env),
        cfg.model_dump(exclude={"init_from"}),
        cfg.tee.server_mb,
    )
    if not cfg.keep_last_in_tee:
        warnings.warn(
            "method.keep_last_in_tee=false: when training ends the REE and model.safetensors get every layer, the last "
            "one included, so whoever holds the model can run membership inference on it (PPFL keeps the last layer in "
            "the client enclaves against exactly this, Sec. 3); keep it unless you are measuring that risk",
            PrivacyWarning,
            stacklevel=2,
        )
    strategy = PpflStrategy(cfg, spec, num_clients=len(env.client_sizes), rounds=env.rounds)
    parties = {
        "tee": PartySpec("tee", partial(ClientEnclave, spec), scope="client"),
        "server_tee": PartySpec("server_tee", partial(ServerEnclave, spec), scope="shared"),
    }
    return MethodBuild(strategy, PpflClient(spec), parties)
