"""FedPT's EMNIST CNN (seed 002, Sec. 4.1, Table 1; Reddi et al., arXiv:2003.00295v5, Table 7):
two 3x3 convolutions, one large dense layer, the output layer. Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedge.core.errors import ConfigError
from fedge.models.layers import ConvOptions, MaxPool2x2, conv_block, fc_classifier, output_shape
from fedge.models.registry import register_model

__all__ = ["build_cnn_fedpt"]


@register_model(
    "cnn-fedpt",
    description="FedPT's EMNIST CNN: conv3x3(32)-act, conv3x3(64)-act-maxpool, FC 128 (98% of weights), FC",
    reference="FedPT (seed 002) Sec. 4.1 Table 1; Reddi et al. arXiv:2003.00295v5 Table 7",
    options={"channels": (32, 64), "hidden": 128, "norm_affine": True},
)
def build_cnn_fedpt(
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    activation: str,
    norm: str,
    channels: tuple[int, ...],
    hidden: int,
    norm_affine: bool,
) -> tuple[nn.Sequential, nn.Sequential]:
    if len(channels) != 2:
        raise ConfigError(
            f"option 'channels' of model 'cnn-fedpt' takes 2 widths, got {channels!r}"
        )
    if hidden < 1:
        raise ConfigError(f"option 'hidden' of model 'cnn-fedpt' must be >= 1, got {hidden}")
    common = ConvOptions(kernel_size=3, activation=activation, norm=norm, norm_affine=norm_affine)
    features = nn.Sequential(
        OrderedDict(
            conv1=conv_block(input_shape[0], channels[0], padding=0, **common),
            conv2=conv_block(channels[0], channels[1], padding=0, pool=MaxPool2x2(), **common),
        )
    )
    c, h, w = output_shape(features, input_shape)  # (64, 12, 12) on 28x28
    return features, fc_classifier(c * h * w, num_classes, hidden=(hidden,), activation=activation)
