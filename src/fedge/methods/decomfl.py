"""DeComFL: federated zeroth-order training whose messages are a few scalars each way, whatever
the model's dimension (Li, Ying, Liu, Dong and Yang, ICLR 2025, "Achieving dimension-free
communication in federated learning via zeroth-order optimization", arXiv:2405.15861,
Algorithm 1; reference code github.com/ZidongLiu/DeComFL).

In round r the server's seed s_r (derived from r and one run-level seed, the 8 bytes every
message carries) names the round's directions z_{r,k,p}, P of them for
each of the K local steps (k = 0..K−1, p = 0..P−1: direction kP + p of s_r, Gaussian, drawn
through :mod:`fedge.estimators.directions` with the run's ``draws``, torch or portable). Every
sampled client i starts from the global model x_r (rebuilt, below) and runs K local steps on its
own mini-batches ξ, each with the two-point (central) scalars along that step's directions,

    g_{i,r,k,p} = [f_i(x_{i,r,k} + μ z_{r,k,p}; ξ) − f_i(x_{i,r,k} − μ z_{r,k,p}; ξ)] / (2μ)

(``scheme: forward``: [f_i(x + μz) − f_i(x)] / μ), and steps x_{i,r,k+1} = x_{i,r,k} −
η (1/P) Σ_p g_{i,r,k,p} z_{r,k,p}. It uploads the K × P scalars. The server averages them per
(step, direction), ḡ_{r,k,p} = Σ_i (N_i/N) g_{i,r,k,p} (the paper's 1/m with equal N_i), and
replays the K steps from x_r with ḡ in place of g:

    x_{r+1} = x_r − η Σ_k (1/P) Σ_p ḡ_{r,k,p} z_{r,k,p}.

A client rebuilds x_{r+1} from its copy of x_r and (s_r, ḡ_r) alone, and one that missed rounds
r'..r−1 replays their (s, ḡ) in order (the paper's model reconstruction): the server keeps the
history (:class:`~fedge.methods.replay.DownlinkHistory`, shared with BAFFLE's seeds downlink) and
each client's rebuild runs the server's own update (:class:`RoundSteps`, one
:func:`~fedge.methods.replay.replay_step` per local step, on one thread), so it holds the
server's model bit for bit. Every client can build the seeded initial model x_1, so no model
ever travels while replaying the missed rounds costs less than it (under ``warm_start`` a
client cannot build the pretrained start: its first message is the model, in its bytes down).

The step is the configured ``optimizer`` (default SGD with η, the paper's) applied to
ĝ_{r,k} = (1/P) Σ_p g_{r,k,p} z_{r,k,p}; its state (momentum, Adam's moments, the ``lr_decay``
count) is part of what both sides replay, so any learning rate, schedule or optimizer keeps the
rebuild exact, and a client's local steps start from the global optimizer state, as the
reference code's do. The estimate is BAFFLE's Stein estimator with K = P, σ = μ on a scalar
ΔL = c·μ·g, so DeComFL with one local step is batch-level BAFFLE with ``downlink: seeds``
(bit for bit where c·μ is a power of two).

Bytes, per client a round, each message within 64 bytes of framing: down, the 8-byte run seed
and 4KP bytes per round the client missed (that round's averaged scalars in float32; its round
seed is derived; the model instead, when that is smaller); up, 4KP bytes (the K × P scalars in float32), or under secure aggregation the
masked [N_i·g, N_i], KP + 1 elements of the protocol's 64-bit ring, 8(KP + 1) bytes: that is
DeComFL's formula under secure aggregation. The metrics log it as ``payload_bytes_up`` (and
the scalars' messages down as ``payload_bytes_down``), apart from the protocol's key agreement
and unmasking, ``secagg_bytes_*`` (:mod:`fedge.methods.secure`).

The scalars are summed, so secure aggregation composes and is on by default (a client's
scalars along public directions are directional derivatives of the loss on its data); DP on
the summed scalars, freezing and EMA evaluation compose too. Paper-vs-code choices:
``docs/methods/decomfl.md``.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from fedge.core.context import ClientContext
from fedge.core.errors import DivergenceError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Strategy
from fedge.core.rng import Draws, check_draws, derive_seed
from fedge.estimators import ZerothOrderSpec, combine_loss_differences, loss_differences
from fedge.estimators.directions import Directions
from fedge.estimators.perturbation import normal_chunk
from fedge.methods.base import (
    GlobalModel,
    MethodBuild,
    MethodConfigBase,
    MethodEnv,
    ServerOptimizerConfig,
    check_scalar_reply,
    warn_scalars_unprotected,
)
from fedge.methods.registry import declare_method
from fedge.methods.replay import ClientReplica, DownlinkHistory, perturbed_params, replay_step
from fedge.methods.spec import Capabilities, SeedScalars

__all__ = [
    "CAPABILITIES",
    "DEFAULTS",
    "DeComFLClient",
    "DeComFLConfig",
    "DeComFLStrategy",
    "RoundSteps",
    "build",
    "round_seed",
    "seed_scalars",
]

_KEY = "replay_g"  # the missed rounds' averaged scalars in a replay message


class DeComFLConfig(MethodConfigBase):
    """DeComFL's own keys; the composer attaches secure aggregation, EMA and freezing."""

    if TYPE_CHECKING:  # attached by the composer
        secure_aggregation: bool | None

    name: Literal["decomfl"] = "decomfl"
    p: int = Field(5, ge=1, description="P: directions (scalars) per local step")
    mu: float = Field(1e-3, gt=0, description="μ: the perturbation scale of the two-point scalar")
    scheme: Literal["central", "forward"] = Field(
        "central",
        description="two-point scalar: central [f(x+μz) − f(x−μz)]/(2μ), 2P forwards a step, or "
        "forward [f(x+μz) − f(x)]/μ, P + 1",
    )
    local_steps: int = Field(
        5, ge=1, description="K: local steps per round, each on its own P directions"
    )
    batch_size: int = Field(32, ge=1, description="samples per local step")
    optimizer: ServerOptimizerConfig = Field(
        default_factory=lambda: ServerOptimizerConfig(name="sgd", lr=1e-3),
        description="the step on ĝ = (1/P) Σ_p g_p z_p, run by the clients' local steps and the "
        "server's replay alike (default: SGD with η = 1e-3, the paper's); any optimizer, "
        "schedule or momentum keeps the rebuild exact, its state being replayed too",
    )
    clip: float | None = Field(
        None, gt=0, description="inf-norm clip of each step's ĝ (BAFFLE's); null: off (paper)"
    )
    estimator: Literal["lean", "fast", "jvp"] = Field(
        "fast",
        description="lean (least memory) or fast (perturbations batched or split over threads: "
        "every usable core in the engine's process, 1 with clients.workers > 0), or jvp (the "
        "exact directional derivatives ∇f·z by forward-mode differentiation, not inference only)",
    )

    @model_validator(mode="after")
    def _secure_by_default(self) -> DeComFLConfig:
        if "secure_aggregation" in type(self).model_fields and self.secure_aggregation is None:
            self.secure_aggregation = True
        return self

    @property
    def scalars(self) -> int:
        """K × P: the scalars a client uploads a round (and a missed round costs down)."""
        return self.local_steps * self.p


