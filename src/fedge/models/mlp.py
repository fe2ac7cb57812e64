"""Fully connected baselines: ``mlp`` (McMahan et al. 2017's "2NN" by default) and ``logreg``
(multinomial logistic regression), defined for any input shape. Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

import math

from torch import nn

from fedge.models.layers import fc_classifier, make_activation
from fedge.models.registry import ModelOptions, Widths, register_model

__all__ = ["MLPOptions", "build_logreg", "build_mlp"]


class MLPOptions(ModelOptions):
    """``mlp``: the hidden layer widths; ``()`` makes it a softmax regression."""

    hidden: Widths = (200, 200)


@register_model(
    "mlp",
    description="multilayer perceptron: flatten, (Linear-act) per hidden size, Linear",
    reference="McMahan et al. 2017 (2NN)",
    norms=("none",),
    options=MLPOptions,
    input_shapes=((1, 28, 28), (3, 32, 32), (1, 8, 8), (20,)),
    flat_inputs=True,
)
def build_mlp(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    activation: str,
    norm: str,
    hidden: tuple[int, ...],
) -> tuple[nn.Sequential, nn.Sequential]:
    features = nn.Sequential()
    d = math.prod(input_shape)
    for i, h in enumerate(hidden, start=1):
        block = nn.Sequential()
        if i == 1:
            block.add_module("flatten", nn.Flatten())
        block.add_module("linear", nn.Linear(d, h))
        block.add_module("act", make_activation(activation))
        features.add_module(f"fc{i}", block)
        d = h
    classifier = nn.Sequential()
    if not hidden:  # then the classifier has to flatten
        classifier.add_module("flatten", nn.Flatten())
    classifier.add_module("out", nn.Linear(d, num_classes))
    return features, classifier


@register_model(
    "logreg",
    description="multinomial logistic regression: flatten, Linear",
    reference="softmax regression; BAFFLE (seed 000) Sec. 2 on FedZO/DLZO",
    activations=(),
    norms=("none",),
    default_activation=None,
    input_shapes=((1, 28, 28), (3, 32, 32), (1, 8, 8), (20,)),
    flat_inputs=True,
)
def build_logreg(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    activation: str | None,
    norm: str,
) -> tuple[nn.Sequential, nn.Sequential]:
    return nn.Sequential(), fc_classifier(math.prod(input_shape), num_classes)
