"""FeedSign: federated zeroth-order training in which one bit travels each way per step (Cai,
Chen and Zhu, 2025, "FeedSign: Robust full-parameter federated fine-tuning of large models with
extremely low communication overhead of one bit", arXiv:2501.17610).

A round is one step. Server and clients share the round's seed s_t, hence its direction
z_t ~ N(0, I) over the trainable parameters (regenerated from (s_t, parameter) by
:mod:`fedge.estimators.directions`, ``draws`` torch or portable). Each sampled client takes one
mini-batch and the two-point projected gradient p_c = [L(w_t + μz_t) − L(w_t − μz_t)] / (2μ)
(forwards only, :func:`~fedge.methods.fedkseed.projected_gradient`), and uploads only its sign
s_c = sgn(p_c), one bit. The server takes the (weighted) majority vote v_t = sgn(Σ_c ω_c s_c)
(:func:`majority_vote`) and every party steps

    w_{t+1} = w_t − η v_t z_t.

The vote reaches a client in its next message: the server keeps every round's vote and sends a
client the votes of the rounds since the model it holds, packed eight to a byte
(:func:`pack_votes`), from which it rebuilds w_t bit for bit; a client never served starts from
the seeded initial model (under ``warm_start``, which it cannot build, it is sent the model
w_t instead: :meth:`FeedSignStrategy.model_message`, in its bytes down). With every client in every round that is one bit down per step.
Ties: sgn(0) := +1, for a client whose two losses are equal and for a vote whose weighted sum
is 0 (z_t is symmetric and p_c(−z) = −p_c(z), so this step has the law of a fair coin's).

The server's vote needs only Σ_c ω_c s_c, so secure aggregation (off by default, warned: it
replaces the one-bit upload by masked field elements) and DP on the summed signs compose; freezing
perturbs only trainable coordinates; EMA evaluation composes. Paper-vs-code choices, the bytes
and the framing: ``docs/methods/feedsign.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from fedge.core import transforms as T
from fedge.core.context import ClientContext
from fedge.core.errors import DivergenceError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Strategy
from fedge.core.rng import Draws, check_draws, derive_seed
from fedge.estimators.directions import Directions, make_directions
from fedge.methods.base import (
    GlobalModel,
    MethodBuild,
    MethodConfigBase,
    MethodEnv,
    load_arrays,
    model_arrays,
    warn_scalars_unprotected,
)
from fedge.methods.fedkseed import projected_gradient
from fedge.methods.registry import declare_method
from fedge.methods.replay import perturbed_params
from fedge.methods.spec import Capabilities, SeedScalars

__all__ = [
    "CAPABILITIES",
    "FeedSignClient",
    "FeedSignConfig",
    "FeedSignStrategy",
    "build",
    "majority_vote",
    "pack_votes",
    "round_seed",
    "seed_scalars",
    "sign",
    "step",
    "unpack_votes",
]

_MODEL = "w/"


class FeedSignConfig(MethodConfigBase):
    """FeedSign's own keys; the composer attaches secure aggregation, EMA and freezing."""

    name: Literal["feedsign"] = "feedsign"
    eps: float = Field(1e-3, gt=0, description="μ: the two-point perturbation scale")
    lr: float = Field(1e-3, gt=0, description="η: the step along ±z, the same in every round")
    batch_size: int = Field(32, ge=1, description="samples in a client's one mini-batch a round")
    weighting: Literal["uniform", "samples"] = Field(
        "uniform",
        description="a client's vote counts 1 (uniform, the paper's majority vote) or its sample "
        "count N_c (samples)",
    )


#: the vote needs only the (weighted) sum of the clients' signs; the clients' ±z steps move one
#: global model; only trainable (not frozen) coordinates are perturbed
CAPABILITIES = Capabilities(sums_replies=True, global_model=True, freezable=True)


def sign(p: float) -> int:
    """sgn(p) with sgn(0) := +1: the one bit a client sends, and the vote of a tied sum."""
    return 1 if p >= 0 else -1


