"""BAFFLE: backpropagation-free federated learning (seed 000; Algorithm 1, Eq. 1-7).

Clients run forward passes only. Two communication settings (Section 3.2):

- **batch-level** (``mode: batch``, FedSGD, Algorithm 1). The server broadcasts the model
  and a seed s_t; each client evaluates K loss differences ``ΔL(W_t, δ_k; D_c)`` on the
  perturbations regenerated from s_t, over its whole local set D_c as Algorithm 1 line 12
  states (``delta_loss_on: local_set``, the default; ``batch``: one mini-batch drawn per round), and uploads exactly those
  K float32 scalars (4K bytes of payload). The server forms Σ_c (N_c/N) ΔL_c (Eq. 7),
  regenerates δ_k from the same seed, estimates ĝ with Stein's identity (Eq. 6) and applies
  its optimizer (Adam, β = (0.9, 0.99), lr 0.01, as in the paper).
- **epoch-level** (``mode: epoch``, FedAvg). Each client runs ``local_epochs`` of local
  steps whose gradient is the zeroth-order estimate on the current mini-batch (fresh
  perturbation seed per step, from the client's generator), and uploads its model delta; the
  server averages deltas with weights N_c/N and applies its optimizer (SGD with lr 1 = FedAvg).

Guidelines (Section 4.1), all switchable: Hardswish and GroupNorm are model options
(``model.activation``, ``model.norm``; the `lenet` model defaults to both); twice-FD is
``scheme: forward``, the default; EMA of the global model for evaluation is ``ema: 0.995``.

- **EMA schedule.** The paper states a smoothing coefficient of 0.995. Its reference code
  uses ``torch_ema.ExponentialMovingAverage``, whose default warm-up makes the decay of an
  update ``min(0.995, (1+N)/(10+N))`` with N counting the updates *including* that one. With
  one update per round and 20-40 rounds, a constant 0.995 would leave the evaluated model
  ≥ 80% the random initialization (0.995^40 ≈ 0.82), which cannot have produced the paper's
  accuracies; so fedge defaults to a warm-up schedule (``ema_warmup: true``) and keeps the
  constant decay as ``ema_warmup: false``. fedge's warm-up counts the *earlier* updates, n =
  N − 1: ``min(0.995, (1+n)/(10+n))``, one update behind torch_ema (first decay 0.10 against
  0.18, 0.69 against 0.70 at the 20th). Noticed after the reproduction tables were under way;
  kept, so that every run of a table uses one schedule (the two differ by < 0.01 in the decay
  from the 6th update on).

Deliberate choices where the paper and its reference code differ:

- **Clipping.** The reference code clips every estimate to inf-norm 0.3
  (``clip_grad_norm_(..., 0.3, inf)``); the paper does not mention it. fedge keeps it as
  ``clip: 0.3`` by default (``clip: null`` turns it off). In epoch-level mode it is applied
  to each local estimate on the client, as in the reference; in batch-level mode it is
  applied to the aggregated estimate on the server, because clipping each client's
  estimate would break Eq. (7)'s linearity (the server could no longer combine K scalars
  per client and regenerate the perturbations once), and is impossible under secure
  aggregation, where the server never sees a client's own ΔL_c.
- **Shared perturbations.** The paper shares δ_k across clients through s_t (Eq. 7); the
  reference code draws them independently per client. ``shared_perturbations: true`` (the
  default) follows the paper; ``false`` sends each client its own seed and the server
  regenerates once per client (C times the work). Secure aggregation needs shared ones.
  Batch-level mode only: epoch-level clients always draw a fresh seed per local step from
  their own generator (the flag has no effect there).
- **K under twice-FD.** ``k`` is always the number of loss differences a client computes and
  uploads (K + 1 forwards with ``forward``, 2K with ``central``), as in the reference code.
  To compare the schemes at the same forward budget, as the paper's ablation does, give
  ``forward`` about twice the K of ``central`` (:func:`fedge.estimators.num_differences`).
- **Client optimizer (epoch-level).** The reference keeps each client's Adam state across
  rounds; fedge by default builds a fresh client optimizer each round as FedAvg does (clients
  that are not sampled every round would otherwise carry stale moments), and
  ``client_optimizer.state: persistent`` keeps it as the reference does. Adam, lr 0.01,
  β = (0.9, 0.99) by default, as the paper states.
- **Secure aggregation (epoch-level).** Not in the paper for this mode: its clients upload
  model deltas, as FedAvg's, and ``secure_aggregation: true`` masks them as for fedavg (off by
  default, as there; on by default in batch mode, whose K loss differences Eq. 7 sums).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError, MessageError, PrivacyWarning
from fedge.core.messages import Message
from fedge.core.protocols import Strategy
from fedge.core.rng import derive_seed
from fedge.estimators import (
    ZerothOrderSpec,
    combine_loss_differences,
    estimate_gradient,
    loss_differences,
    zeroth_order_gradient,
)
from fedge.methods.baffle_downlink import (
    ClientReplica,
    DownlinkHistory,
    clip_inf_norm,
    perturbed_masks,
    perturbed_params,
    replay_step,
)
from fedge.methods.base import (
    GlobalModel,
    MethodBuild,
    MethodConfigBase,
    MethodEnv,
    ServerOptimizerConfig,
)
from fedge.methods.fedavg import DeltaAveraging
from fedge.methods.local import ClientOptimizerConfig, LocalTraining
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities

__all__ = ["BaffleBatchClient", "BaffleBatchStrategy", "BaffleConfig", "build", "clip_inf_norm"]

_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


# The server optimizer each mode defaults to: BAFFLE's Adam on the estimate (batch), FedAvg (epoch).
_BATCH_SERVER_OPTIMIZER: dict[str, Any] = {"name": "adam", "lr": 0.01, "b1": 0.9, "b2": 0.99}
_EPOCH_SERVER_OPTIMIZER: dict[str, Any] = {"name": "sgd", "lr": 1.0}


class BaffleConfig(MethodConfigBase):
    """BAFFLE's own keys; the composer (:mod:`fedge.methods.compose`) attaches the mechanism
    options its capabilities allow (``secure_aggregation``/``secagg_*``, ``ema``/``ema_*``,
    ``freeze``), with BAFFLE's defaults (:data:`DEFAULTS`)."""

    if TYPE_CHECKING:  # attached by the composer; read by the consistency rules below
        secure_aggregation: bool | None
        secagg_dropout: float

    name: Literal["baffle"] = "baffle"
    mode: Literal["batch", "epoch"] = Field(
        "epoch", description="batch-level (FedSGD) or epoch-level (FedAvg)"
    )
    k: int = Field(100, ge=1, description="K: loss differences per estimate")
    sigma: float = Field(1e-4, gt=0, description="perturbation scale σ")
    scheme: Literal["central", "forward"] = Field(
        "forward", description="central or twice-FD (forward)"
    )
    estimator: Literal["lean", "fast"] = Field(
        "fast",
        description="lean (least memory) or fast (a forward of the batch of at most ~90 MFLOP, e.g. LeNet-5 up to "
        "159 samples, BAFFLE's LeNet up to 8: perturbations batched; more: perturbations split over "
        "`perturbation_threads`, one model copy per thread; at epoch level it keeps up to 64 MiB of the forwards' "
        "perturbations so the client's own estimate does not draw them again)",
    )
    perturbation_threads: int | None = Field(
        None,
        ge=1,
        description="fast estimator: threads the K perturbations are split over, one torch thread each "
        "(null: every usable core when clients run in the engine's process, 1 with clients.workers > 0)",
    )
    chunk: int | None = Field(
        None, ge=1, description="perturbations per batched pass (fast estimator)"
    )
    directions: Literal["gaussian", "orthogonal", "block"] = Field(
        "gaussian",
        description="perturbation directions: gaussian (BAFFLE's i.i.d.), orthogonal (randomized Hadamard per "
        "tensor) or block (per-layer, K split ∝ sqrt(layer size)); see fedge.estimators.directions",
    )
    perturb: list[str] | None = Field(
        None,
        description="shell-style patterns of the parameters to perturb and train (null: all trainable)",
    )
    batch_size: int = Field(
        64,
        ge=1,
        description="samples per loss evaluation (with delta_loss_on=local_set: per forward chunk)",
    )
    delta_loss_on: Literal["batch", "local_set"] = Field(
        "local_set",
        description="batch mode: ΔL over the client's whole local set D_c (Algorithm 1, line 12; forwards run "
        "in chunks of batch_size) or over one mini-batch of batch_size drawn each round (cheaper, noisier)",
    )
    local_epochs: int = Field(1, ge=1, description="epoch-level: local epochs per round")
    max_steps: int | None = Field(
        None, ge=1, description="epoch-level: cap on local steps per round"
    )
    clip: float | None = Field(
        0.3, gt=0, description="inf-norm clip of each estimate (reference code); null: off"
    )
    client_optimizer: ClientOptimizerConfig = ClientOptimizerConfig(
        name="adam", lr=0.01, b1=0.9, b2=0.99
    )
    server_optimizer: ServerOptimizerConfig | None = Field(
        None,
        description="default: adam lr 0.01 betas (0.9, 0.99) for batch mode, sgd lr 1 (FedAvg) for epoch mode",
    )
    shared_perturbations: bool = True
    downlink: Literal["model", "seeds"] = Field(
        "model",
        description="batch mode: send the model every round, or only the round seeds and aggregated loss "
        "differences a client missed (it rebuilds the model; the full model and optimizer state when smaller)",
    )
    precision: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="before")
    @classmethod
    def _partial_server_optimizer(cls, data: Any) -> Any:
        """``method.server_optimizer.lr=0.03`` alone tunes the mode's default optimizer (batch mode's
        Adam), rather than building an SGD from the class defaults; naming ``name`` starts afresh."""
        if (
            isinstance(data, dict)
            and isinstance(data.get("server_optimizer"), dict)
            and "name" not in data["server_optimizer"]
        ):
            base = (
                _BATCH_SERVER_OPTIMIZER
                if data.get("mode", "epoch") == "batch"
                else _EPOCH_SERVER_OPTIMIZER
            )
            data = {**data, "server_optimizer": {**base, **data["server_optimizer"]}}
        return data

    @model_validator(mode="after")
    def _defaults_and_consistency(self) -> BaffleConfig:
        if self.server_optimizer is None:
            self.server_optimizer = ServerOptimizerConfig(
                **(_BATCH_SERVER_OPTIMIZER if self.mode == "batch" else _EPOCH_SERVER_OPTIMIZER)
            )
        if (
            self.mode == "batch"
            and self.client_optimizer != type(self).model_fields["client_optimizer"].default
        ):
            raise ValueError(
                "method.client_optimizer is not used in batch mode: clients send loss differences and the server "
                "steps with method.server_optimizer; set method.server_optimizer.* instead (or method.mode=epoch)"
            )
        if "secure_aggregation" in type(self).model_fields:  # the composed section
            if self.secure_aggregation is None:  # BAFFLE's default: on where Eq. (7) sums
                self.secure_aggregation = self.mode == "batch" and self.shared_perturbations
            if self.secagg_dropout and not self.secure_aggregation:
                raise ValueError("secagg_dropout only applies with secure_aggregation=true")
            if self.secure_aggregation and self.mode == "batch" and not self.shared_perturbations:
                raise ValueError(
                    "secure_aggregation needs shared_perturbations=true: the server only learns "
                    "the sum of the loss differences, so every client must use the same perturbations"
                )
        if self.downlink == "seeds" and (self.mode != "batch" or not self.shared_perturbations):
            raise ValueError(
                "downlink=seeds rebuilds the model from the round seed and the K aggregated loss differences: "
                "it needs mode=batch and shared_perturbations=true"
            )
        return self

    @property
    def dtype(self) -> torch.dtype | None:
        return _DTYPES[self.precision]

    def zo_spec(self, workers: int | None = None) -> ZerothOrderSpec:
        """The zeroth-order estimate this config describes (BAFFLE Eq. 6: ``k``, ``sigma``,
        ``scheme``, ``directions``; ``estimator`` as the mode, ``chunk``, ``precision``), its
        fast mode split over ``workers`` threads (:func:`perturbation_threads`)."""
        return ZerothOrderSpec(
            k=self.k,
            sigma=self.sigma,
            scheme=self.scheme,
            directions=self.directions,
            mode=self.estimator,
            chunk=self.chunk,
            dtype=self.dtype,
            workers=workers,
        )


