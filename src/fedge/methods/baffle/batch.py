"""Batch-level BAFFLE (``mode: batch``, FedSGD; seed 000, Algorithm 1): each client uploads the K
loss differences ΔL(W_t, δ_k; D_c) on the perturbations regenerated from the round seed s_t, and the
server sums them with weights N_c/N (Eq. (7)), regenerates δ_k, estimates the gradient by Stein's
identity (Eq. (6)), clips it and steps its optimizer. Details and the paper-vs-code choices:
``docs/methods/baffle.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Strategy
from fedge.core.rng import Draws, derive_seed
from fedge.estimators import (
    ZerothOrderSpec,
    combine_loss_differences,
    estimate_gradient,
    loss_differences,
)
from fedge.estimators.directions import guided_directions
from fedge.methods.baffle.config import BaffleConfig, layer_scaled_spec, perturbation_threads
from fedge.methods.baffle.config import round_spec as scheduled
from fedge.methods.base import GlobalModel, MethodBuild, MethodEnv, check_scalar_reply
from fedge.methods.local import LocalTraining
from fedge.methods.replay import (
    ClientReplica,
    DownlinkHistory,
    OneStep,
    clip_inf_norm,
    perturbed_masks,
    perturbed_params,
    replay_step,
)
from fedge.methods.sparse import combine_masks

__all__ = ["BaffleBatchClient", "BaffleBatchStrategy", "build_batch"]


class BaffleBatchClient:
    """Client side of batch-level BAFFLE (Algorithm 1, lines 11-13): K loss differences,
    forwards only, over the client's local set D_c (``delta_loss_on: local_set``, as Algorithm 1)
    or over one mini-batch drawn with the client's generator (``batch``)."""

    def __init__(
        self,
        model_fn: Any,
        cfg: BaffleConfig,
        *,
        threads: int = 1,
        draws: Draws = "torch",
        train_masks: dict[str, torch.Tensor] | None = None,
        device: torch.device | None = None,
    ) -> None:
        assert cfg.server_optimizer is not None
        self.cfg, self.spec = cfg, cfg.zo_spec(workers=threads, draws=draws, device=device)
        self.train_masks = train_masks  # method.train_mask: only these coordinates are perturbed
        self.local = LocalTraining.loader(model_fn)
        self.replica = (
            ClientReplica(
                model_fn(),
                cfg.server_optimizer.build(),
                OneStep(self.spec, cfg.perturb, cfg.clip),
                k=cfg.k,
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
        basis, message = split_guides(message)
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
        masks = perturbed_masks(combine_masks(masks, self.train_masks), params)
        spec = guided_spec(scheduled(self.spec, cfg, ctx.rnd, ctx.rnd), cfg, basis, params, masks)
        spec = layer_scaled_spec(spec, cfg, params, masks)
        total = torch.zeros(cfg.k, dtype=torch.float64)
        for idx in chunks:
            batch = (ctx.data.x[idx], ctx.data.y[idx])
            d = loss_differences(
                model,
                F.cross_entropy,
                batch,
                spec,
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
        draws: Draws = "torch",
        train_masks: dict[str, torch.Tensor] | None = None,
        device: torch.device | None = None,
    ) -> None:
        assert cfg.server_optimizer is not None
        self.model, self.cfg, self.seed = model, cfg, seed
        self.train_masks = train_masks  # method.train_mask: the estimate is zero off them
        # the server runs no forwards: no workers
        self.spec = cfg.zo_spec(draws=draws, device=device)
        self.server = GlobalModel(model, cfg.server_optimizer.build(), masks=masks)
        self.downlink = DownlinkHistory(cfg.k) if cfg.downlink == "seeds" else None
        self.guides: list[dict[str, torch.Tensor]] = []  # the last guided_rank global updates

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
        return perturbed_masks(combine_masks(self.server.masks, self.train_masks), self.params())

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
        arrays = {**self.server.arrays(), **guide_arrays(self.guides)}
        if self.cfg.shared_perturbations:
            return dict.fromkeys(client_ids, Message(arrays, config={"seed": self.round_seed(rnd)}))
        return {c: Message(arrays, config={"seed": self.round_seed(rnd, c)}) for c in client_ids}

    def check_reply(self, rnd: int, cid: int, reply: Message) -> tuple[torch.Tensor, int]:
        return check_scalar_reply(reply, "dL", self.cfg.k, who=f"round {rnd}, client {cid}")

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
            self.params(),
            combined,
            self.round_spec(rnd),
            seed=self.round_seed(rnd),
            masks=self.masks(),
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
            gc = estimate_gradient(params, d, self.round_spec(rnd), seed=seed, masks=self.masks())
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

    def round_spec(self, rnd: int) -> ZerothOrderSpec:
        """Round ``rnd``'s estimate: its σ (``sigma_decay``), and guided directions in the span of
        the last updates (those the clients received with the model) or the configured ones."""
        spec = scheduled(self.spec, self.cfg, rnd, rnd)
        params, masks = self.params(), self.masks()
        spec = guided_spec(spec, self.cfg, self.guides, params, masks)
        return layer_scaled_spec(spec, self.cfg, params, masks)

    def apply(self, grads: dict[str, torch.Tensor]) -> dict[str, float]:
        before = (
            {k: v.detach().clone() for k, v in self.params().items()}
            if self.cfg.guided_rank
            else {}
        )
        self.server.step(clip_inf_norm(grads, self.cfg.clip))
        if self.cfg.guided_rank:  # newest first; the oldest falls out of the basis
            now = self.params()
            self.guides = [{k: now[k].detach() - before[k] for k in before}, *self.guides]
            self.guides = self.guides[: self.cfg.guided_rank]
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
        if self.cfg.guided_rank:
            state["guides"] = [{k: v.clone() for k, v in g.items()} for g in self.guides]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)
        if self.downlink is not None:
            self.downlink.load_state_dict(state["downlink"])
        if self.cfg.guided_rank:
            self.guides = [dict(g) for g in state["guides"]]


_GUIDE = "guide/"


def guide_arrays(guides: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The last global updates as message arrays, ``guide/<i>/<parameter>`` (newest i = 0)."""
    return {f"{_GUIDE}{i}/{k}": v for i, g in enumerate(guides) for k, v in g.items()}


def split_guides(message: Message) -> tuple[list[dict[str, torch.Tensor]], Message]:
    """The guide arrays of a server message (newest first) and the message without them."""
    if not any(k.startswith(_GUIDE) for k in message.arrays):
        return [], message
    guides: dict[int, dict[str, torch.Tensor]] = {}
    rest = {}
    for key, value in message.arrays.items():
        if key.startswith(_GUIDE):
            i, name = key[len(_GUIDE) :].split("/", 1)
            guides.setdefault(int(i), {})[name] = value
        else:
            rest[key] = value
    return [guides[i] for i in sorted(guides)], dataclasses.replace(message, arrays=rest)


def guided_spec(
    spec: ZerothOrderSpec,
    cfg: BaffleConfig,
    guides: Sequence[Mapping[str, torch.Tensor]],
    params: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor] | None,
) -> ZerothOrderSpec:
    """``spec`` with guided directions (:func:`~fedge.estimators.directions.guided_directions`)
    over ``params`` in the span of ``guides`` when ``guided_rank`` is on; ``spec`` otherwise."""
    if not cfg.guided_rank:
        return spec
    for g in guides:
        if set(g) != set(params):
            raise MessageError(
                f"guided directions: the server's update covers {sorted(g)}, the perturbed parameters are "
                f"{sorted(params)}; client and server must perturb the same parameters"
            )
    dirs = guided_directions(
        guides,
        {n: p.shape for n, p in params.items()},
        cfg.k,
        cfg.guided_share,
        masks,
        draws=spec.draws,
    )
    return dataclasses.replace(spec, directions=dirs)


def build_batch(
    cfg: BaffleConfig, env: MethodEnv, *, masks: dict[str, torch.Tensor] | None = None
) -> MethodBuild:
    """Batch-level BAFFLE's bare strategy and client program."""
    strategy = BaffleBatchStrategy(
        env.model_fn(),
        cfg,
        seed=env.seed,
        masks=masks,
        draws=env.draws,
        train_masks=env.train_masks,
        device=env.device,
    )
    program = BaffleBatchClient(
        env.model_fn,
        cfg,
        threads=perturbation_threads(cfg, env),
        draws=env.draws,
        train_masks=env.train_masks,
        device=env.device,
    )
    return MethodBuild(strategy, program)
