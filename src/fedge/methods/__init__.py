"""Federated methods: one module per method, each a config, a Strategy and a ClientProgram.

The registry maps ``method.name`` to a :class:`~fedge.methods.base.MethodSpec`.
"""

from __future__ import annotations

from fedge.core.errors import UnknownNameError
from fedge.methods import baffle, eppfl, fedavg, ntk_baffle
from fedge.methods.base import MethodBuild, MethodEnv, MethodSpec

__all__ = ["METHODS", "MethodBuild", "MethodEnv", "MethodSpec", "get_method", "register"]

METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry (a later issue's method calls this in its module)."""
    METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownNameError("method", name, list(METHODS)) from None


register(MethodSpec("fedavg", "FedAvg: E local epochs of backprop, weighted delta averaging, server optimizer", fedavg.FedAvgConfig, fedavg.build))
register(MethodSpec("fedsgd", "FedSGD: one backprop gradient per client per round, server optimizer", fedavg.FedSGDConfig, fedavg.build))
register(MethodSpec("baffle", "BAFFLE: forward-only zeroth-order estimates, K loss differences or model deltas uploaded", baffle.BaffleConfig, baffle.build))
register(MethodSpec("ntk-baffle", "NTK foresight pruning (data-free or on client data), then BAFFLE on the sparse model", ntk_baffle.NtkBaffleConfig, ntk_baffle.build))
register(MethodSpec("eppfl", "EPPFL: device/edge split learning, Laplace DP on cut activations, selection, third-party masks", eppfl.EppflConfig, eppfl.build))