def majority_vote(signs: Sequence[int], weights: Sequence[int | float]) -> int:
    """v = sgn(Σ_c ω_c s_c), sgn(0) := +1 (a tie steps along −z, see the module docstring)."""
    if len(signs) != len(weights) or not signs:
        raise ValueError(
            f"majority_vote needs one weight per sign and at least one sign; got {len(signs)} "
            f"signs and {len(weights)} weights"
        )
    return sign(sum(w * s for s, w in zip(signs, weights, strict=True)))


def pack_votes(votes: Sequence[int]) -> torch.Tensor:
    """The votes ±1 as bits (1 for +1), eight to a byte, first vote in the lowest bit."""
    bits = np.array([v > 0 for v in votes], dtype=bool)
    return torch.from_numpy(np.packbits(bits, bitorder="little").copy())


def unpack_votes(packed: torch.Tensor, n: int) -> list[int]:
    """Inverse of :func:`pack_votes` for ``n`` votes."""
    if packed.dtype != torch.uint8 or packed.dim() != 1 or len(packed) != (n + 7) // 8:
        raise MessageError(
            f"votes: expected {(n + 7) // 8} uint8 bytes for {n} votes, got "
            f"{tuple(packed.shape)} {packed.dtype}"
        )
    bits = np.unpackbits(packed.numpy(), count=n, bitorder="little")
    return [1 if b else -1 for b in bits]


def round_seed(seed: int, rnd: int) -> int:
    """s_t, the seed of round ``rnd``'s direction, from the run's FeedSign seed."""
    return derive_seed(seed, "round", rnd, bits=62)


def seed_scalars(
    cfg: FeedSignConfig, config: Mapping[str, Any], arrays: Mapping[str, Any], draws: str
) -> SeedScalars:
    """A client's upload as its observer reads it: its sign s along the round's direction z_t
    (seed s_t from the message's seed and round, ``sync_to``), D = s z_t; the step it asks
    for is −η D (the vote then decides the step taken)."""
    base, rnd, s = config.get("seed"), config.get("sync_to"), arrays.get("s")
    if not isinstance(base, int) or not isinstance(rnd, int) or s is None:
        raise MessageError(
            f"a FeedSign upload is read with its message's seed and round (sync_to) and the "
            f"reply's sign s; got seed={base!r}, sync_to={rnd!r} and arrays {sorted(arrays)}"
        )
    return SeedScalars(round_seed(base, rnd), s.to(torch.float32), 1, cfg.lr, check_draws(draws))


def _directions(model: torch.nn.Module, draws: Draws) -> tuple[dict[str, torch.Tensor], Directions]:
    params = perturbed_params(model, None)
    return params, make_directions(
        "gaussian", {n: p.shape for n, p in params.items()}, 1, draws=draws
    )


def step(model: GlobalModel, vote: int, seed: int, draws: Draws) -> None:
    """w ← w − η v z (``model``'s SGD with η), z drawn from ``seed``: the server's update and
    every client's replay of it."""
    params, dirs = _directions(model.model, draws)
    model.step({n: dirs.draw(seed, [0], n, p.shape)[0] * vote for n, p in params.items()})


