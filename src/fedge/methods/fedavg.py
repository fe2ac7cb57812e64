"""FedAvg and FedSGD: the backpropagation baselines every seed paper compares with.

- **FedAvg** (McMahan et al., arXiv:1602.05629v4, Algorithm 1): each sampled client trains
  the global model for ``local_epochs`` epochs of mini-batch SGD (or Adam) on its data and
  uploads its model delta ``Δ_c``; the server forms ``Δ = Σ_c (n_c / n) Δ_c`` and applies a
  server optimizer to the pseudo-gradient ``-Δ`` (Reddi et al., arXiv:2003.00295v5,
  Algorithm 2). ``server_optimizer: {name: sgd, lr: 1.0}`` is exactly FedAvg.
- **FedSGD**: each client computes the gradient of one mini-batch (``batch_size``; 0 means
  its whole local set) at the global model and uploads it; the server averages with the
  same weights and applies the server optimizer to that gradient.

Float buffers (BatchNorm running statistics) travel as deltas too and are averaged and
added directly, never through the optimizer. Weighting is by sample count (``n_c / n``)
or uniform.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from pydantic import Field

from fedge.core import transforms as T
from fedge.core.context import ClientContext
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Strategy
from fedge.methods.base import (
    GlobalModel,
    MethodBuild,
    MethodConfigBase,
    MethodEnv,
    ServerOptimizerConfig,
    check_reply_arrays,
    split_trainable,
)
from fedge.methods.local import (
    ClientOptimizerConfig,
    LocalTraining,
    backprop_gradient_fn,
)
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities

__all__ = ["DeltaAveraging", "FedAvgConfig", "FedSGDClient", "FedSGDConfig", "build"]


class FedAvgConfig(MethodConfigBase):
    name: Literal["fedavg"] = "fedavg"
    local_epochs: int = Field(1, ge=1, description="E: local epochs per round")
    batch_size: int = Field(32, ge=1, description="B: local mini-batch size")
    max_steps: int | None = Field(
        None, ge=1, description="cap on local steps per round (None: E full epochs)"
    )
    weighting: Literal["samples", "uniform"] = "samples"
    client_optimizer: ClientOptimizerConfig = ClientOptimizerConfig()
    server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig()


class FedSGDConfig(MethodConfigBase):
    name: Literal["fedsgd"] = "fedsgd"
    batch_size: int = Field(
        64, ge=0, description="samples per client gradient (0: the whole local set)"
    )
    weighting: Literal["samples", "uniform"] = "samples"
    server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig(lr=0.1)


class FedSGDClient:
    """Client side of FedSGD: the gradient of one mini-batch (``batch_size``; 0 = the whole
    local set) at the global model, plus float-buffer deltas (BatchNorm statistics)."""

    def __init__(self, model_fn: Any, cfg: FedSGDConfig) -> None:
        self.cfg = cfg
        self.local = LocalTraining.loader(model_fn)

    def run(self, message: Message, ctx: ClientContext) -> Message:
        model = self.local.load(message, ctx)
        _, buffers = split_trainable(model)
        start = {k: model.state_dict()[k].detach().clone() for k in buffers}
        n = ctx.data.num_samples
        idx = ctx.data.indices[
            torch.randperm(n, generator=ctx.generator)[: min(self.cfg.batch_size or n, n)]
        ]
        loss, grads = backprop_gradient_fn(
            model, (ctx.data.x[idx], ctx.data.y[idx]), ctx, self.local.masks
        )
        state = model.state_dict()
        arrays = {**grads, **{k: state[k].detach() - start[k] for k in buffers}}
        arrays = {k: v.cpu() for k, v in arrays.items()}  # the upload leaves the device here
        return Message(arrays, config={"num_samples": n}, metrics={"train_loss": loss})


class DeltaAveraging(Strategy):
    """Server side of FedAvg/FedSGD: broadcast the model, average the replies with weights
    ``n_c / n`` (or uniform), apply the server optimizer.

    Args:
        model: the global model (updated in place).
        server_tx: server optimizer as a :class:`~fedge.core.transforms.Transform`.
        replies_are_gradients: True for FedSGD (reply = gradient), False for FedAvg
            (reply = delta, pseudo-gradient ``-Δ``).
        weighting: ``"samples"`` or ``"uniform"``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        server_tx: T.Transform,
        *,
        replies_are_gradients: bool,
        weighting: str = "samples",
        masks: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.model = model
        self.server = GlobalModel(model, server_tx, masks=masks)
        self.gradients, self.weighting = replies_are_gradients, weighting
        self.weighted = weighting == "samples"
        state = model.state_dict()
        self.expected = {
            k: state[k].shape for k in self.server.param_names + self.server.buffer_names
        }

    @property
    def global_model(self) -> GlobalModel:
        return self.server

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """What a reply sums (:class:`~fedge.methods.secure.Summable`): every trainable
        parameter's delta (or gradient) and every float buffer's delta — dense, or for a pruned
        tensor its kept coordinates only (1-D, in the mask's order), as the clients send it. The
        masks are the server's own (data-free, or from the aggregated pruning scores), so which
        coordinates are summed reveals nothing about one client. They can change between rounds
        (NTK-Ori prunes in round 1): ask each round."""
        state, masks = self.model.state_dict(), self.server.masks or {}
        return {
            k: (torch.Size([int(masks[k].sum())]) if k in masks else state[k].shape, state[k].dtype)
            for k in self.server.param_names + self.server.buffer_names
        }

    def _dense(self, arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``arrays`` with each pruned tensor sent as its kept coordinates put back in its shape
        (zeros elsewhere); anything else unchanged (a malformed one is caught by the shape check)."""
        for k, m in (self.server.masks or {}).items():
            a = arrays.get(k)
            if a is not None and a.dim() == 1 and a.numel() == int(m.sum()) and a.shape != m.shape:
                full = torch.zeros(m.shape, dtype=a.dtype)
                full[m] = a
                arrays[k] = full
        return arrays

    @property
    def partial_replies(self) -> bool:
        """Yes: the weights of the clients that replied renormalize the mean."""
        return True

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        broadcast = Message(self.server.arrays(), config={"round": rnd})
        return dict.fromkeys(client_ids, broadcast)

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        weights: dict[int, float] = {}
        for cid, reply in replies.items():
            self._dense(reply.arrays)  # sparse deltas: kept coordinates only
            check_reply_arrays(reply, self.expected, who=f"round {rnd}, client {cid}")
            n = reply.config.get("num_samples")
            if not isinstance(n, int) or n < 1:
                raise MessageError(
                    f"round {rnd}, client {cid}: num_samples={n!r}; expected an int >= 1"
                )
            weights[cid] = float(n) if self.weighting == "samples" else 1.0
        total = sum(weights.values())
        mean: dict[str, torch.Tensor] = {}
        for cid, reply in replies.items():  # incremental, in client-id order (deterministic)
            w = weights[cid] / total
            for k, a in reply.arrays.items():
                mean[k] = mean[k].add_(a, alpha=w) if k in mean else a * w
        metrics = self.apply_mean(rnd, mean, weight=total, clients=sorted(replies))
        losses = [
            (weights[c] / total) * float(r.metrics["train_loss"])
            for c, r in replies.items()
            if "train_loss" in r.metrics
        ]
        return {**metrics, "train_loss": sum(losses)} if losses else metrics

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        """Server optimizer step on the mean (pseudo-)gradient; float buffers move by their mean
        delta. A pruned tensor's mean may come as its kept coordinates (secure aggregation and DP
        sum :meth:`summands`)."""
        mean = self._dense(dict(mean))
        self.server.step(
            {k: (mean[k] if self.gradients else -mean[k]) for k in self.server.param_names}
        )
        self.server.add_to_buffers(mean)
        return {}

    def eval_model(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return self.server.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)


#: what FedAvg and FedSGD can do: their server averages the replies (dense deltas or
#: gradients, which a codec may compress) into one global model
CAPABILITIES = Capabilities(
    sums_replies=True, global_model=True, freezable=True, client_optimizer=True, dense_upload=True
)


@declare_method(
    "fedsgd",
    "FedSGD: one backprop gradient per client per round, server optimizer",
    config=FedSGDConfig,
    capabilities=dataclasses.replace(CAPABILITIES, client_optimizer=False, accelerators=True),
    upload=lambda cfg: "gradient",
)
@declare_method(
    "fedavg",
    "FedAvg: E local epochs of backprop, weighted delta averaging, server optimizer",
    config=FedAvgConfig,
    capabilities=dataclasses.replace(CAPABILITIES, coordinate_mask=True, accelerators=True),
    upload=lambda cfg: "delta",
)
def build(cfg: FedAvgConfig | FedSGDConfig, env: MethodEnv) -> MethodBuild:
    """Build FedAvg (``FedAvgConfig``) or FedSGD (``FedSGDConfig``): the bare server and client."""
    strategy = DeltaAveraging(
        env.model_fn(),
        cfg.server_optimizer.build(),
        replies_are_gradients=isinstance(cfg, FedSGDConfig),
        weighting=cfg.weighting,
    )
    if isinstance(cfg, FedSGDConfig):
        program: Any = FedSGDClient(env.model_fn, cfg)
    else:
        program = LocalTraining.from_config(env.model_fn, cfg, train_masks=env.train_masks)
    return MethodBuild(strategy, program)
