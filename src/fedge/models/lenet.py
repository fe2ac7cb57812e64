"""The LeNet family: BAFFLE's LeNet (``lenet``, seed 000, Sec. 4.1), classic LeNet-5 (``lenet5``,
LeCun et al. 1998) and PPFL's LeNet (``lenet-ppfl``, seed 001, Table 1). Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from pydantic import field_validator
from torch import nn

from fedge.models.layers import (
    ConvOptions,
    MaxPool2x2,
    conv_block,
    fc_classifier,
    make_activation,
    output_shape,
    pooled_classifier,
)
from fedge.models.registry import Flag, Int, ModelOptions, Widths, register_model

__all__ = [
    "LeNet5Options",
    "LeNetOptions",
    "build_lenet",
    "build_lenet5",
    "build_lenet_ppfl",
]

_Shape = tuple[int, int, int]


def _two_conv(
    input_shape: _Shape,
    widths: tuple[int, int],
    *,
    padding: tuple[int, int],
    pool2: bool,
    activation: str,
    norm: str,
    norm_affine: bool,
) -> nn.Sequential:
    """conv1 (with 2x2 max pool) and conv2 (pooled if ``pool2``), 5x5 kernels."""
    c1, c2 = widths
    common = ConvOptions(kernel_size=5, activation=activation, norm=norm, norm_affine=norm_affine)
    return nn.Sequential(
        OrderedDict(
            conv1=conv_block(input_shape[0], c1, padding=padding[0], pool=MaxPool2x2(), **common),
            conv2=conv_block(
                c1, c2, padding=padding[1], pool=MaxPool2x2() if pool2 else None, **common
            ),
        )
    )


class LeNetOptions(ModelOptions):
    """``lenet``: the two conv widths, and whether the norm layers have an affine transform."""

    channels: Widths = (16, 64)
    norm_affine: Flag = False

    @field_validator("channels")
    @classmethod
    def _two_widths(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if len(v) != 2:
            raise ValueError("takes 2 widths")
        return v


class LeNet5Options(ModelOptions):
    """``lenet5`` and ``lenet-ppfl``: zero padding of both convs (2 makes 28x28 keep its size)."""

    padding: Int = 0
    norm_affine: Flag = True

    @field_validator("padding")
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must be >= 0")
        return v


@register_model(
    "lenet",
    description="BAFFLE's LeNet: conv5x5(16)-GN-act-maxpool, conv5x5(64)-GN-act, global avgpool, FC",
    reference="BAFFLE (seed 000) Sec. 4.1 and 3.3; FengHZ/BAFFLE model/lenet.py",
    default_activation="hardswish",
    default_norm="group",
    options=LeNetOptions,
    input_shapes=((1, 28, 28), (3, 32, 32), (1, 8, 8)),
)
def build_lenet(
    *,
    input_shape: _Shape,
    num_classes: int,
    activation: str,
    norm: str,
    channels: tuple[int, ...],
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    features = _two_conv(
        input_shape,
        (channels[0], channels[1]),
        padding=(2, 2),
        pool2=False,
        activation=activation,
        norm=norm,
        norm_affine=norm_affine,
    )
    output_shape(features, input_shape)  # fail early, with the input size, if too small
    return features, pooled_classifier(channels[1], num_classes)


def _pooled_convs_fc(
    input_shape: _Shape,
    channels: tuple[int, int],
    hidden: tuple[int, ...],
    num_classes: int,
    activation: str,
    norm: str,
    padding: int,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    """Two 5x5 convs, each followed by 2x2 max pooling (the first padded by ``padding``), then
    fully connected layers of widths ``hidden`` and the output layer."""
    features = _two_conv(
        input_shape,
        channels,
        padding=(padding, 0),
        pool2=True,
        activation=activation,
        norm=norm,
        norm_affine=norm_affine,
    )
    c, h, w = output_shape(features, input_shape)
    return features, fc_classifier(c * h * w, num_classes, hidden=hidden, activation=activation)


@register_model(
    "lenet5",
    description="classic LeNet-5: conv5x5(6)-act-maxpool, conv5x5(16)-act-maxpool, FC 120-84",
    reference="LeCun et al. 1998; LeNet-5 of NTK-pruning (seed 004) Sec. 5",
    options=LeNet5Options,
)
def build_lenet5(
    *,
    input_shape: _Shape,
    num_classes: int,
    activation: str,
    norm: str,
    padding: int,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    return _pooled_convs_fc(
        input_shape, (6, 16), (120, 84), num_classes, activation, norm, padding, norm_affine
    )


@register_model(
    "lenet-ppfl",
    description="PPFL's LeNet C20-MP-C50-MP-FC500-FC10 (5x5 convs, ReLU)",
    reference="PPFL (seed 001) Table 1",
    options=LeNet5Options,
)
def build_lenet_ppfl(
    *,
    input_shape: _Shape,
    num_classes: int,
    activation: str,
    norm: str,
    padding: int,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    return _pooled_convs_fc(
        input_shape, (20, 50), (500,), num_classes, activation, norm, padding, norm_affine
    )


@register_model(
    "lenet-dlg",
    description="the LeNet that DLG attacks: three conv5x5(12) with padding 2 (strides 2, 2, 1), sigmoid, no "
    "pooling, FC",
    reference="Zhu, Liu, Han: Deep Leakage from Gradients (NeurIPS 2019), Sec. 4.1 and their models/vision.py",
    default_activation="sigmoid",
    norms=("none",),
    input_shapes=((1, 28, 28), (3, 32, 32), (1, 8, 8)),
)
def build_lenet_dlg(
    *, input_shape: _Shape, num_classes: int, activation: str, norm: str
) -> tuple[nn.Sequential, nn.Sequential]:
    """No pooling and a smooth activation: every input pixel reaches the gradient, which is
    what makes single-sample gradient inversion work (Zhu et al. 2019).

    Parameters, 10 classes: (1, 28, 28): convs 312 + 3,612 + 3,612, FC 12·7·7·10 + 10 = 5,890,
    total 13,426; (3, 32, 32): 912 + 3,612 + 3,612 + (768·10 + 10) = 15,826 (Zhu et al.'s CIFAR
    LeNet has the same 768-wide FC)."""
    c = input_shape[0]
    layers: list[nn.Module] = []
    for i, stride in enumerate((2, 2, 1)):
        layers += [nn.Conv2d(c if i == 0 else 12, 12, kernel_size=5, padding=2, stride=stride)]
        layers += [make_activation(activation)]
    features = nn.Sequential(*layers)
    return features, fc_classifier(math.prod(output_shape(features, input_shape)), num_classes)
