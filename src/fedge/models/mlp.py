"""Fully connected baselines: ``mlp`` and ``logreg`` (multinomial logistic regression).

Small, fast, and defined for any input shape: the digits quickstart (1x8x8) and tests use them.

``mlp``: flatten, then one ``Linear - act`` block per entry of ``hidden`` (default (200, 200),
the "2NN" of McMahan et al. 2017, FedAvg's MNIST MLP: 199,210 parameters on 1x28x28), then the
output layer. The first block flattens its input, so ``features`` holds ``fc1, fc2, ...`` and
``classifier`` just ``out``.

``logreg``: ``features`` is empty; ``classifier`` is flatten then one Linear (softmax
regression, the model FedZO and DLZO study; BAFFLE seed 000, Sec. 2).

Both take tabular features too (``input_shape=(F,)``, e.g. a CSV dataset): flattening a
(B, F) batch is the identity. Neither takes a norm (only ``norm="none"`` is accepted); ``logreg`` takes no activation.
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
