"""ResNet-20 for CIFAR (He et al. 2016, Sec. 4.2, option-A shortcuts, 0.27M parameters), the deep
model of NTK-pruning (seed 004). Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from fedge.models.layers import make_activation, make_norm, pooled_classifier
from fedge.models.registry import register_model
from fedge.models.vgg import AffineOptions

__all__ = ["BasicBlock", "PadShortcut", "build_resnet20"]


class PadShortcut(nn.Module):
    """Option-A shortcut: keep every ``stride``-th pixel, then zero-pad channels to ``c_out``."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride, self.extra = stride, c_out - c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[..., :: self.stride, :: self.stride]
        lo = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, lo, self.extra - lo))  # pad dim -3 (channels)


def _conv_norm(c_in: int, c_out: int, stride: int, norm: str, affine: bool) -> nn.Sequential:
    seq = nn.Sequential()
    seq.add_module("conv", nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=norm == "none"))
    n = make_norm(norm, c_out, affine=affine)
    if n is not None:
        seq.add_module("norm", n)
    return seq


class BasicBlock(nn.Module):
    """He et al.'s basic block: ``act(x_shortcut + norm(conv(act(norm(conv(x))))))``."""

    def __init__(
        self, c_in: int, c_out: int, *, stride: int, activation: str, norm: str, affine: bool
    ) -> None:
        super().__init__()
        self.branch1 = _conv_norm(c_in, c_out, stride, norm, affine)
        self.act1 = make_activation(activation)
        self.branch2 = _conv_norm(c_out, c_out, 1, norm, affine)
        self.shortcut = PadShortcut(c_in, c_out, stride) if c_in != c_out or stride != 1 else None
        self.act2 = make_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.branch2(self.act1(self.branch1(x)))
        return self.act2(y + (x if self.shortcut is None else self.shortcut(x)))


@register_model(
    "resnet20",
    description="CIFAR ResNet-20 (16-32-64 channels, 3 basic blocks per stage, option-A shortcuts)",
    reference="He et al. 2016 Sec. 4.2; NTK-pruning (seed 004) Sec. 5",
    default_norm="batch",
    options=AffineOptions,
    input_shapes=((3, 32, 32), (1, 28, 28), (1, 8, 8)),
)
def build_resnet20(
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    activation: str,
    norm: str,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    stem = _conv_norm(input_shape[0], 16, 1, norm, norm_affine)
    stem.add_module("act", make_activation(activation))
    blocks: OrderedDict[str, nn.Module] = OrderedDict(stem=stem)
    c_in = 16
    for s, c in enumerate((16, 32, 64), start=1):
        for b in range(1, 4):
            stride = 2 if s > 1 and b == 1 else 1
            blocks[f"s{s}b{b}"] = BasicBlock(
                c_in, c, stride=stride, activation=activation, norm=norm, affine=norm_affine
            )
            c_in = c
    return nn.Sequential(blocks), pooled_classifier(c_in, num_classes)
