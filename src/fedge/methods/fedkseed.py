"""FedKSeed: federated zeroth-order training whose messages are K scalars each way (Qin et al.,
ICML 2024, "Federated full-parameter tuning of billion-sized language models with communication
cost under 18 kilobytes", arXiv:2312.06353v3, Algorithm 1).

Server and clients share a pool of K candidate directions z_0..z_{K-1}, direction j regenerated
from (pool seed, j, parameter) (:mod:`fedge.estimators.directions`, Gaussian, from the run's
``draws``: torch's generator or the portable one every machine rebuilds alike). In a round each
sampled client starts from the global model w_t and runs ``local_steps`` steps; each step draws
one index j uniformly from the pool and a mini-batch, takes the two-point (central) projected
gradient g = [L(w + εz_j) − L(w − εz_j)] / (2ε) (:func:`~fedge.estimators.loss_differences` with
one direction) and steps w ← w − η g z_j, adding g to its j-th accumulator. It uploads the K
accumulators. The server averages them per seed with weights N_c/N, ḡ, and steps

    w_{t+1} = w_t − η Σ_j ḡ_j z_j,

and a client rebuilds w_{t+1} from its copy of w_t and ḡ alone. The server keeps the per-round
ḡ (BAFFLE's :class:`~fedge.methods.replay.DownlinkHistory`), so a client that missed
rounds replays the ones it missed and holds the server's model bit for bit; every client starts
from the seeded initial model, which it builds itself (under ``warm_start`` it cannot build the
pretrained start, so its first message is the model, metered in its bytes down). The rebuild is exact only with a constant
η (the reference code's assumption): ``method.lr_decay`` other than 1 is refused.

Bytes, per client a round, each message within 64 bytes of framing: down, the 8-byte pool seed
and 4K bytes (ḡ in float32) per round the client missed (the model instead, when that is smaller); up, 4K bytes (its K accumulators in
float32), or under secure aggregation the masked [N_c·g, N_c], K + 1 elements of the protocol's
64-bit ring, 8(K + 1) bytes: that is FedKSeed's formula under secure aggregation. The metrics
log it as ``payload_bytes_up`` (and ḡ's messages as ``payload_bytes_down``), apart from the
protocol's key agreement and unmasking, ``secagg_bytes_*`` (:mod:`fedge.methods.secure`).

The scalars are summed, so secure aggregation composes and is on by default (a client's scalars
along public directions are directional derivatives of the loss on its data); DP on the summed
scalars, freezing (only trainable coordinates are perturbed) and EMA evaluation compose too.
FedKSeed-Pro (``sampling: pro``, Sec. 3.4) draws seed j with probability softmax(min-max
normalized Σ_t |ḡ_{t,j}|) (:func:`pro_probabilities`); a client sums the |ḡ| it replays, so the
scores cost no extra bytes (the model's fallback message carries them). Paper-vs-code choices: ``docs/methods/fedkseed.md``.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from fedge.core import transforms as T
from fedge.core.context import ClientContext
from fedge.core.errors import DivergenceError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Strategy
from fedge.core.rng import Draws, check_draws, derive_seed
from fedge.core.threads import torch_threads
from fedge.estimators import ZerothOrderSpec, loss_differences
from fedge.estimators.directions import Directions, make_directions
from fedge.estimators.lean import LossFn
from fedge.methods.base import (
    GlobalModel,
    MethodBuild,
    MethodConfigBase,
    MethodEnv,
    check_scalar_reply,
    load_arrays,
    model_arrays,
    unpack_model_arrays,
    warn_scalars_unprotected,
)
from fedge.methods.registry import declare_method
from fedge.methods.replay import DownlinkHistory, perturbed_params
from fedge.methods.spec import Capabilities, SeedScalars

__all__ = [
    "CAPABILITIES",
    "DEFAULTS",
    "FedKSeedClient",
    "FedKSeedConfig",
    "FedKSeedStrategy",
    "build",
    "pool_update",
    "pro_probabilities",
    "projected_gradient",
    "seed_scalars",
]

_MODEL = "w/"
_SCORE = "pro/score"  # Σ_t |ḡ_t|, FedKSeed-Pro's seed importance, in the client's state


def pro_probabilities(scores: torch.Tensor) -> torch.Tensor:
    """FedKSeed-Pro's sampling law: softmax of the min-max normalized seed scores Σ_t |ḡ_{t,j}|
    (the mean over rounds normalizes to the same); uniform while all scores are equal."""
    s = scores.to(torch.float64)
    span = float(s.max() - s.min())
    return torch.softmax((s - s.min()) / span if span > 0 else torch.zeros_like(s), dim=0)


class FedKSeedConfig(MethodConfigBase):
    """FedKSeed's own keys; the composer attaches secure aggregation, EMA and freezing."""

    if TYPE_CHECKING:  # attached by the composer
        secure_aggregation: bool | None

    name: Literal["fedkseed"] = "fedkseed"
    k: int = Field(1024, ge=1, description="K: the pool of candidate seeds (directions)")
    eps: float = Field(1e-3, gt=0, description="ε: the two-point perturbation scale")
    lr: float = Field(0.01, gt=0, description="η: the constant learning rate, local and global")
    lr_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="must be 1: the clients' rebuild from the K scalars needs a constant η",
    )
    local_steps: int = Field(10, ge=1, description="τ: local zeroth-order steps per round")
    batch_size: int = Field(32, ge=1, description="samples per local step")
    sampling: Literal["uniform", "pro"] = Field(
        "uniform",
        description="how a step draws its seed from the pool: uniformly (FedKSeed) or by the softmax of "
        "the min-max normalized Σ_t |ḡ_j| of the rounds so far (FedKSeed-Pro)",
    )

    @model_validator(mode="after")
    def _constant_lr(self) -> FedKSeedConfig:
        if self.lr_decay != 1.0:
            raise ValueError(
                f"method.lr_decay={self.lr_decay}: FedKSeed needs a constant learning rate, since every "
                "client rebuilds w_(t+1) = w_t − η Σ_j ḡ_j z_j from the K averaged scalars with one η; "
                "set method.lr_decay=1"
            )
        if "secure_aggregation" in type(self).model_fields and self.secure_aggregation is None:
            self.secure_aggregation = True
        return self


