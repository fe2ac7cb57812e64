"""Seeds and scalars down, shared by the zeroth-order methods whose server update of a round is a
deterministic function of the model W_t, the optimizer state O_t, the round's seed s_t and the
round's aggregated scalars: batch-level BAFFLE with ``downlink: seeds`` (seed 000, Eq. (6)-(7):
the K loss differences of one estimate) and DeComFL (:mod:`fedge.methods.decomfl`: steps × P
scalars, one estimate per local step). :class:`DownlinkHistory` keeps each round's (s_r, scalars)
and sends a client the rounds it missed, 8 + 4k bytes a round (FedKSeed's idea, arXiv:2312.06353v3,
Sec. 3.3; the model and the optimizer state when that is smaller or the client is new, unless
every client can build the seeded initial model), and :class:`ClientReplica` rebuilds the model
bit for bit by running the method's own round update, whose zeroth-order step is
:func:`replay_step`; also the helpers both share (:func:`clip_inf_norm`, the perturbed parameters
and masks). Details and the trade-off: ``docs/methods/baffle.md``, "Seeds and scalars down".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedge.core import transforms as T
from fedge.core.context import ClientContext
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.threads import torch_threads
from fedge.core.transforms import Transform
from fedge.estimators import ZerothOrderSpec, estimate_gradient
from fedge.estimators.directions import match_params
from fedge.methods.base import GlobalModel, load_arrays, model_arrays, unpack_model_arrays

__all__ = [
    "ClientReplica",
    "DownlinkHistory",
    "OneStep",
    "RoundUpdate",
    "clip_inf_norm",
    "perturbed_masks",
    "perturbed_params",
    "replay_step",
]

_OPT = "opt/"
_MODEL = "w/"
_MASK = "m/"


def clip_inf_norm(
    grads: dict[str, torch.Tensor], max_norm: float | None
) -> dict[str, torch.Tensor]:
    """Scale all estimates together so that max |g| <= ``max_norm`` (the reference code's
    ``clip_grad_norm_(params, max_norm, norm_type=inf)``)."""
    if max_norm is None:
        return grads
    norm = max(float(g.abs().max()) for g in grads.values() if g.numel())
    factor = min(1.0, max_norm / (norm + 1e-6))
    return {k: g * factor for k, g in grads.items()} if factor < 1.0 else grads


def perturbed_params(
    model: torch.nn.Module, perturb: Sequence[str] | None
) -> dict[str, torch.Tensor]:
    """The trainable parameters matching the patterns ``perturb`` (``method.perturb``; all
    trainable ones when None)."""
    trainable: dict[str, torch.Tensor] = {
        n: p for n, p in model.named_parameters() if p.requires_grad
    }
    return (
        trainable
        if perturb is None
        else {n: trainable[n] for n in match_params(trainable, perturb)}
    )


def perturbed_masks(
    masks: dict[str, torch.Tensor] | None, params: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor] | None:
    """The masks of the perturbed parameters only (None when none is masked)."""
    return {n: m for n, m in (masks or {}).items() if n in params} or None


def replay_step(
    server: GlobalModel,
    spec: ZerothOrderSpec,
    seed: int,
    combined: torch.Tensor,
    *,
    perturb: Sequence[str] | None,
    clip: float | None,
) -> dict[str, torch.Tensor]:
    """One round of batch-level BAFFLE's server update: ĝ from Σ_c (N_c/N) ΔL_c on the
    perturbations of ``seed`` (Eq. 6-7) under ``spec``, over the parameters ``perturb`` selects,
    inf-norm clip to ``clip``, server optimizer. Returns ĝ (unclipped). The server runs it to
    train; a client runs it to rebuild the server's model."""
    # float reductions may depend on the thread count: the server and every client run the
    # update on one thread, so their models agree bit for bit
    with torch_threads(1):
        params = perturbed_params(server.model, perturb)
        masks = perturbed_masks(server.masks, params)
        g = estimate_gradient(params, combined, spec, seed=seed, masks=masks)
        server.step(clip_inf_norm(g, clip))
    return g


