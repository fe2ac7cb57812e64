"""Local training on a client: the loop FedAvg-style methods share, with the gradient
source pluggable (backprop for FedAvg, a zeroth-order estimate for epoch-level BAFFLE).

Composition, not inheritance: a :class:`LocalTraining` client program is given a
``gradient_fn(model, batch, ctx, masks) -> (loss or None, {name: grad})``; ``ctx.global_arrays``
holds the round's global weights (what a proximal term pulls towards).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from pydantic import Field

from fedge.core.context import ClientContext
from fedge.core.messages import Message
from fedge.core.rng import GlobalStream
from fedge.methods.base import MethodConfigBase, load_arrays, split_trainable, unpack_model_arrays
from fedge.methods.sparse import combine_masks

__all__ = [
    "ClientOptimizerConfig",
    "GradientFn",
    "LocalTraining",
    "LocalTrainingOptions",
    "backprop_gradient_fn",
]

Batch = tuple[torch.Tensor, torch.Tensor]
Masks = dict[str, torch.Tensor] | None
GradientFn = Callable[
    [torch.nn.Module, Batch, ClientContext, Masks], tuple[float | None, dict[str, torch.Tensor]]
]


class ClientOptimizerConfig(MethodConfigBase):
    """The optimizer a client runs locally.

    ``state``: ``fresh`` builds it anew each round (FedAvg as McMahan et al. state it: a
    client is stateless between rounds, which cross-device sampling requires); ``persistent``
    keeps its state (SGD momentum buffers, Adam's moments and step counts) on the client from
    one round it takes part in to the next, as BAFFLE's reference code does (one
    ``torch.optim.Adam`` per client built once for the whole run; every client takes part every
    round in its Tables 1-2). The state lives in the client's persistent state, so it is
    checkpointed and survives ``--resume``; the model weights still come from the server each round.
    """

    name: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    lr_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="learning rate multiplied by this after each round: round t uses lr·lr_decay^(t−1) "
        "(NTK-BAFFLE's recipe: 0.998)",
    )
    b1: float = Field(0.9, ge=0, lt=1, description="Adam beta1")
    b2: float = Field(0.999, ge=0, lt=1, description="Adam beta2")
    state: Literal["fresh", "persistent"] = Field(
        "fresh",
        description="fresh: a new optimizer each round; persistent: its state (momentum, Adam moments) "
        "kept on the client across the rounds it takes part in (BAFFLE's reference code)",
    )

    def build(self, params: list[torch.nn.Parameter], rnd: int = 1) -> torch.optim.Optimizer:
        """The optimizer of round ``rnd`` (1-based): its learning rate decayed ``rnd − 1`` times."""
        lr = self.lr * self.lr_decay ** (rnd - 1)
        if self.name == "adam":
            return torch.optim.Adam(
                params, lr=lr, betas=(self.b1, self.b2), weight_decay=self.weight_decay
            )
        return torch.optim.SGD(
            params, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay
        )


_OPT = "client_optimizer."


def save_optimizer_state(
    opt: torch.optim.Optimizer, store: dict[str, Any], *, names: list[str]
) -> None:
    """Write ``opt``'s per-parameter state into a party's persistent ``store`` as flat
    ``client_optimizer.<parameter name>.<field>`` tensors (the store holds tensors and scalars only)."""
    for key in [k for k in store if k.startswith(_OPT)]:
        del store[key]
    params = opt.param_groups[0]["params"]
    for name, p in zip(names, params, strict=True):
        for field, value in opt.state.get(p, {}).items():
            if value is not None:
                store[f"{_OPT}{name}.{field}"] = torch.as_tensor(value).detach().clone()


def restore_optimizer_state(
    opt: torch.optim.Optimizer, store: dict[str, Any], *, names: list[str]
) -> None:
    """Load the state :func:`save_optimizer_state` wrote back into a freshly built ``opt`` (the
    same parameters, by name); nothing to load on a client's first round."""
    params = opt.param_groups[0]["params"]
    for name, p in zip(names, params, strict=True):
        prefix = f"{_OPT}{name}."
        fields = {k[len(prefix) :]: v for k, v in store.items() if k.startswith(prefix)}
        if not fields:
            continue
        for field, value in fields.items():
            if value.shape != p.shape and value.dim() != 0:
                raise ValueError(
                    f"client optimizer state {name}.{field} has shape {tuple(value.shape)}, the parameter "
                    f"{tuple(p.shape)}: the model changed under a persistent optimizer state"
                )
        # a state read back from bytes is on the CPU: tensors go to the parameter's device, the
        # step count stays on the CPU, where torch's optimizers keep it
        opt.state[p] = {
            f: v.to("cpu" if f == "step" else p.device, copy=True) for f, v in fields.items()
        }


