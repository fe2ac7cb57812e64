"""Models: one architecture per module, built by name through one registry; every model is a
:class:`Network` (``features`` then ``classifier``). Design notes: docs/decisions.md#models.

>>> from fedge.models import build_model, list_models
>>> net = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0)
"""

from fedge.models import alexnet, cnn, lenet, mlp, resnet, vgg, wrn  # noqa: F401  (registers models)
from fedge.models.initialization import portable_reset_parameters, reset_parameters
from fedge.models.layers import MaxPool2x2
from fedge.models.registry import (
    ModelInfo,
    ModelSpec,
    Network,
    build_model,
    count_parameters,
    list_models,
    model_info,
    model_names,
    register_model,
)

__all__ = [
    "MaxPool2x2",
    "ModelInfo",
    "ModelSpec",
    "Network",
    "build_model",
    "count_parameters",
    "list_models",
    "model_info",
    "model_names",
    "register_model",
    "portable_reset_parameters",
    "reset_parameters",
]
