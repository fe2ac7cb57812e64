"""Local heads for BAFFLE's activity perturbation (``method.local_heads``; Ren, Kornblith, Liao and
Hinton, "Scaling Forward Gradient With Local Losses", ICLR 2023, arXiv:2210.03310v3, Section 4):
each named block of the model is closed by a head, average pooling to ``head_pool`` and a linear
classifier, whose loss scores the block's activity-perturbed layers
(:func:`~fedge.estimators.activity.activity_gradient`'s ``heads``). The heads are method state
beside the model: the server initialises them from the run's seed, sends them with the model
under :data:`~fedge.estimators.activity.HEAD_PREFIX` and averages the clients' head deltas as
FedAvg averages the model's (:class:`HeadAveraging`); a client trains them with its model, by the
same optimizer (:class:`~fedge.methods.local.LocalTraining`'s companion). Evaluation, export and
the model's parameter names never see them. Why and what they cost: ``docs/methods/baffle.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedge.core import transforms as T
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.core.rng import Draws, derive_seed, generator
from fedge.estimators.activity import HEAD_PREFIX
from fedge.estimators.zeroth_order import flat_layers
from fedge.methods.base import GlobalModel
from fedge.methods.fedavg import DeltaAveraging
from fedge.models.initialization import portable_reset_parameters, reset_parameters

__all__ = ["HeadAveraging", "block_ends", "build_heads"]


def block_ends(model: nn.Module, names: Sequence[str], estimated: Sequence[int]) -> list[int]:
    """The flat-layer index (:func:`~fedge.estimators.zeroth_order.flat_layers` order) of the
    last layer of each named module, in ``names``' order. Refuses, naming the fix, a name the
    model lacks, one given twice, a block ending at the network's last layer (its loss is the
    network's own), and a head whose block holds no layer of ``estimated`` (it would score
    nothing)."""
    layers = flat_layers(model)
    assert layers is not None  # activity_layers checked the model first
    modules = dict(model.named_modules())
    index = {id(m): i for i, m in enumerate(layers)}
    ends: list[int] = []
    for name in names:
        if name not in modules or not name:
            known = ", ".join(n for n in modules if n)
            raise ConfigError(
                f"method.local_heads names {name!r}, which is not a module of the model; expected "
                f"one of: {known}"
            )
        inside = [index[id(m)] for m in modules[name].modules() if id(m) in index]
        # a module inside one of the layers run as a whole closes that layer's block
        inside = inside or [i for i, m in enumerate(layers) if modules[name] in m.modules()]
        end = max(inside)
        if end in ends:
            raise ConfigError(f"method.local_heads: {name!r} closes a block already closed")
        if end == len(layers) - 1:
            raise ConfigError(
                f"method.local_heads names {name!r}, which ends with the network's last layer; its "
                "loss is the network's own: name a module before it"
            )
        ends.append(end)
    for end in ends:
        start = max([e for e in ends if e < end], default=-1)
        if not any(start < i <= end for i in estimated):
            raise ConfigError(
                f"method.local_heads: the block closed by layer {end} ({type(layers[end]).__name__}) "
                "holds no perturbed layer (method.perturb, method.freeze), so its head would score "
                "nothing; drop that name"
            )
    return ends


def build_heads(
    model: nn.Module,
    ends: Sequence[int],
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    pool: int,
    seed: int,
    draws: Draws = "torch",
    groups: int = 1,
    patches: int = 1,
) -> nn.ModuleDict:
    """One head per block end, keyed by its index as a string: for a (C, H, W) or (C, L) output,
    adaptive average pooling to ``pool`` (per spatial side), flattening and
    Linear(C·pool^d, groups·classes) (``groups`` classifiers, one per channel group:
    :func:`~fedge.estimators.activity.activity_gradient`'s ``head_groups``); for a flat output,
    the linear layer alone. Refuses a block whose channels ``groups`` does not divide, and with
    ``patches`` (patch losses) one whose output is not 2-d with sides ``patches`` divides. Initialised as the
    models are (:mod:`fedge.models.initialization`), from ``(seed, "local-heads")`` by the run's
    ``draws``, on the model's device."""
    layers = flat_layers(model)
    assert layers is not None
    param = next(model.parameters())
    heads = nn.ModuleDict()
    with torch.no_grad():
        h = torch.zeros((2, *input_shape), dtype=param.dtype, device=param.device)
        was = model.training
        model.eval()
        for i, layer in enumerate(layers[: max(ends, default=-1) + 1]):
            h = layer(h)
            if i in ends:
                if h.shape[1] % groups:
                    raise ConfigError(
                        f"method.head_groups={groups} must divide the channels of every head's block, "
                        f"but the block ending at layer {i} ({type(layer).__name__}) outputs "
                        f"{h.shape[1]}; choose a divisor of {h.shape[1]}"
                    )
                if patches > 1 and (h.dim() != 4 or h.shape[2] % patches or h.shape[3] % patches):
                    raise ConfigError(
                        f"method.head_patches={patches} splits every head's block output into "
                        f"{patches}x{patches} equal patches, but the block ending at layer {i} "
                        f"({type(layer).__name__}) outputs {tuple(h.shape[1:])}; choose a "
                        "divisor of its height and width"
                    )
                heads[str(i)] = _head(tuple(h.shape[1:]), num_classes * groups, pool)
        model.train(was)
    if draws == "portable":
        portable_reset_parameters(heads, derive_seed(seed, "local-heads"))
    else:
        reset_parameters(heads, generator(seed, "local-heads"))
    return heads.to(param.device, param.dtype)


def _head(shape: tuple[int, ...], classes: int, pool: int) -> nn.Sequential:
    if len(shape) == 1:
        return nn.Sequential(nn.Linear(shape[0], classes))
    if len(shape) not in (2, 3):
        raise ConfigError(f"method.local_heads: a block output of shape {shape} has no head")
    pooling = nn.AdaptiveAvgPool1d(pool) if len(shape) == 2 else nn.AdaptiveAvgPool2d(pool)
    width = shape[0] * pool ** (len(shape) - 1)
    return nn.Sequential(pooling, nn.Flatten(), nn.Linear(width, classes))


class HeadAveraging(DeltaAveraging):
    """FedAvg's delta averaging of the model, with the local heads beside it: sent under
    :data:`~fedge.estimators.activity.HEAD_PREFIX`, their mean delta applied by a server optimizer
    of the same configuration as the model's (its own state), checkpointed with the model.

    Args:
        model: the global model (updated in place).
        server_tx: the model's server optimizer.
        heads: the heads (:func:`build_heads`; updated in place).
        heads_tx: the heads' server optimizer (a second instance of the same configuration).
        masks: a pruned model's masks (the heads are never pruned).
    """

    def __init__(
        self,
        model: nn.Module,
        server_tx: T.Transform,
        heads: nn.ModuleDict,
        heads_tx: T.Transform,
        *,
        masks: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__(model, server_tx, replies_are_gradients=False, masks=masks)
        self.heads = GlobalModel(heads, heads_tx)
        state = heads.state_dict()
        self.head_shapes = {HEAD_PREFIX + k: state[k] for k in self.heads.param_names}
        self.expected.update({k: v.shape for k, v in self.head_shapes.items()})

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """The model's summands and every head parameter's delta."""
        return {
            **super().summands(),
            **{k: (v.shape, v.dtype) for k, v in self.head_shapes.items()},
        }

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        heads = {HEAD_PREFIX + k: v for k, v in self.heads.arrays().items()}
        broadcast = Message({**self.server.arrays(), **heads}, config={"round": rnd})
        return dict.fromkeys(client_ids, broadcast)

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        """The model's step on its mean delta, then the heads' on theirs."""
        n = len(HEAD_PREFIX)
        heads = {k[n:]: v for k, v in mean.items() if k.startswith(HEAD_PREFIX)}
        model = {k: v for k, v in mean.items() if not k.startswith(HEAD_PREFIX)}
        out = super().apply_mean(rnd, model, weight=weight, clients=clients)
        self.heads.step({k: -heads[k] for k in self.heads.param_names})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "local_heads": self.heads.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.heads.load_state_dict(state["local_heads"])