#: the server averages the clients' K × P scalars into one global model; only trainable (not
#: frozen) coordinates are perturbed; the step is the method's ``optimizer`` on both sides
CAPABILITIES = Capabilities(sums_replies=True, global_model=True, freezable=True)

#: secure aggregation null, i.e. on: the server then sees only the sum of the scalars
DEFAULTS: dict[str, Any] = {"secure_aggregation": None}


@dataclass(frozen=True)
class _Offset:
    """A direction source read from direction ``offset`` on: index k draws ``offset + k``."""

    draw: Any  # (seed, ks, name, shape) -> (len(ks), *shape)
    offset: int

    def __call__(
        self, seed: int, ks: Sequence[int], name: str, shape: Sequence[int]
    ) -> torch.Tensor:
        return self.draw(seed, [self.offset + int(k) for k in ks], name, shape)


@dataclass(frozen=True)
class RoundSteps:
    """One DeComFL round's update of a global model from (s_r, the K × P scalars): K steps,
    step k the ``optimizer`` on ĝ_k = (1/P) Σ_p g_{k,p} z_{k,p} (z_{k,p}: direction kP + p of
    s_r), inf-norm clipped to ``clip``. The server's update, every client's replay (a
    :data:`~fedge.methods.replay.RoundUpdate`) and, step by step, the clients' local steps."""

    p: int
    local_steps: int
    mu: float
    scheme: Literal["central", "forward"]
    clip: float | None
    draws: Draws = "torch"
    estimator: Literal["lean", "fast", "jvp"] = "lean"

    @property
    def scale(self) -> float:
        """c·μ: a scalar g is ΔL / (c·μ) with c = 2 (central) or 1 (forward)."""
        return (2.0 if self.scheme == "central" else 1.0) * self.mu

    def spec(self, step: int, workers: int | None = None) -> ZerothOrderSpec:
        """Step ``step``'s estimate: BAFFLE's Stein estimator with K = P, σ = μ, on directions
        step·P .. step·P + P − 1 of the round seed (step 0: BAFFLE's own directions)."""
        directions = Directions(
            "gaussian",
            self.p,
            _Offset(normal_chunk(self.draws), step * self.p),
            torch.full((self.p,), 1.0 / self.p, dtype=torch.float64),
            self.draws,
        )
        return ZerothOrderSpec(
            k=self.p,
            sigma=self.mu,
            scheme=self.scheme,
            directions=directions,
            draws=self.draws,
            mode=self.estimator,
            workers=workers,
        )

    def step(self, server: GlobalModel, seed: int, step: int, g: torch.Tensor) -> None:
        """x ← optimizer(ĝ), ĝ = (1/P) Σ_p g_p z_{step,p}: BAFFLE's Eq. (6) on ΔL = c·μ·g."""
        replay_step(server, self.spec(step), seed, g * self.scale, perturb=None, clip=self.clip)

    def __call__(self, server: GlobalModel, seed: int, scalars: torch.Tensor) -> None:
        for k in range(self.local_steps):
            self.step(server, seed, k, scalars[k * self.p : (k + 1) * self.p])