class DownlinkHistory:
    """Server side: which model each client holds, the rounds' (seed, scalars), and the messages.

    ``k``: the scalars of one round (BAFFLE: its K loss differences; DeComFL: steps × P);
    ``key``: their array's name in a replay message; ``population``: when given, every client
    builds the seeded initial model itself, which is W_first (``first``: the first round with
    an update; every round's model until then), so a client the server never had a reply from
    is sent ``new`` and the rounds since ``first`` instead of the model, and those rounds are
    kept while some client never replied (and replaying them costs less than the model)."""

    def __init__(self, k: int, *, key: str = "replay_dL", population: int | None = None) -> None:
        self.k, self.key, self.population = k, key, population
        self.first: int | None = None  # the first round updated (W_first: the seeded model)
        self._full_size = 0  # this round's full-state message size (set by messages())
        self.synced: dict[int, int] = {}  # client -> the round whose model W_r it holds
        self.history: dict[int, tuple[int, torch.Tensor]] = {}  # round r -> (s_r, scalars_r)

    def record(self, rnd: int, seed: int, combined: torch.Tensor) -> None:
        if self.population is not None and self.first is None:
            self.first = rnd  # W_first is the seeded model, W_(first+1) is not
        self.history[rnd] = (seed, combined.detach().to(torch.float32).clone())

    def messages(
        self, rnd: int, client_ids: list[int], seed: int, server: GlobalModel
    ) -> dict[int, Message]:
        """Round ``rnd``'s message per client: the rounds it missed, or the full state."""
        full = Message(
            {**server.arrays(), **T.state_to_arrays(server.opt_state, prefix=_OPT)},
            config={"seed": seed, "sync_to": rnd},
        )
        full_size = len(full.to_bytes())
        out: dict[int, Message] = {}
        self._full_size = full_size
        seeded = None if self.population is None else rnd if self.first is None else self.first
        for c in client_ids:
            at = self.synced.get(c, seeded)  # never served: the seeded model, W_seeded
            missed = None if at is None else range(at, rnd)
            if missed is not None and all(r in self.history for r in missed):
                replay = Message(
                    {
                        "replay_seeds": torch.tensor(
                            [self.history[r][0] for r in missed], dtype=torch.int64
                        ),
                        self.key: torch.stack([self.history[r][1] for r in missed])
                        if len(missed)
                        else torch.zeros(0, self.k),
                    },
                    config={"seed": seed, "sync_from": at, "sync_to": rnd},
                )
                if c not in self.synced:  # it replays from the seeded model
                    replay.config["new"] = True
                if len(replay.to_bytes()) < full_size:
                    out[c] = replay
                    continue
            out[c] = full
        self._forget(rnd, full_size)
        return out

    def confirm(self, rnd: int, clients: Sequence[int]) -> None:
        """``clients`` replied to round ``rnd``'s message, so they hold its model W_rnd (a client
        sent it but not confirmed keeps its older record)."""
        for c in clients:
            self.synced[c] = rnd
        self._forget(rnd, self._full_size)

    def _forget(self, rnd: int, full_size: int) -> None:
        """Drop rounds no replay can use: older than every client's model (W_first counts while
        a client was never served), or so old that replaying them costs more than the full state."""
        useful = max(1, full_size // (4 * self.k + 8))
        held = list(self.synced.values())
        if (
            self.population is not None
            and self.first is not None
            and len(self.synced) < self.population
        ):
            held.append(self.first)
        oldest = max(min(held, default=rnd), rnd - useful)
        for r in [r for r in self.history if r < oldest]:
            del self.history[r]

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"synced": dict(self.synced), "history": dict(self.history)}
        if self.population is not None:
            state["first"] = self.first
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.synced = {int(c): int(r) for c, r in state["synced"].items()}
        self.history = {int(r): (int(s), d) for r, (s, d) in state["history"].items()}
        if self.population is not None:
            self.first = state.get("first")


#: one round's update of a global model from the round seed and its k aggregated scalars
#: (``update(server, seed, scalars)``), the same function on the server and in every replica
RoundUpdate = Callable[[GlobalModel, int, torch.Tensor], object]


@dataclass(frozen=True)
class OneStep:
    """Batch-level BAFFLE's round update: one :func:`replay_step` (a :data:`RoundUpdate`)."""

    spec: ZerothOrderSpec
    perturb: Sequence[str] | None
    clip: float | None

    def __call__(self, server: GlobalModel, seed: int, combined: torch.Tensor) -> None:
        replay_step(server, self.spec, seed, combined, perturb=self.perturb, clip=self.clip)