# ------------------------------------------------------------------ epoch-level


def perturbation_threads(cfg: BaffleConfig, env: MethodEnv) -> int:
    """Threads the fast estimator splits the K perturbations over (see ``perturbation_threads``)."""
    if cfg.perturbation_threads is not None:
        return cfg.perturbation_threads
    return 1 if env.workers else len(os.sched_getaffinity(0))


def zeroth_order_gradient_fn(cfg: BaffleConfig, threads: int = 1) -> Any:
    """A :data:`~fedge.methods.local.GradientFn` computing BAFFLE's local estimate."""
    spec = cfg.zo_spec(workers=threads)

    def gradient(
        model: torch.nn.Module,
        batch: tuple[torch.Tensor, torch.Tensor],
        ctx: ClientContext,
        masks: Any,
    ):
        seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator))
        params = perturbed_params(model, cfg.perturb)
        masks = perturbed_masks(masks, params)
        g = zeroth_order_gradient(
            model, F.cross_entropy, batch, spec, seed=seed, params=list(params), masks=masks
        )
        return None, clip_inf_norm(g, cfg.clip)

    return gradient


# ------------------------------------------------------------------ batch-level


class BaffleBatchClient:
    """Client side of batch-level BAFFLE (Algorithm 1, lines 11-13): K loss differences,
    forwards only, over the client's local set D_c (``delta_loss_on: local_set``, as Algorithm 1)
    or over one mini-batch drawn with the client's generator (``batch``)."""

    def __init__(self, model_fn: Any, cfg: BaffleConfig, *, threads: int = 1) -> None:
        assert cfg.server_optimizer is not None
        self.cfg, self.spec = cfg, cfg.zo_spec(workers=threads)
        self.local = LocalTraining.loader(model_fn)
        self.replica = (
            ClientReplica(
                model_fn(),
                cfg.server_optimizer.build(),
                self.spec,
                perturb=cfg.perturb,
                clip=cfg.clip,
            )
            if cfg.downlink == "seeds"
            else None
        )

    def load(
        self, message: Message, ctx: ClientContext
    ) -> tuple[torch.nn.Module, dict[str, torch.Tensor] | None]:
        """The global model W_t (received, or rebuilt from seeds and scalars) and its masks."""
        if self.replica is None:
            return self.local.load(message, ctx), self.local.masks
        model = self.replica.sync(message, ctx)
        model.train()
        ctx.meter.resident = model
        return model, self.replica.server.masks

    def loss_differences(self, message: Message, ctx: ClientContext) -> torch.Tensor:
        cfg = self.cfg
        model, masks = self.load(message, ctx)
        seed = message.config.get("seed")
        if not isinstance(seed, int):
            raise MessageError(
                f"round {ctx.rnd}, client {ctx.cid}: no perturbation seed in the server's message"
            )
        n = ctx.data.num_samples
        if cfg.delta_loss_on == "batch":
            chunks = [
                ctx.data.indices[
                    torch.randperm(n, generator=ctx.generator)[: min(cfg.batch_size, n)]
                ]
            ]
        else:  # ΔL(D_c) = Σ_chunks (n_chunk / n) ΔL(chunk): the mean loss is linear in the samples
            chunks = list(ctx.data.indices.split(cfg.batch_size))
        params = perturbed_params(model, cfg.perturb)
        masks = perturbed_masks(masks, params)
        total = torch.zeros(cfg.k, dtype=torch.float64)
        for idx in chunks:
            batch = (ctx.data.x[idx], ctx.data.y[idx])
            d = loss_differences(
                model,
                F.cross_entropy,
                batch,
                self.spec,
                seed=seed,
                params=list(params),
                masks=masks,
            )
            if len(chunks) == 1:
                return d
            total += d.to(torch.float64) * (idx.numel() / n)
        return total.to(torch.float32)

    def run(self, message: Message, ctx: ClientContext) -> Message:
        diffs = self.loss_differences(message, ctx)
        return Message({"dL": diffs}, config={"num_samples": ctx.data.num_samples})


