"""PPFL's stages (seed 001, Algorithm 1-2, Sec. 5): which modules each stage trains (a group of
``block_layers`` conv blocks, then the classifier atop all convs), the classifier head a conv stage
trains with (pool, 1x1 conv, a fresh copy of the model's classifier; initialised from (seed,
"ppfl-head", stage)), the frozen layers before it, and its enclave need S_l(b). Details:
``docs/methods/ppfl.md``, "Stages and heads".
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from fedge.core.errors import ConfigError
from fedge.core.rng import generator

__all__ = ["Stage", "StageNet", "plan_stages", "stage_net", "frozen_net", "stage_need"]

F32 = 4


@dataclass(frozen=True)
class Stage:
    index: int
    prefixes: tuple[str, ...]  # module paths trained in this stage ("features.conv1", "classifier")
    in_shape: tuple[
        int, ...
    ]  # per-sample input shape of the stage (what the REE sends the enclave)
    out_shape: tuple[int, ...]
    is_classifier: bool

    def holds(self, key: str) -> bool:
        """Whether the model tensor ``key`` (a state-dict name) is trained in this stage."""
        return any(key.startswith(p + ".") for p in self.prefixes)


def _check(model: nn.Module) -> None:
    if not (
        isinstance(getattr(model, "features", None), nn.Sequential)
        and isinstance(getattr(model, "classifier", None), nn.Sequential)
    ):
        raise ConfigError(
            f"ppfl needs a zoo model with `features` and `classifier` sequences; {type(model).__name__} has not"
        )


def plan_stages(model: nn.Module, input_shape: tuple[int, ...], block_layers: int) -> list[Stage]:
    """The stages of ``model``: conv blocks grouped by ``block_layers``, then the classifier."""
    _check(model)
    features = model.features
    assert isinstance(features, nn.Module)
    names = [n for n, _ in features.named_children()]
    if block_layers < 1:
        raise ConfigError(f"method.block_layers={block_layers}; expected at least 1")
    stages: list[Stage] = []
    x = torch.zeros(1, *input_shape)
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        for i in range(0, len(names), block_layers):
            group = names[i : i + block_layers]
            shape_in = tuple(x.shape[1:])
            for n in group:
                x = getattr(model.features, n)(x)
            stages.append(
                Stage(
                    len(stages),
                    tuple(f"features.{n}" for n in group),
                    shape_in,
                    tuple(x.shape[1:]),
                    False,
                )
            )
    stages.append(Stage(len(stages), ("classifier",), tuple(x.shape[1:]), (0,), True))
    return stages


def _module(model: nn.Module, prefix: str) -> nn.Module:
    return model.get_submodule(prefix)


class StageNet(nn.Module):
    """The stage's layers followed by its head (no head for the classifier stage)."""

    def __init__(self, layers: nn.Sequential, head: nn.Module | None) -> None:
        super().__init__()
        self.layers, self.head = layers, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(x)
        return x if self.head is None else self.head(x)


def _reinit(module: nn.Module, g: torch.Generator) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            bound = 1.0 / math.sqrt(m.weight[0].numel())
            with torch.no_grad():
                m.weight.uniform_(-bound, bound, generator=g)
                if m.bias is not None:
                    m.bias.uniform_(-bound, bound, generator=g)


def stage_net(model: nn.Module, stages: list[Stage], index: int, *, seed: int) -> StageNet:
    """Stage ``index``'s trainable network: copies of its layers from ``model`` and a seeded head."""
    st = stages[index]
    layers = nn.Sequential(*[copy.deepcopy(_module(model, p)) for p in st.prefixes])
    if st.is_classifier:
        return StageNet(layers, None)
    last = stages[-1].in_shape  # the last conv block's output (C_f, H_f, W_f)
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(tuple(last[1:])),
        nn.Conv2d(st.out_shape[0], last[0], kernel_size=1),
        nn.ReLU(),
        copy.deepcopy(_submodule(model, "classifier")),
    )
    _reinit(head, generator(seed, "ppfl-head", index))
    return StageNet(layers, head)


def frozen_net(model: nn.Module, stages: list[Stage], upto: int) -> nn.Sequential:
    """Layers of stages 0..upto-1 (frozen, run in the REE), sharing ``model``'s modules."""
    mods = [_module(model, p) for st in stages[:upto] for p in st.prefixes]
    return nn.Sequential(*mods).eval()


def activation_bytes(net: nn.Module, in_shape: tuple[int, ...]) -> int:
    """Bytes of the outputs of every leaf module for one sample (what backward keeps)."""
    total = 0

    def hook(_m, _i, out):
        nonlocal total
        total += out.numel() * out.element_size()

    hs = [m.register_forward_hook(hook) for m in net.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            net(torch.zeros(1, *in_shape))
    finally:
        for h in hs:
            h.remove()
    return total


def stage_need(net: nn.Module, in_shape: tuple[int, ...], batch_size: int) -> int:
    """S_l(b) in bytes (Algorithm 1): parameters and buffers, a gradient and a momentum
    buffer per trainable parameter, and per sample the input batch plus every leaf's output
    and its gradient in backward."""
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    per_sample = (
        math.prod(in_shape) * F32 + 8 + 2 * activation_bytes(net, in_shape)
    )  # + an int64 label
    return params * 3 + buffers + batch_size * per_sample


def _submodule(model: nn.Module, name: str) -> nn.Module:
    sub = getattr(model, name)
    assert isinstance(sub, nn.Module), f"model.{name} is not a module"
    return sub
