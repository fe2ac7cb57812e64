"""PPFL's "AlexNet": three 3x3 conv layers of 128 filters, average pool 16, one FC layer.

PPFL (seed 001) Table 1 writes it "C128x3-AP16-FC10" (after Belilovsky et al.'s greedy
layer-wise CNNs): 3x3 filters, ReLU after every conv, average pooling with stride (and window)
16, then the output layer. Convs use padding 1 so the map stays HxW until the pool::

    conv1  Conv(C->128, 3x3, pad 1) - [norm] - act
    conv2  Conv(128->128, 3x3, pad 1) - [norm] - act
    conv3  Conv(128->128, 3x3, pad 1) - [norm] - act - AvgPool(16, stride 16)
    classifier: flatten - FC(128 * (H//16) * (W//16) -> classes)

303,882 parameters on CIFAR-10 (the 2x2 pooled map gives 512 features); 297,738 on 1x28x28.
The 16x16 pool needs inputs of at least 16x16.
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