class BaffleBatchStrategy(Strategy):
    """Server side of batch-level BAFFLE (Algorithm 1, lines 7-8 and 14-17).

    Per round: seed s_t = derive(run seed, "baffle", t) (or one seed per client when
    perturbations are not shared); broadcast (W_t, s_t); combine the clients' K loss
    differences with weights N_c/N (Eq. 7); regenerate δ_k; ĝ by Eq. (6); clip; optimizer.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: BaffleConfig,
        *,
        seed: int,
        masks: dict[str, torch.Tensor] | None = None,
    ) -> None:
        assert cfg.server_optimizer is not None
        self.model, self.cfg, self.seed = model, cfg, seed
        self.spec = cfg.zo_spec()  # the server runs no forwards: no workers
        self.server = GlobalModel(model, cfg.server_optimizer.build(), masks=masks)
        self.downlink = DownlinkHistory(cfg.k) if cfg.downlink == "seeds" else None

    weighted = True  # Eq. (7): weights N_c / N

    @property
    def global_model(self) -> GlobalModel:
        return self.server

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """A reply sums K float32 loss differences (:class:`~fedge.methods.secure.Summable`):
        only with perturbations shared through one seed, where Eq. (7) makes the sum meaningful."""
        if not self.cfg.shared_perturbations:
            raise ConfigError(
                "summing the clients' loss differences (secure aggregation, differential privacy) needs "
                "method.shared_perturbations=true: with one seed per client their sum estimates nothing"
            )
        return {"dL": (torch.Size([self.cfg.k]), torch.float32)}

    def params(self) -> dict[str, torch.Tensor]:
        """The perturbed (estimated) parameters: ``method.perturb``'s, or every trainable one."""
        return perturbed_params(self.model, self.cfg.perturb)

    def masks(self) -> dict[str, torch.Tensor] | None:
        return perturbed_masks(self.server.masks, self.params())

    def round_seed(self, rnd: int, cid: int | None = None) -> int:
        """s_t (shared) or s_{t,c} (per client); 62 bits, sent as an 8-byte integer."""
        path = ("baffle", rnd) if cid is None else ("baffle", rnd, cid)
        return derive_seed(self.seed, *path, bits=62)

    @property
    def partial_replies(self) -> bool:
        """Yes: Eq. 7's weights renormalize over the clients that replied. With ``downlink:
        seeds`` the server counts a client as holding this round's model only once its reply
        is in the update (:meth:`DownlinkHistory.confirm`); a client whose reply was lost after
        it synced is then ahead of that record and skips the rounds it already replayed."""
        return True

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        if self.downlink is not None:
            return self.downlink.messages(rnd, client_ids, self.round_seed(rnd), self.server)
        arrays = self.server.arrays()
        if self.cfg.shared_perturbations:
            return dict.fromkeys(client_ids, Message(arrays, config={"seed": self.round_seed(rnd)}))
        return {c: Message(arrays, config={"seed": self.round_seed(rnd, c)}) for c in client_ids}

    def check_reply(self, rnd: int, cid: int, reply: Message) -> tuple[torch.Tensor, int]:
        d = reply.arrays.get("dL")
        n = reply.config.get("num_samples")
        if d is None or d.shape != (self.cfg.k,) or d.dtype != torch.float32:
            got = None if d is None else (tuple(d.shape), str(d.dtype))
            raise MessageError(
                f"round {rnd}, client {cid}: expected dL of shape ({self.cfg.k},) float32, got {got}"
            )
        if not isinstance(n, int) or n < 1:
            raise MessageError(
                f"round {rnd}, client {cid}: num_samples={n!r}; expected an int >= 1"
            )
        return d, n

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        """Σ_c (N_c/N) ΔL_c (Eq. 7), then the update; per-client estimates when not shared."""
        checked = {c: self.check_reply(rnd, c, r) for c, r in replies.items()}
        if self.cfg.shared_perturbations:
            combined = combine_loss_differences(
                [d for d, _ in checked.values()], [n for _, n in checked.values()]
            )
            return self.shared_update(rnd, combined, sorted(replies))
        return self.apply(self.per_client_estimate(rnd, checked))

    def estimate(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, torch.Tensor]:
        """ĝ from the replies (Eq. 6-7), without applying it."""
        checked = {c: self.check_reply(rnd, c, r) for c, r in replies.items()}
        if not self.cfg.shared_perturbations:
            return self.per_client_estimate(rnd, checked)
        combined = combine_loss_differences(
            [d for d, _ in checked.values()], [n for _, n in checked.values()]
        )
        return self.shared_estimate(rnd, combined)

    def shared_estimate(self, rnd: int, combined: torch.Tensor) -> dict[str, torch.Tensor]:
        """ĝ (Eq. 6) from Σ_c (N_c/N) ΔL_c on the round's shared perturbations (Eq. 7), not applied."""
        return estimate_gradient(
            self.params(), combined, self.spec, seed=self.round_seed(rnd), masks=self.masks()
        )

    def per_client_estimate(
        self, rnd: int, checked: Mapping[int, tuple[torch.Tensor, int]]
    ) -> dict[str, torch.Tensor]:
        """Σ_c (N_c/N) ĝ_c, each client on its own perturbations (one regeneration per client)."""
        params = self.params()
        total = sum(n for _, n in checked.values())
        g: dict[str, torch.Tensor] = {}
        for c, (d, n) in checked.items():
            seed = self.round_seed(rnd, c)
            gc = estimate_gradient(params, d, self.spec, seed=seed, masks=self.masks())
            for k, v in gc.items():
                g[k] = g[k].add_(v, alpha=n / total) if k in g else v * (n / total)
        return g

    def shared_update(
        self, rnd: int, combined: torch.Tensor, clients: Sequence[int] = ()
    ) -> dict[str, float]:
        """ĝ (Eq. 6) from Σ_c (N_c/N) ΔL_c on the round's shared perturbations (Eq. 7), clip,
        optimizer — the step a ``downlink: seeds`` client replays from (s_t, ΔL_t); ``clients``:
        those whose ΔL is in ``combined`` (they hold this round's model)."""
        seed = self.round_seed(rnd)
        if self.downlink is None:
            return self.apply(self.shared_estimate(rnd, combined))
        g = replay_step(
            self.server, self.spec, seed, combined, perturb=self.cfg.perturb, clip=self.cfg.clip
        )
        self.downlink.confirm(rnd, clients)
        self.downlink.record(rnd, seed, combined)
        return {"estimate_inf_norm": max(float(v.abs().max()) for v in g.values())}

    def apply(self, grads: dict[str, torch.Tensor]) -> dict[str, float]:
        self.server.step(clip_inf_norm(grads, self.cfg.clip))
        return {"estimate_inf_norm": max(float(v.abs().max()) for v in grads.values())}

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        """The update from the weighted mean of the clients' ΔL (what secure aggregation yields)."""
        return self.shared_update(rnd, mean["dL"].to(torch.float32), clients)

    def eval_model(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        state = self.server.state_dict()
        if self.downlink is not None:
            state["downlink"] = self.downlink.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)
        if self.downlink is not None:
            self.downlink.load_state_dict(state["downlink"])


