"""Federated methods: one module per method, each a config, a Strategy and a ClientProgram.

The registry maps ``method.name`` to a :class:`~fedge.methods.base.MethodSpec`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from fedge.core.errors import ConfigError
from fedge.core.registry import Registry
from fedge.methods import baffle, eppfl, fedavg, fedpt, ntk_baffle, ppfl
from fedge.methods.base import MethodBuild, MethodEnv, MethodSpec

__all__ = [
    "METHODS",
    "MethodBuild",
    "MethodEnv",
    "MethodSpec",
    "get_method",
    "method_names",
    "register",
]

_REGISTRY: Registry[MethodSpec] = Registry("method")
#: name -> spec, read-only view (add entries with :func:`register`).
METHODS: Mapping[str, MethodSpec] = _REGISTRY.view()


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry (a later issue's method calls this in its module).

    Its ``config`` (a pydantic model) validates the run's ``method.*`` keys; a name already
    taken, or anything but a :class:`MethodSpec` whose config is a pydantic model and whose build
    is callable, is a :class:`~fedge.core.errors.ConfigError`.
    """
    config = getattr(spec, "config", None)
    if (
        not isinstance(spec, MethodSpec)
        or not (isinstance(config, type) and issubclass(config, BaseModel))
        or not callable(spec.build)
    ):
        raise ConfigError(
            f"register_method takes a MethodSpec(name, description, config, build) with a pydantic "
            f"config class and a callable build; got {spec!r}"
        )
    name_field = config.model_fields.get("name")
    if name_field is not None and name_field.default != spec.name:
        raise ConfigError(
            f"register_method: MethodSpec {spec.name!r} has config {config.__name__} whose name is "
            f"{name_field.default!r}; give the config a name field defaulting to {spec.name!r}"
        )
    return _REGISTRY.register(spec.name, spec)


def get_method(name: str) -> MethodSpec:
    """The entry for ``name``; UnknownNameError lists the registered methods."""
    return _REGISTRY.get(name)


def method_names() -> list[str]:
    """Registered method names, sorted."""
    return _REGISTRY.names()


register(
    MethodSpec(
        "fedavg",
        "FedAvg: E local epochs of backprop, weighted delta averaging, server optimizer",
        fedavg.FedAvgConfig,
        fedavg.build,
    )
)
register(
    MethodSpec(
        "fedsgd",
        "FedSGD: one backprop gradient per client per round, server optimizer",
        fedavg.FedSGDConfig,
        fedavg.build,
    )
)
register(
    MethodSpec(
        "baffle",
        "BAFFLE: forward-only zeroth-order estimates, K loss differences or model deltas uploaded",
        baffle.BaffleConfig,
        baffle.build,
    )
)
register(
    MethodSpec(
        "ntk-baffle",
        "NTK foresight pruning (data-free or on client data), then BAFFLE on the sparse model",
        ntk_baffle.NtkBaffleConfig,
        ntk_baffle.build,
    )
)
register(
    MethodSpec(
        "fedpt",
        "FedPT: FedAvg on a partially trainable network; frozen tensors rebuilt from a seed, only the trainable part travels",
        fedpt.FedPTConfig,
        fedpt.build,
    )
)
register(
    MethodSpec(
        "eppfl",
        "EPPFL: device/edge split learning, Laplace DP on cut activations, selection, third-party masks",
        eppfl.EppflConfig,
        eppfl.build,
    )
)
register(
    MethodSpec(
        "ppfl",
        "PPFL: greedy layer-wise FL, the layer under training inside attested, memory-budgeted, sealed enclaves",
        ppfl.PpflConfig,
        ppfl.build,
    )
)
