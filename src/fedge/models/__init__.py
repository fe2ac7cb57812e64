"""Models: one architecture per module, built by name through one registry.

>>> from fedge.models import build_model, list_models
>>> net = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0)

Registered models (``fedge models`` lists them with parameter counts):

=============  =====================================================  ==========  =========
name           what                                                   activation  norm
=============  =====================================================  ==========  =========
lenet          BAFFLE's LeNet, 2.7e4 params (lenet.py)                hardswish   group
lenet5         classic LeNet-5 (lenet.py)                             relu        none
lenet-ppfl     PPFL's LeNet C20-MP-C50-MP-FC500-FC10 (lenet.py)       relu        none
cnn-fedpt      FedPT's EMNIST CNN, 98% of weights in fc1 (cnn.py)     relu        none
alexnet-ppfl   PPFL's AlexNet C128x3-AP16-FC10 (alexnet.py)           relu        none
vgg9           PPFL's VGG9 (vgg.py)                                   relu        none
vgg19          CIFAR VGG-19, EPPFL's model (vgg.py)                   relu        batch
wrn-10-2       BAFFLE's WideResNet-10-2, 3.0e5 params (wrn.py)        relu        batch
resnet20       CIFAR ResNet-20, 0.27M params (resnet.py)              relu        batch
mlp            MLP, hidden (200, 200) (mlp.py)                        relu        none only
logreg         softmax regression (mlp.py)                            none        none only
=============  =====================================================  ==========  =========

Every model is a :class:`Network`: ``features`` (named blocks in forward order) then
``classifier``; see :mod:`fedge.models.registry` for the layout contract and
:mod:`fedge.models.initialization` for seeded initialisation.
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
