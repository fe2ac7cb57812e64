"""Seeded, explicit-generator initialisation of every parameter and buffer of a model, equal to
torch's default initialisation (FedPT, seed 002, Sec. 3: clients regenerate frozen weights).
Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["reset_parameters"]

_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def _kaiming_default(
    module: nn.modules.conv._ConvNd | nn.Linear, generator: torch.Generator | None
) -> None:
    """torch's default Conv/Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias."""
    w = module.weight
    # kaiming_uniform_(a=sqrt(5)) is U(±1/sqrt(fan_in)); called the same way torch does so the
    # bound is the same float and the draws match torch's own init bit for bit.
    nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
    if module.bias is not None:
        fan_in = w.shape[1] * math.prod(w.shape[2:])
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(module.bias, -bound, bound, generator=generator)


@torch.no_grad()
def reset_parameters(model: nn.Module, generator: torch.Generator | None) -> nn.Module:
    """Re-initialise ``model`` in place, drawing only from ``generator``; returns ``model``.

    * Conv1d/2d/3d and Linear: kaiming-uniform weight and uniform bias, as torch's default
      (bound ``1/sqrt(fan_in)``).
    * BatchNorm/GroupNorm/LayerNorm: weight 1, bias 0; BatchNorm running statistics reset.

    Modules are visited in ``named_modules()`` order, weight before bias, so the draws are a
    fixed function of the architecture. ``generator=None`` draws from torch's global generator
    (what torch's constructors do).

    Raises:
        TypeError: a module owns parameters or buffers this function does not know how to initialise
            (rather than silently leaving them at a global-RNG or uninitialised value).
    """
    for name, m in model.named_modules():
        if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)):
            _kaiming_default(m, generator)
        elif isinstance(m, _NORMS):
            if getattr(m, "weight", None) is not None:
                nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.modules.batchnorm._NormBase):
                m.reset_running_stats()
        else:
            state = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
            if state:
                raise TypeError(
                    f"reset_parameters does not know how to initialise {name or 'the model'} "
                    f"({type(m).__name__}); add a rule for it in fedge.models.initialization"
                )
    return model
