"""Seeded, explicit-generator initialisation of every parameter and buffer of a model, equal to
torch's default initialisation (FedPT, seed 002, Sec. 3: clients regenerate frozen weights);
:func:`portable_reset_parameters` draws the same distributions from :mod:`fedge.core.portable`,
a stream per parameter name, the same bits on every machine. Design notes:
docs/decisions.md#models.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedge.core import portable

__all__ = ["portable_reset_parameters", "reset_parameters"]

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


def kaiming_bounds(module: nn.modules.conv._ConvNd | nn.Linear) -> tuple[float, float]:
    """The half-widths torch's default init draws ``module.weight`` and ``module.bias`` from:
    ``kaiming_uniform_(a=sqrt(5))``'s ``sqrt(3) · gain / sqrt(fan_in)`` with
    ``gain = sqrt(2 / (1 + a²))`` (= 1/sqrt(fan_in) up to rounding), and ``1/sqrt(fan_in)``
    (0 when fan_in is 0), computed as torch computes them, in float64."""
    w = module.weight
    fan_in = nn.init._calculate_fan_in_and_fan_out(w)[0] if w.dim() >= 2 else 0
    if fan_in == 0:
        return 0.0, 0.0
    gain = nn.init.calculate_gain("leaky_relu", math.sqrt(5))
    weight = math.sqrt(3.0) * (gain / math.sqrt(fan_in))
    return weight, 1 / math.sqrt(fan_in)


@torch.no_grad()
def portable_reset_parameters(model: nn.Module, seed: int) -> nn.Module:
    """Re-initialise ``model`` in place from portable draws of ``seed``; returns ``model``.

    The distributions of :func:`reset_parameters`, drawn with
    :func:`fedge.core.portable.symmetric_uniform` (uniform on (−b, b), float32):

    * Conv1d/2d/3d and Linear: weight ``U(±b_w)``, bias ``U(±b_b)`` with torch's own bounds
      (:func:`kaiming_bounds`), each parameter from ``stream_key(seed, "init", "<module>.weight")``
      (or ``.bias``), so a parameter's values depend on its name and shape only;
    * BatchNorm/GroupNorm/LayerNorm: weight 1, bias 0; BatchNorm running statistics reset.

    Raises:
        TypeError: a module owns parameters or buffers this function does not know how to
            initialise (as :func:`reset_parameters`).
    """
    seed = int(seed)
    for name, m in model.named_modules():
        if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)):
            prefix = f"{name}." if name else ""
            bounds = kaiming_bounds(m)
            for attr, bound in zip(("weight", "bias"), bounds):
                p = getattr(m, attr)
                if p is None:
                    continue
                key = portable.stream_key(seed, "init", prefix + attr)
                p.copy_(portable.symmetric_uniform(key, p.shape, bound))
        else:
            _reset_other(name, m)
    return model


def _reset_other(name: str, m: nn.Module) -> None:
    """Norms to weight 1, bias 0 (and fresh running statistics); refuse unknown state."""
    if isinstance(m, _NORMS):
        if getattr(m, "weight", None) is not None:
            nn.init.ones_(m.weight)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.modules.batchnorm._NormBase):
            m.reset_running_stats()
        return
    state = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
    if state:
        raise TypeError(
            f"reset_parameters does not know how to initialise {name or 'the model'} "
            f"({type(m).__name__}); add a rule for it in fedge.models.initialization"
        )


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
        else:
            _reset_other(name, m)
    return model
