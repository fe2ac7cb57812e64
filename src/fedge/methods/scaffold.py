"""SCAFFOLD: FedAvg with control variates that correct client drift (Karimireddy et al., ICML
2020, arXiv:1910.06378v4, Algorithm 1, options I and II).

The server keeps a control variate c and each client i its own c_i (zero until the client is
first sampled). In a round, each sampled client starts from the global model x and runs its K
local steps of SGD with rate η_l on the corrected gradient

    g_i(y) + c − c_i

then sets, by option II (``control_variate: option2``, the default), c_i⁺ = c_i − c +
(x − y_i)/(K·η_l), or by option I (``option1``) c_i⁺ = ∇F_i(x), the gradient of its loss over
its whole local data at the global model (one extra pass, made before the local steps; the paper
notes it can be more stable than II), and uploads Δy_i = y_i − x and Δc_i = c_i⁺ − c_i. The
server moves x += η_g · mean Δy_i (its optimizer on the pseudo-gradient −mean Δy_i, as
:class:`~fedge.methods.fedavg.DeltaAveraging`; ``server_optimizer: {name: sgd, lr: η_g}``, 1.0
by default) and c += (|S|/N) · mean Δc_i, which keeps c the mean of all N clients' c_i. With
c = c_i = 0 (round 1) a client's steps are FedAvg's.

Conventions: K is the client's actual number of local steps this round (``local_epochs`` over
its data, capped by ``max_steps``), η_l its client learning rate in that round (``lr ·
lr_decay^(t−1)``). Option II needs plain SGD: a client optimizer other than SGD without
momentum is refused at validation (``method.client_optimizer.name`` / ``.momentum``); weight
decay is part of the gradient, so option II's c_i⁺ is the mean of the decayed gradients (option
I's is the loss gradient alone; either way c and every c_i are alike, and the correction
c − c_i is what the steps add). The paper averages uniformly (``weighting: uniform``, the
default here); with ``weighting: samples`` both means are weighted by sample count and
c += (n_S/n) · mean Δc_i (n_S the samples of the sampled clients, n all clients'), which keeps c
the sample-weighted mean of the c_i. Control variates cover the
trainable parameters; float buffers (BatchNorm statistics) travel as deltas as in FedAvg.

Messages: the downlink carries x and c (``scaffold.c.<name>``), the uplink Δy_i and Δc_i
(``scaffold.dc.<name>``): both are about twice FedAvg's, metered by the real messages. c_i lives
in the client's persistent state (``ctx.state``), so it is checkpointed and survives
``--resume``; c is in the server's checkpointed state.

Secure aggregation and DP compose by configuration (``sums_replies``): the server needs only the
(weighted) mean of the reply arrays, Δy_i and Δc_i alike, so both are summed masked, and DP
clips and noises the whole reply (Δy_i and Δc_i together: one client's contribution) before
:meth:`ScaffoldAveraging.apply_mean` splits it. Freezing and EMA evaluation compose as FedAvg's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from fedge.core import transforms as T
from fedge.core.context import ClientContext
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.rng import GlobalStream
from fedge.methods.base import MethodBuild, MethodEnv, split_trainable
from fedge.methods.fedavg import CAPABILITIES, DeltaAveraging, FedAvgConfig
from fedge.methods.local import Batch, GradientFn, LocalTraining, Masks, backprop_gradient_fn
from fedge.methods.registry import declare_method

__all__ = [
    "C_PREFIX",
    "DC_PREFIX",
    "ScaffoldAveraging",
    "ScaffoldClient",
    "ScaffoldConfig",
    "build",
]

#: the server control variate c in the downlink, one array per trainable parameter
C_PREFIX = "scaffold.c."
#: the client's Δc_i in the uplink
DC_PREFIX = "scaffold.dc."
#: the client's own c_i in its persistent state
CI_PREFIX = "scaffold.c_i."


class ScaffoldConfig(FedAvgConfig):
    """FedAvg's keys (E, B, step cap, client and server optimizers); uniform weighting, as the
    paper averages; the control-variate option. Under option II the client optimizer must be
    plain SGD ((x − y_i)/(K·η_l))."""

    name: Literal["scaffold"] = "scaffold"  # type: ignore[assignment]
    weighting: Literal["samples", "uniform"] = "uniform"
    control_variate: Literal["option2", "option1"] = Field(
        "option2",
        description="c_i's update (Algorithm 1): option2 reuses the local steps, "
        "c_i + (x - y_i)/(K lr) - c; option1 is the gradient of the client's loss over its "
        "data at the global model, one extra pass a round (the paper: can be more stable)",
    )

    @model_validator(mode="after")
    def _option_two_needs_plain_sgd(self) -> ScaffoldConfig:
        opt = self.client_optimizer
        if self.control_variate == "option1":
            return self  # c_i⁺ = ∇F_i(x) does not depend on the local steps' rule
        if opt.name != "sgd":
            raise ValueError(
                f"client_optimizer.name={opt.name!r}: SCAFFOLD's option II control variate "
                "c_i⁺ = c_i − c + (x − y_i)/(K·η_l) assumes plain SGD steps; "
                "set method.client_optimizer.name=sgd, or method.control_variate=option1 "
                "(c_i⁺ is then the gradient at the global model, whatever the steps)"
            )
        if opt.momentum:
            raise ValueError(
                f"client_optimizer.momentum={opt.momentum}: SCAFFOLD's option II control variate "
                "assumes SGD without momentum; set method.client_optimizer.momentum=0, or "
                "method.control_variate=option1"
            )
        return self


class ScaffoldClient:
    """Client side: FedAvg's local training on the gradient corrected by c − c_i, then the
    option II (or I) update of c_i (kept in ``ctx.state``) and the upload of Δy_i and Δc_i.

    Args:
        model_fn: builds the model.
        cfg: the method's config (E, B, step cap, client optimizer).
        base: the gradient of the client's loss (backprop's by default).
    """

    def __init__(
        self,
        model_fn: Callable[[], torch.nn.Module],
        cfg: ScaffoldConfig,
        *,
        base: GradientFn = backprop_gradient_fn,
    ) -> None:
        self.cfg, self.base = cfg, base
        self.local = LocalTraining.from_config(model_fn, cfg, gradient_fn=self._gradient)
        self._correction: dict[str, torch.Tensor] = {}
        self._steps = 0

    def _gradient(
        self, model: torch.nn.Module, batch: Batch, ctx: ClientContext, masks: Masks = None
    ) -> tuple[float | None, dict[str, torch.Tensor]]:
        loss, grads = self.base(model, batch, ctx, masks)
        self._steps += 1
        return loss, {k: g + self._correction[k] for k, g in grads.items()}

    def run(self, message: Message, ctx: ClientContext) -> Message:
        who = f"round {ctx.rnd}, client {ctx.cid}"
        arrays = dict(message.arrays)
        c = {k[len(C_PREFIX) :]: arrays.pop(k) for k in list(arrays) if k.startswith(C_PREFIX)}
        model = self.local.load(Message(arrays, config=message.config), ctx)
        if self.local.masks:
            raise MessageError(f"{who}: SCAFFOLD does not train sparse (pruned) models")
        params, _ = split_trainable(model)
        missing = sorted(set(params) - set(c))
        if missing:
            raise MessageError(f"{who}: the downlink lacks the control variate of {missing[:5]}")
        state = model.state_dict()
        c_i = {
            k: ctx.state.get(CI_PREFIX + k, torch.zeros_like(state[k])).to(state[k].dtype)
            for k in params
        }
        option1 = self.cfg.control_variate == "option1"
        at_x = self._gradient_at_x(model, ctx) if option1 else {}
        self._correction = {k: c[k] - c_i[k] for k in params}
        self._steps = 0
        reply = self.local.train(model, ctx)
        steps, self._correction = self._steps, {}
        lr = self.cfg.client_optimizer.lr * self.cfg.client_optimizer.lr_decay ** (ctx.rnd - 1)
        out = dict(reply.arrays)
        for k in params:
            if option1:  # c_i⁺ = ∇F_i(x)
                new = at_x[k].to(c_i[k].dtype)
            else:  # option II: c_i⁺ = c_i − c + (x − y_i)/(K·η_l), with x − y_i = −Δy_i
                new = c_i[k] - c[k] - reply.arrays[k] / (steps * lr) if steps else c_i[k].clone()
            out[DC_PREFIX + k] = new - c_i[k]
            ctx.state[CI_PREFIX + k] = new
        return Message(out, config=reply.config, metrics=reply.metrics)

    def _gradient_at_x(self, model: torch.nn.Module, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Option I's ∇F_i(x): the gradient of the mean loss over the client's whole local data
        at the loaded global model, summed batch by batch in index order (the training's batch
        order, drawn from the client's generator, is untouched)."""
        total: dict[str, torch.Tensor] = {}
        with GlobalStream(ctx.generator).active():  # dropout, as in the local steps
            for batch in ctx.data.batches(self.cfg.batch_size):
                _, grads = self.base(model, batch, ctx, None)
                w = len(batch[1]) / ctx.data.num_samples
                for k, g in grads.items():
                    total[k] = total[k].add_(g, alpha=w) if k in total else g * w
        return total


