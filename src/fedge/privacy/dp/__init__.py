"""Differential privacy for federated sums: DP-FedAvg (Gaussian) and DP-FTRL (tree aggregation),
accounted with ``dp-accounting``. Pure: tensors, configs and explicit generators in."""

from fedge.privacy.dp.accounting import Accounted, dp_event, epsilon, max_rounds
from fedge.privacy.dp.aggregate import DPAggregator, clip_contribution
from fedge.privacy.dp.config import PrivacyConfig
from fedge.privacy.dp.mechanisms import (
    SECURE,
    TreeAggregator,
    clip_l2,
    ftrl_weights,
    gaussian_like,
    global_norm,
)
from fedge.privacy.dp.schedule import poisson_clients, shuffled_clients

__all__ = [
    "SECURE",
    "Accounted",
    "DPAggregator",
    "PrivacyConfig",
    "TreeAggregator",
    "clip_contribution",
    "clip_l2",
    "dp_event",
    "epsilon",
    "ftrl_weights",
    "gaussian_like",
    "global_norm",
    "max_rounds",
    "poisson_clients",
    "shuffled_clients",
]