class LocalTrainingOptions(Protocol):
    """The method-config fields a :class:`LocalTraining` is built from (FedAvg's E, B, the step
    cap and the client optimizer; FedPT and epoch-level BAFFLE carry the same fields)."""

    @property
    def local_epochs(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def max_steps(self) -> int | None: ...
    @property
    def client_optimizer(self) -> ClientOptimizerConfig: ...


def backprop_gradient_fn(
    model: torch.nn.Module, batch: Batch, ctx: ClientContext, masks: Masks = None
) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean cross-entropy of ``batch`` and its exact gradient (autograd), zero where masked out."""
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    loss = F.cross_entropy(model(batch[0]), batch[1])
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
    for k, m in (masks or {}).items():
        grads[k] = grads[k] * m
    return float(loss.detach()), grads


class LocalTraining:
    """Client program: load the global model, run local steps, upload the model delta.

    Steps: ``local_epochs`` passes over the client's data in mini-batches of
    ``batch_size`` (shuffled by the client's generator), capped at ``max_steps``. Each step
    asks ``gradient_fn`` for gradients and applies the client optimizer. The upload is
    ``W_local − W_global`` for trainable parameters and float buffers, plus ``num_samples``;
    for a sparse model (one that arrived with masks) a masked tensor's delta is sent as its
    kept coordinates only, in the order of the mask, which the server holds too.

    The model is built once per process (outside any measured step, so building it is
    never counted as client compute) and reloaded each round: simulated clients do not
    multiply memory.

    A ``companion`` module is method state trained beside the model (activity perturbation's
    local heads): its arrays travel under ``companion_prefix`` in both directions, its
    parameters are stepped by the same optimizer (gradients keyed with the prefix) and its delta
    is uploaded with the model's; evaluation and export never see it.
    """

    def __init__(
        self,
        model_fn: Callable[[], torch.nn.Module],
        *,
        local_epochs: int,
        batch_size: int,
        max_steps: int | None,
        optimizer: ClientOptimizerConfig,
        gradient_fn: GradientFn = backprop_gradient_fn,
        train_masks: dict[str, torch.Tensor] | None = None,
        companion: torch.nn.Module | None = None,
        companion_prefix: str = "",
    ) -> None:
        self.local_epochs, self.batch_size, self.max_steps = local_epochs, batch_size, max_steps
        self.optimizer, self.gradient_fn = optimizer, gradient_fn
        self.model = model_fn()
        self.masks: Masks = None
        self.train_masks = train_masks  # method.train_mask: the only coordinates stepped
        self.companion, self.prefix = companion, companion_prefix

    @classmethod
    def from_config(
        cls,
        model_fn: Callable[[], torch.nn.Module],
        cfg: LocalTrainingOptions,
        *,
        gradient_fn: GradientFn = backprop_gradient_fn,
        train_masks: dict[str, torch.Tensor] | None = None,
        companion: torch.nn.Module | None = None,
        companion_prefix: str = "",
    ) -> LocalTraining:
        """The client program with ``cfg``'s local epochs, batch size, step cap and optimizer;
        ``train_masks`` (``method.train_mask``, :mod:`fedge.methods.sparse`): the coordinates
        it may step, the rest staying at the round's global values; ``companion``: trained
        beside the model (see the class)."""
        return cls(
            model_fn,
            local_epochs=cfg.local_epochs,
            batch_size=cfg.batch_size,
            max_steps=cfg.max_steps,
            optimizer=cfg.client_optimizer,
            gradient_fn=gradient_fn,
            train_masks=train_masks,
            companion=companion,
            companion_prefix=companion_prefix,
        )

    @classmethod
    def loader(cls, model_fn: Callable[[], torch.nn.Module]) -> LocalTraining:
        """An instance used only for :meth:`load` (the global model and its masks), by client
        programs that compute their reply themselves (FedSGD, batch-level BAFFLE)."""
        return cls(
            model_fn, local_epochs=1, batch_size=1, max_steps=1, optimizer=ClientOptimizerConfig()
        )

    def load(self, message: Message, ctx: ClientContext) -> torch.nn.Module:
        """The process's model instance holding the global weights, in train mode; a sparse
        model's masks are kept in :attr:`masks` for this round, on the model's device."""
        who = f"round {ctx.rnd}, client {ctx.cid}"
        arrays = dict(message.arrays)
        if self.companion is not None:
            n = len(self.prefix)
            own = {k[n:]: arrays.pop(k) for k in list(arrays) if k.startswith(self.prefix)}
            load_arrays(self.companion, own, who=f"{who} ({self.prefix.rstrip('.')})")
        arrays, masks = unpack_model_arrays(arrays, self.model.state_dict(), who=who)
        device = next(self.model.parameters()).device
        self.masks = None if masks is None else {k: m.to(device) for k, m in masks.items()}
        load_arrays(self.model, arrays, who=who)
        self.model.train()
        ctx.meter.resident = self.model
        return self.model

    def run(self, message: Message, ctx: ClientContext) -> Message:
        return self.train(self.load(message, ctx), ctx)

    def _state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's state and the companion's, keyed as they travel."""
        state = model.state_dict()
        if self.companion is not None:
            state.update({self.prefix + k: v for k, v in self.companion.state_dict().items()})
        return state

    def train(self, model: torch.nn.Module, ctx: ClientContext) -> Message:
        """The local steps on a loaded ``model`` (this program's :attr:`model`) and the upload;
        only parameters with ``requires_grad`` are trained and sent (FedPT freezes the rest)."""
        params, buffers = split_trainable(model)
        named = dict(model.named_parameters())
        if self.companion is not None:  # its parameters, keyed as they travel
            extra = {self.prefix + k: p for k, p in self.companion.named_parameters()}
            params, named = params + list(extra), {**named, **extra}
        state = self._state(model)
        start = {k: state[k].detach().clone() for k in params + buffers}
        opt = self.optimizer.build([named[k] for k in params], rnd=ctx.rnd)
        if self.optimizer.state == "persistent":
            restore_optimizer_state(opt, ctx.state, names=params)
        ctx.global_arrays = (
            start  # the round's global weights, for gradient hooks (a proximal term)
        )
        losses: list[float] = []
        steps = 0
        # method.train_mask: the gradient (or estimate) only on the kept coordinates
        masks = (
            self.masks if self.train_masks is None else combine_masks(self.masks, self.train_masks)
        )
        # Dropout (vgg9, wrn) draws from torch's global RNG, which no generator of the run fixes:
        # a stream seeded from the client's own generator's seed (not drawn from it, so the batch
        # order is untouched) makes a client step the same in the engine's process, a worker, a
        # Flower node or after a resume. A model without random layers never reads it.
        with GlobalStream(ctx.generator).active():
            for _ in range(self.local_epochs):
                for batch in ctx.data.batches(self.batch_size, generator=ctx.generator):
                    loss, grads = self.gradient_fn(model, batch, ctx, masks)
                    for k, g in grads.items():
                        named[k].grad = g
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if self.train_masks is not None:  # weight decay moves zero-gradient weights
                        with torch.no_grad():
                            for k, m in self.train_masks.items():
                                named[k].copy_(torch.where(m, named[k], start[k]))
                    if loss is not None:
                        losses.append(loss)
                    steps += 1
                    if self.max_steps is not None and steps >= self.max_steps:
                        break
                if self.max_steps is not None and steps >= self.max_steps:
                    break
        if self.optimizer.state == "persistent":
            save_optimizer_state(opt, ctx.state, names=params)
        state = self._state(model)
        arrays = {k: state[k].detach() - start[k] for k in start}
        for k, m in (self.masks or {}).items():  # a sparse model's delta: kept coordinates only
            if (
                k in arrays
            ):  # a frozen tensor (method.freeze) is pruned but neither trained nor sent
                arrays[k] = arrays[k][m]
        # the upload leaves the device here (it travels as CPU bytes): the mechanisms composed
        # around the client (DP clipping, secure aggregation's masks) see CPU tensors
        arrays = {k: v.cpu() for k, v in arrays.items()}
        metrics = {"train_loss": sum(losses) / len(losses)} if losses else {}
        return Message(arrays, config={"num_samples": ctx.data.num_samples}, metrics=metrics)