class FeedSignStrategy(Strategy):
    """Server side: the votes a client missed down; its sign up; the majority vote, then
    w ← w − η v z."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: FeedSignConfig,
        *,
        seed: int,
        draws: Draws = "torch",
        seeded_start: bool = True,
    ) -> None:
        self.model, self.cfg, self.draws = model, cfg, check_draws(draws)
        #: clients build the initial model themselves; else (a warm start) a client is sent the
        #: model on its first participation
        self.seeded_start = seeded_start
        self.seed = derive_seed(seed, "feedsign", bits=62)
        self.server = GlobalModel(model, T.sgd(cfg.lr))
        self.weighted = cfg.weighting == "samples"
        self.votes: dict[int, int] = {}  # round -> its vote (rounds that stepped)
        self.synced: dict[int, int] = {}  # client -> the round whose model it holds
        self.first: int | None = None  # the first round: every client's seeded initial model

    @property
    def global_model(self) -> GlobalModel:
        return self.server

    @property
    def partial_replies(self) -> bool:
        return True

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return {"s": (torch.Size([1]), torch.float32)}

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        if self.first is None:
            self.first = rnd
        return {
            c: self.message(self.synced.get(c, self.first), rnd)
            if c in self.synced or self.seeded_start
            else self.model_message(rnd)
            for c in client_ids
        }

    def model_message(self, rnd: int) -> Message:
        """The downlink of a client that cannot build the model it would replay from (a warm
        start, never served): the model w_rnd itself, nothing to replay."""
        return Message(
            self.server.arrays(), config={"seed": self.seed, "sync_from": rnd, "sync_to": rnd}
        )

    def message(self, frm: int, to: int) -> Message:
        """The downlink of a client holding w_frm in round ``to``: the votes of rounds frm..to−1
        packed, and the rounds that made no step (all replies lost) when there are any."""
        missed = range(frm, to)
        arrays = {"votes": pack_votes([self.votes[r] for r in missed if r in self.votes])}
        if any(r not in self.votes for r in missed):
            arrays["stepped"] = pack_votes([1 if r in self.votes else -1 for r in missed])
        return Message(arrays, config={"seed": self.seed, "sync_from": frm, "sync_to": to})

    def check_reply(self, rnd: int, cid: int, reply: Message) -> tuple[int, int]:
        """The client's sign (±1) and its sample count, or a MessageError naming the fault."""
        s, n = reply.arrays.get("s"), reply.config.get("num_samples")
        who = f"round {rnd}, client {cid}"
        if s is None or s.shape != (1,) or s.dtype != torch.int8 or abs(int(s[0])) != 1:
            got = None if s is None else (tuple(s.shape), str(s.dtype), s.tolist())
            raise MessageError(f"{who}: expected s, one int8 of ±1, got {got}")
        if not isinstance(n, int) or n < 1:
            raise MessageError(f"{who}: num_samples={n!r}; expected an int >= 1")
        return int(s[0]), n

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        checked = [self.check_reply(rnd, c, r) for c, r in replies.items()]
        signs = [s for s, _ in checked]
        weights = [n if self.weighted else 1 for _, n in checked]
        vote = majority_vote(signs, weights)
        agree = sum(w for s, w in zip(signs, weights) if s == vote) / sum(weights)
        return {**self.update(rnd, vote, sorted(replies)), "vote_agreement": agree}

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        """The vote from the (secure or DP) mean of the signs: sgn(mean) = sgn(sum)."""
        return self.update(rnd, sign(float(mean["s"].reshape(-1)[0])), clients)

    def update(self, rnd: int, vote: int, clients: Sequence[int]) -> dict[str, float]:
        """w ← w − η v z_rnd, recorded for the clients' replay."""
        step(self.server, vote, round_seed(self.seed, rnd), self.draws)
        self.votes[rnd] = vote
        for c in clients:  # they replied to this round's message, so they hold w_rnd
            self.synced[c] = rnd
        return {"vote": float(vote)}

    def round_skipped(self, rnd: int) -> None:
        """The engine put this strategy back as before round ``rnd`` (too few replies): no vote,
        no step. Its clients keep the model they synced to, so a round skipped before any that
        stepped stays the first round: the seeded initial model, w_first, is what they hold."""
        if self.first is None:
            self.first = rnd

    def eval_model(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.server.state_dict(),
            "votes": dict(self.votes),
            "synced": dict(self.synced),
            "first": self.first,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)
        self.votes = {int(r): int(v) for r, v in state["votes"].items()}
        self.synced = {int(c): int(r) for c, r in state["synced"].items()}
        self.first = state["first"]


