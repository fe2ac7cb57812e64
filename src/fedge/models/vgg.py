"""VGG-style networks: PPFL's VGG9 (seed 001, Table 1) and the CIFAR VGG-19 that EPPFL splits
(Simonyan & Zisserman 2015, configuration E; seed 003, Sec. 5). Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedge.models.layers import MaxPool2x2, conv_block, fc_classifier, output_shape
from fedge.models.registry import Flag, ModelOptions, register_model

__all__ = ["VGG9", "VGG19", "build_vgg19", "build_vgg9", "vgg_features"]

Config = Sequence[int | float | str]

VGG9: Config = (32, 64, "M", 128, 128, "M", 0.05, 256, 256, "M", 0.1)
VGG19: Config = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    512,
    "M",
)


def vgg_features(
    in_channels: int, config: Config, *, activation: str, norm: str, norm_affine: bool
) -> nn.Sequential:
    """The ``features`` stack for a VGG ``config`` (see the module docstring)."""
    features = nn.Sequential()
    block: nn.Sequential | None = None
    for item in config:
        if isinstance(item, int):
            block = conv_block(
                in_channels,
                item,
                kernel_size=3,
                padding=1,
                activation=activation,
                norm=norm,
                norm_affine=norm_affine,
            )
            features.add_module(f"conv{len(features) + 1}", block)
            in_channels = item
        elif block is None:
            raise ValueError(f"VGG config must start with a conv, got {item!r}")
        elif item == "M":
            block.add_module("pool", MaxPool2x2())
        elif isinstance(item, float):
            block.add_module("drop", nn.Dropout(item))
        else:
            raise ValueError(f"unknown VGG config item {item!r}")
    return features


class VGG9Options(ModelOptions):
    """``vgg9``: PPFL's two dropout layers (0.05, 0.1) on or off."""

    dropout: Flag = True
    norm_affine: Flag = True


class AffineOptions(ModelOptions):
    """Models whose only option is an affine transform in their norm layers."""

    norm_affine: Flag = True


@register_model(
    "vgg9",
    description="PPFL's VGG9: C32-C64-MP-C128x2-MP-D0.05-C256x2-MP-D0.1-FC512x2-FC10",
    reference="PPFL (seed 001) Table 1; FedMA VGG-9",
    options=VGG9Options,
)
def build_vgg9(
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    activation: str,
    norm: str,
    dropout: bool,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    config = VGG9 if dropout else tuple(x for x in VGG9 if not isinstance(x, float))
    features = vgg_features(
        input_shape[0], config, activation=activation, norm=norm, norm_affine=norm_affine
    )
    c, h, w = output_shape(features, input_shape)
    return features, fc_classifier(c * h * w, num_classes, hidden=(512, 512), activation=activation)


@register_model(
    "vgg19",
    description="VGG-19 for 32x32 inputs: 16 3x3 convs (64-512) with 5 max pools, FC",
    reference="Simonyan & Zisserman 2015 (config E); EPPFL (seed 003) Sec. 5",
    default_norm="batch",
    options=AffineOptions,
    input_shapes=((3, 32, 32),),
)
def build_vgg19(
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    activation: str,
    norm: str,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    features = vgg_features(
        input_shape[0], VGG19, activation=activation, norm=norm, norm_affine=norm_affine
    )
    c, h, w = output_shape(features, input_shape)
    return features, fc_classifier(c * h * w, num_classes)