#: the server averages the clients' K scalars into one global model; only trainable (not
#: frozen) coordinates are perturbed; the clients' steps are plain SGD with η (no optimizer key)
CAPABILITIES = Capabilities(sums_replies=True, global_model=True, freezable=True)

#: secure aggregation null, i.e. on: the server then sees only the sum of the K scalars
DEFAULTS: dict[str, Any] = {"secure_aggregation": None}


def _one_direction(pool: Directions, j: int) -> Directions:
    """Pool direction j as the single direction (k = 0) of a one-direction estimate."""

    def draw(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> torch.Tensor:
        return pool.draw(seed, [j] * len(ks), name, shape)

    return Directions("gaussian", 1, draw, torch.ones(1, dtype=torch.float64), pool.draws)


def projected_gradient(
    model: torch.nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    pool: Directions,
    pool_seed: int,
    j: int,
    eps: float,
    params: Sequence[str],
    loss_fn: LossFn = F.cross_entropy,
) -> float:
    """g = [L(w + εz_j) − L(w − εz_j)] / (2ε) on ``batch`` (forwards only, w left as it was),
    L = ``loss_fn`` of the model's output; the difference is taken in float64, returned as float32."""
    one = _one_direction(pool, j)
    spec = ZerothOrderSpec(k=1, sigma=eps, scheme="central", directions=one, draws=pool.draws)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # a step whose two losses tie is a zero scalar, not an error
        d = loss_differences(model, loss_fn, batch, spec, seed=pool_seed, params=list(params))
    return float(d[0]) / (2 * eps)


def pool_update(
    params: Mapping[str, torch.Tensor], gbar: torch.Tensor, pool: Directions, pool_seed: int
) -> dict[str, torch.Tensor]:
    """Σ_j ḡ_j z_j per parameter (float32; 64 directions at a time), on one thread."""
    k = gbar.numel()
    out: dict[str, torch.Tensor] = {}
    # the server and every client sum the K directions on one thread: bit-equal models
    with torch_threads(1):
        for name, p in params.items():
            acc = torch.zeros(p.numel())
            for start in range(0, k, 64):
                ks = range(start, min(k, start + 64))
                z = pool.draw(pool_seed, ks, name, p.shape).view(len(ks), -1)
                acc.addmv_(z.t(), gbar[start : start + len(ks)])
            out[name] = acc.view(p.shape).to(p.dtype)
    return out


def _pool(
    model: torch.nn.Module, k: int, draws: Draws
) -> tuple[dict[str, torch.Tensor], Directions]:
    params = perturbed_params(model, None)
    shapes = {n: p.shape for n, p in params.items()}
    return params, make_directions("gaussian", shapes, k, draws=draws)


def seed_scalars(
    cfg: FedKSeedConfig, config: Mapping[str, Any], arrays: Mapping[str, Any], draws: str
) -> SeedScalars:
    """A client's upload as its observer reads it: the K accumulators g along the pool of the
    message's seed (drawn from the run's ``draws``, as :func:`_pool`), D = Σ_j g_j z_j; its
    local steps moved its model by −η D exactly (one constant η)."""
    seed = config.get("seed")
    if not isinstance(seed, int) or "g" not in arrays:
        raise MessageError(
            f"a FedKSeed upload is read with its message's pool seed and the reply's K scalars g; "
            f"got seed={seed!r} and arrays {sorted(arrays)}"
        )
    return SeedScalars(seed, arrays["g"], 1, cfg.lr, check_draws(draws))


class FedKSeedStrategy(Strategy):
    """Server side: per round, the ḡ of the previous rounds each client missed down; the
    weighted mean ḡ of the clients' K accumulators up; w ← w − η Σ_j ḡ_j z_j."""

    weighted = True  # ḡ = Σ_c (N_c / N) g_c

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: FedKSeedConfig,
        *,
        seed: int,
        population: int | None,
        draws: Draws = "torch",
    ) -> None:
        self.model, self.cfg, self.draws = model, cfg, check_draws(draws)
        self.pool_seed = derive_seed(seed, "fedkseed", bits=62)
        self.server = GlobalModel(model, T.sgd(cfg.lr))
        self.downlink = DownlinkHistory(cfg.k, population=population)
        self.scores = torch.zeros(cfg.k, dtype=torch.float64)  # Σ_t |ḡ_t| (FedKSeed-Pro)

    @property
    def global_model(self) -> GlobalModel:
        return self.server

    @property
    def partial_replies(self) -> bool:
        return True

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return {"g": (torch.Size([self.cfg.k]), torch.float32)}

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        out = self.downlink.messages(rnd, client_ids, self.pool_seed, self.server)
        for c, m in out.items():  # the pool seed is the run's: the missed rounds' ḡ only
            if "replay_dL" in m.arrays:
                g = m.arrays["replay_dL"]
                out[c] = Message({"replay_dL": g} if len(g) else {}, config=dict(m.config))
            elif self.cfg.sampling == "pro":  # the model: the seed scores with it
                out[c] = Message({**m.arrays, _SCORE: self.scores.clone()}, config=dict(m.config))
        return out

    def check_reply(self, rnd: int, cid: int, reply: Message) -> tuple[torch.Tensor, int]:
        return check_scalar_reply(reply, "g", self.cfg.k, who=f"round {rnd}, client {cid}")

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        checked = [self.check_reply(rnd, c, r) for c, r in replies.items()]
        total = sum(n for _, n in checked)
        mean = sum((n / total) * g.to(torch.float64) for g, n in checked)
        return self.update(rnd, torch.as_tensor(mean).to(torch.float32), sorted(replies))

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        return self.update(rnd, mean["g"].to(torch.float32), clients)

    def update(self, rnd: int, gbar: torch.Tensor, clients: Sequence[int]) -> dict[str, float]:
        """w ← w − η Σ_j ḡ_j z_j, recorded for the clients' replay."""
        step(self.server, gbar, self.cfg.k, self.pool_seed, self.draws)
        self.scores += gbar.abs().to(torch.float64)
        self.downlink.confirm(rnd, clients)
        self.downlink.record(rnd, self.pool_seed, gbar)
        return {"scalar_inf_norm": float(gbar.abs().max())}

    def round_skipped(self, rnd: int) -> None:
        """The engine put this strategy back as before round ``rnd`` (too few replies). Its
        clients keep the model they synced to; before any completed round that is the seeded
        initial model, so the first round stays this one (else they would hold an older round
        than the one the server replays from)."""
        if self.downlink.first is None:
            self.downlink.first = rnd

    def eval_model(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.server.state_dict(),
            "downlink": self.downlink.state_dict(),
            "scores": self.scores.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)
        self.downlink.load_state_dict(state["downlink"])
        self.scores = state["scores"].clone()