class FeedSignClient:
    """Client side: rebuild w_t from the held copy and the missed votes; the sign of one
    two-point projected gradient along z_t up."""

    def __init__(self, model_fn: Any, cfg: FeedSignConfig, draws: Draws = "torch") -> None:
        self.model_fn, self.cfg, self.draws = model_fn, cfg, check_draws(draws)
        self.replica = GlobalModel(model_fn(), T.sgd(cfg.lr))

    def sync(self, message: Message, ctx: ClientContext) -> torch.nn.Module:
        """w_t: the held copy (the seeded initial model if none) with the missed votes replayed."""
        who = f"round {ctx.rnd}, client {ctx.cid}"
        frm, to, seed = (message.config.get(k) for k in ("sync_from", "sync_to", "seed"))
        if not all(isinstance(v, int) for v in (frm, to, seed)):
            raise MessageError(
                f"{who}: the server's message lacks sync_from/sync_to/seed "
                f"(got {frm!r}, {to!r}, {seed!r})"
            )
        assert isinstance(frm, int) and isinstance(to, int) and isinstance(seed, int)
        model = self.replica.model
        sent = {k: v for k, v in message.arrays.items() if k not in ("votes", "stepped")}
        if sent:  # the model itself (a warm start's first participation): nothing to replay
            load_arrays(model, sent, who=who)
            ctx.state.clear()
            ctx.state.update({_MODEL + k: v for k, v in model_arrays(model).items()}, at=to)
            return model
        at = ctx.state.get("at", frm)
        if "at" in ctx.state:
            held = {k[len(_MODEL) :]: v for k, v in ctx.state.items() if k.startswith(_MODEL)}
            load_arrays(model, held, who=who)
        else:
            load_arrays(model, model_arrays(self.model_fn()), who=who)
        if not isinstance(at, int) or not frm <= at <= to:
            raise MessageError(
                f"{who}: the server sends the votes of rounds {frm} to {to - 1} but this client "
                f"holds the model of round {at}; its state is out of step with the server's"
            )
        rounds = list(range(frm, to))
        if "stepped" in message.arrays:
            rounds = [
                r
                for r, s in zip(rounds, unpack_votes(message.arrays["stepped"], len(rounds)))
                if s > 0
            ]
        votes = unpack_votes(message.arrays.get("votes", pack_votes([])), len(rounds))
        for r, v in zip(rounds, votes):
            if r >= at:  # rounds this client replayed already are skipped
                step(self.replica, v, round_seed(seed, r), self.draws)
        ctx.state.clear()
        ctx.state.update({_MODEL + k: v for k, v in model_arrays(model).items()}, at=to)
        return model

    def run(self, message: Message, ctx: ClientContext) -> Message:
        cfg = self.cfg
        model = self.sync(message, ctx)  # the two-point losses leave it exactly as it was
        seed = round_seed(int(message.config["seed"]), ctx.rnd)  # type: ignore[arg-type]
        model.train()
        ctx.meter.resident = model
        params, dirs = _directions(model, self.draws)
        n = ctx.data.num_samples
        idx = ctx.data.indices[torch.randperm(n, generator=ctx.generator)[: cfg.batch_size]]
        p = projected_gradient(
            model, (ctx.data.x[idx], ctx.data.y[idx]), dirs, seed, 0, cfg.eps, list(params)
        )
        if not math.isfinite(p):
            raise DivergenceError(
                f"round {ctx.rnd}, client {ctx.cid}: the projected gradient is {p}; "
                f"lower method.lr (now {cfg.lr}) or method.eps (now {cfg.eps})",
                round=ctx.rnd,
                cause=f"client {ctx.cid}'s projected gradient is {p}",
            )
        return Message({"s": torch.tensor([sign(p)], dtype=torch.int8)}, config={"num_samples": n})


@declare_method(
    "feedsign",
    "FeedSign: one two-point zeroth-order step a round along a shared seed; one bit each way",
    config=FeedSignConfig,
    capabilities=CAPABILITIES,
    upload=lambda cfg: "seed_scalars",
    seed_scalars=lambda cfg, config, arrays, draws: seed_scalars(cfg, config, arrays, draws),
    advice=lambda cfg: [f"lower method.eps (now {cfg.eps})"],
)
def build(cfg: FeedSignConfig, env: MethodEnv) -> MethodBuild:
    """FeedSign's bare strategy and client program (the composer adds what the config asks).
    Secure aggregation stays off by default (it would turn the one-bit upload into masked ring
    elements, the method's point); its absence is warned about, naming what the server sees."""
    if not getattr(cfg, "secure_aggregation", False):
        warn_scalars_unprotected(
            "signs of its projected gradients",
            relies=" (one bit a step, still a function of the client's data)",
        )
    return MethodBuild(
        FeedSignStrategy(
            env.model_fn(), cfg, seed=env.seed, draws=env.draws, seeded_start=env.seeded_start
        ),
        FeedSignClient(env.model_fn, cfg, env.draws),
    )
