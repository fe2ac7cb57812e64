"""Gradient estimators: the backprop oracle and BAFFLE's zeroth-order (Stein) estimate.

The client runs :func:`loss_differences` (forwards only), the server :func:`estimate_gradient`
from the same seed (after :func:`combine_loss_differences` for several clients, BAFFLE Eq. 7);
both take one :class:`ZerothOrderSpec`. Design notes: docs/decisions.md#estimators.
"""

from fedge.estimators.backprop import backprop_gradient
from fedge.estimators.batched import register_channelwise
from fedge.estimators.perturbation import perturbation
from fedge.estimators.spec import ZerothOrderSpec
from fedge.estimators.zeroth_order import (
    Mode,
    PrecisionWarning,
    Scheme,
    ZerothOrderWarning,
    combine_loss_differences,
    estimate_gradient,
    forward_budget,
    loss_differences,
    num_differences,
    zeroth_order_gradient,
)

__all__ = [
    "Mode",
    "PrecisionWarning",
    "Scheme",
    "ZerothOrderSpec",
    "ZerothOrderWarning",
    "backprop_gradient",
    "combine_loss_differences",
    "estimate_gradient",
    "forward_budget",
    "loss_differences",
    "num_differences",
    "perturbation",
    "register_channelwise",
    "zeroth_order_gradient",
]
