"""PPFL's "AlexNet" (seed 001, Table 1, "C128x3-AP16-FC10"): three 3x3 conv layers of 128 filters,
average pool 16, one FC layer. Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedge.models.layers import ConvOptions, conv_block, fc_classifier, output_shape
from fedge.models.registry import register_model
from fedge.models.vgg import AffineOptions

__all__ = ["build_alexnet_ppfl"]


@register_model(
    "alexnet-ppfl",
    description="PPFL's AlexNet C128x3-AP16-FC10 (3x3 convs, ReLU)",
    reference="PPFL (seed 001) Table 1",
    options=AffineOptions,
)
def build_alexnet_ppfl(
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    activation: str,
    norm: str,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    common = ConvOptions(kernel_size=3, activation=activation, norm=norm, norm_affine=norm_affine)
    features = nn.Sequential(
        OrderedDict(
            conv1=conv_block(input_shape[0], 128, padding=1, **common),
            conv2=conv_block(128, 128, padding=1, **common),
            conv3=conv_block(128, 128, padding=1, pool=nn.AvgPool2d(16, stride=16), **common),
        )
    )
    c, h, w = output_shape(features, input_shape)
    return features, fc_classifier(c * h * w, num_classes)