class ScaffoldAveraging(DeltaAveraging):
    """Server side: FedAvg's delta averaging of Δy_i plus the control variate c, sent beside
    the model and moved by (|S|/N) · mean Δc_i (sample-weighted: (n_S/n) · mean Δc_i).

    Args:
        model: the global model (updated in place).
        server_tx: server optimizer (η_g: plain SGD with rate η_g).
        weighting: ``"uniform"`` (the paper) or ``"samples"``.
        client_sizes: every client's sample count (N = its length).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        server_tx: T.Transform,
        *,
        weighting: str,
        client_sizes: Sequence[int],
    ) -> None:
        super().__init__(model, server_tx, replies_are_gradients=False, weighting=weighting)
        self.client_sizes = client_sizes
        state = model.state_dict()
        self.c = {k: torch.zeros_like(state[k]) for k in self.server.param_names}
        self.expected.update({DC_PREFIX + k: v.shape for k, v in self.c.items()})

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """FedAvg's (every trainable parameter's Δy_i and float buffer's delta; the model is
        dense) and every trainable parameter's Δc_i."""
        state = self.model.state_dict()
        model = {k: (state[k].shape, state[k].dtype) for k in self.expected if k in state}
        return {**model, **{DC_PREFIX + k: (v.shape, v.dtype) for k, v in self.c.items()}}

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        arrays = {**self.server.arrays(), **{C_PREFIX + k: v for k, v in self.c.items()}}
        return dict.fromkeys(client_ids, Message(arrays, config={"round": rnd}))

    def _fraction(self, clients: Sequence[int]) -> float:
        """|S|/N, or n_S/n when weighted by samples."""
        if not clients:
            raise MessageError("SCAFFOLD's control-variate update needs the ids of the clients")
        if self.weighted:
            return sum(self.client_sizes[c] for c in clients) / sum(self.client_sizes)
        return len(clients) / len(self.client_sizes)

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        """x by the server optimizer on −mean Δy_i (FedAvg's), c += (|S|/N) · mean Δc_i."""
        rest = {k: v for k, v in mean.items() if not k.startswith(DC_PREFIX)}
        frac = self._fraction(clients)
        for k in self.c:
            self.c[k] = self.c[k] + frac * mean[DC_PREFIX + k].to(self.c[k].dtype)
        return super().apply_mean(rnd, rest, weight=weight, clients=clients)

    def state_dict(self) -> dict[str, Any]:
        return {"server": self.server.state_dict(), "c": {k: v.clone() for k, v in self.c.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state["server"])
        self.c = {k: v.clone() for k, v in state["c"].items()}


@declare_method(
    "scaffold",
    "SCAFFOLD: FedAvg with server and client control variates correcting client drift",
    config=ScaffoldConfig,
    capabilities=CAPABILITIES,
    upload=lambda cfg: "delta",
)
def build(cfg: ScaffoldConfig, env: MethodEnv) -> MethodBuild:
    """Build SCAFFOLD: the control-variate server and the corrected local training."""
    strategy = ScaffoldAveraging(
        env.model_fn(),
        cfg.server_optimizer.build(),
        weighting=cfg.weighting,
        client_sizes=env.client_sizes,
    )
    return MethodBuild(strategy, ScaffoldClient(env.model_fn, cfg))
