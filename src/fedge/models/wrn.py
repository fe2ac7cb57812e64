"""WRN-10-2 (Zagoruyko & Komodakis 2016): the wide residual network BAFFLE trains as its "light
weight deep model" (seed 000, Sec. 4.1, 3.0x10^5 parameters). Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from pydantic import field_validator
from torch import nn

from fedge.models.layers import make_activation, make_norm, pooled_classifier
from fedge.models.registry import Flag, ModelOptions, Number, register_model

__all__ = ["WideUnit", "build_wrn_10_2"]


def _norm_act(norm: str, channels: int, affine: bool, activation: str) -> nn.Sequential:
    seq = nn.Sequential()
    n = make_norm(norm, channels, affine=affine)
    if n is not None:
        seq.add_module("norm", n)
    seq.add_module("act", make_activation(activation))
    return seq


class WideUnit(nn.Module):
    """Pre-activation residual unit: ``x + conv2(drop(act(norm(conv1(act(norm(x)))))))``."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        *,
        stride: int,
        activation: str,
        norm: str,
        affine: bool,
        dropout: float,
    ) -> None:
        super().__init__()
        self.pre = _norm_act(norm, c_in, affine, activation)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.mid = _norm_act(norm, c_out, affine, activation)
        if dropout > 0:
            self.mid.add_module("drop", nn.Dropout(dropout))
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
            if c_in != c_out or stride != 1
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, H, W) -> (B, C_out, H', W')
        o = self.pre(x)
        y = self.conv2(self.mid(self.conv1(o)))
        return y + (x if self.shortcut is None else self.shortcut(o))


def _wrn(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    depth: int,
    width: int,
    activation: str,
    norm: str,
    affine: bool,
    dropout: float,
) -> tuple[nn.Sequential, nn.Sequential]:
    n = (depth - 4) // 6
    widths = [16 * width, 32 * width, 64 * width]
    blocks: OrderedDict[str, nn.Module] = OrderedDict(
        stem=nn.Conv2d(input_shape[0], 16, 3, padding=1, bias=True)
    )
    c_in = 16
    for s, c in enumerate(widths, start=1):
        for b in range(1, n + 1):
            stride = 2 if s > 1 and b == 1 else 1
            name = f"unit{s}" if n == 1 else f"s{s}u{b}"
            blocks[name] = WideUnit(
                c_in,
                c,
                stride=stride,
                activation=activation,
                norm=norm,
                affine=affine,
                dropout=dropout,
            )
            c_in = c
    blocks["post"] = _norm_act(norm, c_in, affine, activation)
    return nn.Sequential(blocks), pooled_classifier(c_in, num_classes)


class WRNOptions(ModelOptions):
    """``wrn-10-2``: dropout between the two convs of a block (BAFFLE uses none)."""

    dropout: Number = 0.0
    norm_affine: Flag = False

    @field_validator("dropout")
    @classmethod
    def _probability(cls, v: float) -> float:
        if not 0.0 <= v < 1.0:
            raise ValueError("must be in [0, 1)")
        return v


@register_model(
    "wrn-10-2",
    description="WideResNet depth 10 width 2 (pre-activation, 32-64-128 channels), BAFFLE's",
    reference=(
        "BAFFLE (seed 000) Sec. 4.1; Zagoruyko & Komodakis 2016; FengHZ/BAFFLE model/wideresnet.py"
    ),
    default_norm="batch",
    options=WRNOptions,
    input_shapes=((3, 32, 32), (1, 28, 28), (1, 8, 8)),
)
def build_wrn_10_2(
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    activation: str,
    norm: str,
    dropout: float,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    return _wrn(
        input_shape,
        num_classes,
        depth=10,
        width=2,
        activation=activation,
        norm=norm,
        affine=norm_affine,
        dropout=dropout,
    )