#: what BAFFLE can do, in both modes: its server averages the replies (K loss differences or
#: model deltas) into one global model, trained only where it is not frozen
CAPABILITIES = Capabilities(
    sums_replies=True, global_model=True, freezable=True, client_optimizer=True
)


def advice(cfg: BaffleConfig) -> list[str]:
    """What else tames a diverging BAFFLE run: its inf-norm clip of the estimate."""
    if cfg.clip is not None:
        return [f"set a smaller method.clip (now {cfg.clip})"]
    return ["turn on method.clip (now null; the reference code uses 0.3)"]


def upload(cfg: BaffleConfig) -> Literal["loss_differences", "estimate_delta"]:
    """Batch mode: K loss differences (with the seed broadcast); epoch mode: a model delta."""
    return "loss_differences" if cfg.mode == "batch" else "estimate_delta"


#: BAFFLE's own defaults for mechanism options: EMA 0.995 (Section 4.1); secure aggregation
#: null, i.e. on in batch mode, whose K loss differences Eq. (7) sums (resolved by the config)
DEFAULTS: dict[str, Any] = {"ema": 0.995, "secure_aggregation": None}


@declare_method(
    "baffle",
    "BAFFLE: forward-only zeroth-order estimates, K loss differences or model deltas uploaded",
    config=BaffleConfig,
    capabilities=CAPABILITIES,
    defaults=DEFAULTS,
    advice=advice,
    upload=upload,
)
def build(
    cfg: BaffleConfig, env: MethodEnv, *, masks: dict[str, torch.Tensor] | None = None
) -> MethodBuild:
    """Build BAFFLE's bare strategy and client program (the composer adds secure aggregation,
    DP, EMA and freezing); ``masks`` (from pruning) make the global model sparse from the start."""
    assert cfg.server_optimizer is not None
    if (
        cfg.perturb is not None
    ):  # checked here, before a run directory is made, not in the first round
        try:
            perturbed_params(env.model_fn(), cfg.perturb)
        except ConfigError as exc:
            raise ConfigError(f"method.perturb={cfg.perturb}: {exc}") from None
    strategy: Strategy
    program: Any
    if cfg.mode == "batch":
        strategy = BaffleBatchStrategy(env.model_fn(), cfg, seed=env.seed, masks=masks)
        program = BaffleBatchClient(env.model_fn, cfg, threads=perturbation_threads(cfg, env))
        if not cfg.secure_aggregation:
            warnings.warn(
                "method.secure_aggregation=false: the server sees each client's K loss differences, i.e. K "
                "directional derivatives of the loss on that client's data (BAFFLE relies on secure aggregation, "
                "Eq. 7); turn it on unless you are measuring exactly this",
                PrivacyWarning,
                stacklevel=2,
            )
    else:
        strategy = DeltaAveraging(
            env.model_fn(), cfg.server_optimizer.build(), replies_are_gradients=False, masks=masks
        )
        program = LocalTraining.from_config(
            env.model_fn,
            cfg,
            gradient_fn=zeroth_order_gradient_fn(cfg, perturbation_threads(cfg, env)),
        )
    return MethodBuild(strategy, program)