def round_seed(base: int, rnd: int) -> int:
    """s_r: round ``rnd``'s seed from the run's DeComFL seed ``base`` (sent in every message), so
    only scalars travel; 62 bits."""
    return derive_seed(base, rnd, bits=62)


def seed_scalars(
    cfg: DeComFLConfig, config: Mapping[str, Any], arrays: Mapping[str, Any], draws: str
) -> SeedScalars:
    """A client's upload as its observer reads it: the K × P scalars g along directions
    0..KP−1 of the round seed s_r (step k's are kP..kP+P−1, :meth:`RoundSteps.spec`), D =
    (1/P) Σ_{k,p} g_{k,p} z_{k,p}, the sum of its steps' estimates ĝ_k; with plain SGD (no
    momentum, no clip) its local steps moved its model by −η D."""
    base, rnd = config.get("seed"), config.get("sync_to")
    if not isinstance(base, int) or not isinstance(rnd, int) or "g" not in arrays:
        raise MessageError(
            f"a DeComFL upload is read with its message's seed and round (sync_to) and the "
            f"reply's scalars g; got seed={base!r}, sync_to={rnd!r} and arrays {sorted(arrays)}"
        )
    return SeedScalars(
        round_seed(base, rnd), arrays["g"], cfg.p, cfg.optimizer.lr, check_draws(draws)
    )


def round_steps(cfg: DeComFLConfig, draws: Draws = "torch") -> RoundSteps:
    return RoundSteps(cfg.p, cfg.local_steps, cfg.mu, cfg.scheme, cfg.clip, draws, cfg.estimator)