def step(server: GlobalModel, gbar: torch.Tensor, k: int, pool_seed: int, draws: Draws) -> None:
    """One round's global update, the same on the server and in every client's rebuild."""
    params, pool = _pool(server.model, k, draws)
    server.step(pool_update(params, gbar, pool, pool_seed))


class FedKSeedClient:
    """Client side: rebuild w_t from the held copy and the missed ḡ; τ zeroth-order steps on
    seeds drawn from the pool; the K accumulated scalars up."""

    def __init__(self, model_fn: Any, cfg: FedKSeedConfig, draws: Draws = "torch") -> None:
        self.model_fn, self.cfg, self.draws = model_fn, cfg, check_draws(draws)
        self.replica = GlobalModel(model_fn(), T.sgd(cfg.lr))

    def sync(self, message: Message, ctx: ClientContext) -> torch.nn.Module:
        """w_t: the held copy (the initial model if none) with the missed rounds replayed, or
        the full model when the server sent it."""
        who = f"round {ctx.rnd}, client {ctx.cid}"
        to, seed = message.config.get("sync_to"), message.config.get("seed")
        if not isinstance(to, int) or not isinstance(seed, int):
            raise MessageError(
                f"{who}: the server's message names no model round (sync_to={to!r}) or pool "
                f"seed (seed={seed!r})"
            )
        model = self.replica.model
        score = torch.zeros(self.cfg.k, dtype=torch.float64)
        if "replay_dL" in message.arrays or not message.arrays:  # the missed rounds' ḡ, or none
            frm = message.config.get("sync_from")
            if message.config.get("new"):  # the server never had a reply: replay from W_first
                ctx.state.clear()
            at = ctx.state.get("at", frm)  # no copy held: the seeded initial model, W_first
            if "at" in ctx.state:
                held = {k[len(_MODEL) :]: v for k, v in ctx.state.items() if k.startswith(_MODEL)}
                load_arrays(model, held, who=who)
            else:
                load_arrays(model, model_arrays(self.model_fn()), who=who)
            if not isinstance(frm, int) or not isinstance(at, int) or not frm <= at <= to:
                raise MessageError(
                    f"{who}: the server replays rounds {frm!r} to {to} but this client holds the "
                    f"model of round {at}; its state is out of step with the server's"
                )
            gs = message.arrays.get("replay_dL", torch.zeros(0, self.cfg.k))
            if gs.dim() != 2 or gs.shape[1] != self.cfg.k or len(gs) != to - frm:
                raise MessageError(
                    f"{who}: replay_dL has shape {tuple(gs.shape)}; expected ({to - frm}, {self.cfg.k})"
                )
            score = ctx.state.get(_SCORE, score).clone()
            for g in gs[at - frm :]:  # rounds this client replayed already are skipped
                step(self.replica, g, self.cfg.k, seed, self.draws)
                score += g.abs().to(torch.float64)
        else:
            score = message.arrays.get(_SCORE, score).to(torch.float64)
            model_part = {
                k: v for k, v in message.arrays.items() if not k.startswith(("opt/", _SCORE))
            }
            arrays, _ = unpack_model_arrays(model_part, model.state_dict(), who=who)
            load_arrays(model, arrays, who=who)
        ctx.state.clear()
        ctx.state.update({_MODEL + k: v for k, v in model_arrays(model).items()}, at=to)
        if self.cfg.sampling == "pro":
            ctx.state[_SCORE] = score
        return model

    def run(self, message: Message, ctx: ClientContext) -> Message:
        cfg = self.cfg
        model = copy.deepcopy(self.sync(message, ctx))
        seed = int(message.config["seed"])  # type: ignore[arg-type]  # checked by sync
        model.train()
        ctx.meter.resident = model
        params, pool = _pool(model, cfg.k, self.draws)
        acc = torch.zeros(cfg.k, dtype=torch.float64)
        n = ctx.data.num_samples
        law = pro_probabilities(ctx.state[_SCORE]) if cfg.sampling == "pro" else None
        for _ in range(cfg.local_steps):
            if law is None:
                j = int(torch.randint(cfg.k, (1,), generator=ctx.generator))
            else:
                j = int(torch.multinomial(law, 1, generator=ctx.generator))
            idx = ctx.data.indices[torch.randperm(n, generator=ctx.generator)[: cfg.batch_size]]
            batch = (ctx.data.x[idx], ctx.data.y[idx])
            g = projected_gradient(model, batch, pool, seed, j, cfg.eps, list(params))
            if not math.isfinite(g):
                raise DivergenceError(
                    f"round {ctx.rnd}, client {ctx.cid}: the projected gradient is {g}; "
                    f"lower method.lr (now {cfg.lr}) or method.eps (now {cfg.eps})",
                    round=ctx.rnd,
                    cause=f"client {ctx.cid}'s projected gradient is {g}",
                )
            with torch.no_grad():
                for name, p in params.items():
                    p.add_(pool.draw(seed, [j], name, p.shape)[0], alpha=-cfg.lr * g)
            acc[j] += g
        return Message({"g": acc.to(torch.float32)}, config={"num_samples": n})


@declare_method(
    "fedkseed",
    "FedKSeed: zeroth-order local steps on seeds from a shared pool of K, K scalars each way",
    config=FedKSeedConfig,
    capabilities=CAPABILITIES,
    defaults=DEFAULTS,
    upload=lambda cfg: "seed_scalars",
    seed_scalars=seed_scalars,
    advice=lambda cfg: [f"lower method.eps (now {cfg.eps})"],
)
def build(cfg: FedKSeedConfig, env: MethodEnv) -> MethodBuild:
    """FedKSeed's bare strategy and client program (the composer adds secure aggregation)."""
    if not getattr(cfg, "secure_aggregation", True):
        warn_scalars_unprotected("K scalars")
    return MethodBuild(
        FedKSeedStrategy(
            env.model_fn(),
            cfg,
            seed=env.seed,
            population=len(env.client_sizes) if env.seeded_start else None,
            draws=env.draws,
        ),
        FedKSeedClient(env.model_fn, cfg, env.draws),
    )