class ClientReplica:
    """Client side: rebuilds the server's model W_t from what it holds and the message, and
    keeps (W_t, O_t, masks) in ``ctx.state`` for next time. ``optimizer`` and ``update`` (the
    round update, :data:`RoundUpdate`) must be the server's; ``k`` and ``key`` the history's
    (:class:`DownlinkHistory`); ``initial`` builds the seeded initial model, from which a client
    holding none replays (a history with a ``population``); without it such a client is an error.
    ``round_seed(seed, r)``: round r's seed from the message's ``seed``, for a method whose
    replays carry no ``replay_seeds`` (DeComFL); BAFFLE sends them."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Transform,
        update: RoundUpdate,
        *,
        k: int,
        key: str = "replay_dL",
        initial: Callable[[], torch.nn.Module] | None = None,
        round_seed: Callable[[int, int], int] | None = None,
    ) -> None:
        self.update, self.k, self.key, self.initial = update, k, key, initial
        self.round_seed = round_seed
        self.server = GlobalModel(model, optimizer)
        self.template = self.server.opt_state

    def sync(self, message: Message, ctx: ClientContext) -> torch.nn.Module:
        who = f"round {ctx.rnd}, client {ctx.cid}"
        to = message.config.get("sync_to")
        if not isinstance(to, int):
            raise MessageError(f"{who}: the server's message names no model round (sync_to)")
        if "sync_from" in message.config:  # a replay (its arrays may be left out when empty)
            frm = message.config.get("sync_from")
            at = self._restore(ctx, who, frm, new=bool(message.config.get("new")))
            if not isinstance(frm, int) or not isinstance(at, int) or not frm <= at <= to:
                raise MessageError(
                    f"{who}: the server replays rounds {frm!r} to {to} but this client holds the model of round "
                    f"{at}; its state is out of step with the server's (was the run resumed from a different "
                    "checkpoint?)"
                )
            seeds = self._seeds(message, frm, to, who)
            diffs = message.arrays.get(self.key, torch.zeros(0, self.k))
            if diffs.dim() != 2 or diffs.shape != (len(seeds), self.k):
                raise MessageError(
                    f"{who}: {self.key} has shape {tuple(diffs.shape)}; expected ({len(seeds)}, {self.k})"
                )
            skip = (
                at - frm
            )  # rounds this client replayed already (its last reply did not reach the server)
            for seed, d in zip(seeds[skip:], diffs[skip:], strict=True):
                self.update(self.server, seed, d)
        else:
            model_part = {k: v for k, v in message.arrays.items() if not k.startswith(_OPT)}
            arrays, masks = unpack_model_arrays(model_part, self.server.model.state_dict(), who=who)
            load_arrays(self.server.model, arrays, who=who)
            self.server.set_masks(masks)
            self.server.opt_state = T.state_from_arrays(message.arrays, self.template, prefix=_OPT)
        self._save(ctx, to)
        return self.server.model

    def _seeds(self, message: Message, frm: int, to: int, who: str) -> list[int]:
        """The replayed rounds' seeds: sent (``replay_seeds``), or derived by ``round_seed``
        from the message's ``seed`` for rounds ``frm`` .. ``to`` − 1."""
        if "replay_seeds" in message.arrays or self.round_seed is None:
            sent = message.arrays.get("replay_seeds", torch.zeros(0, dtype=torch.int64))
            return [int(s) for s in sent.tolist()]
        base = message.config.get("seed")
        if not isinstance(base, int):
            raise MessageError(f"{who}: the server's replay names no seed (seed={base!r})")
        return [self.round_seed(base, r) for r in range(frm, to)]

    def _restore(self, ctx: ClientContext, who: str, frm: object, *, new: bool) -> object:
        """Load the held (W, O, masks) and return its round; the seeded initial model, as round
        ``frm``, when none is held or the server never had a reply from this client (``new``:
        it replays from the seeded model, whatever an unconfirmed earlier sync left here)."""
        st = ctx.state
        at = st.get("at")
        if at is None or new:
            if self.initial is None:
                raise MessageError(
                    f"{who}: the server sent rounds to replay, but this client holds no model"
                )
            load_arrays(self.server.model, model_arrays(self.initial()), who=who)
            self.server.set_masks(None)
            self.server.opt_state = self.server.tx.init(self.server.params())
            return frm
        load_arrays(
            self.server.model,
            {k[len(_MODEL) :]: v for k, v in st.items() if k.startswith(_MODEL)},
            who=who,
        )
        masks = {k[len(_MASK) :]: v for k, v in st.items() if k.startswith(_MASK)}
        self.server.set_masks(masks or None)
        self.server.opt_state = T.state_from_arrays(st, self.template, prefix=_OPT)
        return at

    def _save(self, ctx: ClientContext, rnd: int) -> None:
        st = {_MODEL + k: v for k, v in model_arrays(self.server.model).items()}
        st.update(T.state_to_arrays(self.server.opt_state, prefix=_OPT))
        st.update({_MASK + k: m for k, m in (self.server.masks or {}).items()})
        ctx.state.clear()
        ctx.state.update(st, at=rnd)