class DeComFLStrategy(Strategy):
    """Server side: per round, the seed s_r and the (s, ḡ) of the rounds each client missed
    down; the weighted mean ḡ of the clients' K × P scalars up; K replayed steps."""

    weighted = True  # ḡ = Σ_i (N_i / N) g_i

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: DeComFLConfig,
        *,
        seed: int,
        population: int | None,
        draws: Draws = "torch",
    ) -> None:
        self.model, self.cfg = model, cfg
        self.base = derive_seed(seed, "decomfl", bits=62)  # in every message's config
        self.steps = round_steps(cfg, draws)
        self.server = GlobalModel(model, cfg.optimizer.build())
        self.downlink = DownlinkHistory(cfg.scalars, key=_KEY, population=population)

    @property
    def global_model(self) -> GlobalModel:
        return self.server

    @property
    def partial_replies(self) -> bool:
        """Yes: the weights renormalize over the clients that replied; a client counts as
        holding the round's model once its reply is in the update (as BAFFLE's seeds downlink)."""
        return True

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return {"g": (torch.Size([self.cfg.scalars]), torch.float32)}

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        out = self.downlink.messages(rnd, client_ids, self.base, self.server)
        for c, m in out.items():  # a replay: the missed rounds' ḡ (their seeds are derived)
            if _KEY in m.arrays:
                g = m.arrays[_KEY]
                out[c] = Message({_KEY: g} if len(g) else {}, config=dict(m.config))
        return out

    def check_reply(self, rnd: int, cid: int, reply: Message) -> tuple[torch.Tensor, int]:
        return check_scalar_reply(reply, "g", self.cfg.scalars, who=f"round {rnd}, client {cid}")

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        """ḡ = Σ_i (N_i/N) g_i per (step, direction), then the K steps."""
        checked = [self.check_reply(rnd, c, r) for c, r in replies.items()]
        gbar = combine_loss_differences([g for g, _ in checked], [n for _, n in checked])
        return self.update(rnd, gbar, sorted(replies))

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        """The update from the weighted mean of the scalars (what secure aggregation yields)."""
        return self.update(rnd, mean["g"].to(torch.float32), clients)

    def update(self, rnd: int, gbar: torch.Tensor, clients: Sequence[int]) -> dict[str, float]:
        """x_{r+1} from x_r and ḡ_r (:class:`RoundSteps`), recorded for the clients' replay."""
        seed = round_seed(self.base, rnd)
        self.steps(self.server, seed, gbar)
        self.downlink.confirm(rnd, clients)
        self.downlink.record(rnd, seed, gbar)
        return {"scalar_inf_norm": float(gbar.abs().max())}

    def eval_model(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {**self.server.state_dict(), "downlink": self.downlink.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)
        self.downlink.load_state_dict(state["downlink"])


class DeComFLClient:
    """Client side: rebuild x_r (and the optimizer state) from the held copy and the missed
    rounds; K local steps on the round's directions; the K × P scalars up."""

    def __init__(
        self, model_fn: Any, cfg: DeComFLConfig, *, threads: int = 1, draws: Draws = "torch"
    ) -> None:
        self.cfg, self.threads = cfg, threads
        self.steps = round_steps(cfg, draws)
        self.replica = ClientReplica(
            model_fn(),
            cfg.optimizer.build(),
            self.steps,
            k=cfg.scalars,
            key=_KEY,
            initial=model_fn,
            round_seed=round_seed,
        )

    def scalars(
        self,
        local: GlobalModel,
        seed: int,
        step: int,
        batch: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """g_{step,p} = ΔL_p / (c·μ) on ``batch`` at the local model (forwards only)."""
        params = list(perturbed_params(local.model, None))
        spec = self.steps.spec(step, workers=self.threads)
        d = loss_differences(local.model, F.cross_entropy, batch, spec, seed=seed, params=params)
        return d / self.steps.scale

    def run(self, message: Message, ctx: ClientContext) -> Message:
        cfg = self.cfg
        model = self.replica.sync(message, ctx)
        base, rnd = message.config.get("seed"), message.config.get("sync_to")
        if not isinstance(base, int) or not isinstance(rnd, int):
            raise MessageError(
                f"round {ctx.rnd}, client {ctx.cid}: the server's message names no seed "
                f"(seed={base!r}) or round (sync_to={rnd!r})"
            )
        seed = round_seed(base, rnd)
        local = GlobalModel(copy.deepcopy(model), self.replica.server.tx)
        local.opt_state = copy.deepcopy(self.replica.server.opt_state)
        local.model.train()
        ctx.meter.resident = local.model
        n = ctx.data.num_samples
        out = torch.empty(cfg.scalars)
        for k in range(cfg.local_steps):
            idx = ctx.data.indices[
                torch.randperm(n, generator=ctx.generator)[: min(cfg.batch_size, n)]
            ]
            g = self.scalars(local, seed, k, (ctx.data.x[idx], ctx.data.y[idx]))
            if not all(math.isfinite(v) for v in g.tolist()):
                raise DivergenceError(
                    f"round {ctx.rnd}, client {ctx.cid}: a two-point scalar of local step {k} is "
                    f"not finite; lower method.optimizer.lr (now {cfg.optimizer.lr}) or method.mu "
                    f"(now {cfg.mu})",
                    round=ctx.rnd,
                    cause=f"a two-point scalar of client {ctx.cid}'s local step {k} is not finite",
                )
            out[k * cfg.p : (k + 1) * cfg.p] = g
            if k + 1 < cfg.local_steps:  # the last step's model is never used
                self.steps.step(local, seed, k, g)
        return Message({"g": out}, config={"num_samples": n})


def _threads(cfg: DeComFLConfig, env: MethodEnv) -> int:
    """The fast estimator's threads: every usable core in the engine's process, 1 in workers."""
    return 1 if env.workers else len(os.sched_getaffinity(0))


@declare_method(
    "decomfl",
    "DeComFL: zeroth-order local steps on seeded directions; steps × P scalars up, the averaged "
    "scalars down, clients rebuild the model",
    config=DeComFLConfig,
    capabilities=CAPABILITIES,
    defaults=DEFAULTS,
    upload=lambda cfg: "seed_scalars",
    seed_scalars=lambda cfg, config, arrays, draws: seed_scalars(cfg, config, arrays, draws),
    advice=lambda cfg: [f"lower method.mu (now {cfg.mu})"],
)
def build(cfg: DeComFLConfig, env: MethodEnv) -> MethodBuild:
    """DeComFL's bare strategy and client program (the composer adds secure aggregation)."""
    if not getattr(cfg, "secure_aggregation", True):
        warn_scalars_unprotected("steps × P scalars")
    strategy = DeComFLStrategy(
        env.model_fn(),
        cfg,
        seed=env.seed,
        population=len(env.client_sizes) if env.seeded_start else None,
        draws=env.draws,
    )
    program = DeComFLClient(env.model_fn, cfg, threads=_threads(cfg, env), draws=env.draws)
    return MethodBuild(strategy, program)
