"""The method registry: ``method.name`` to a :class:`~fedge.methods.spec.MethodSpec`.

A method registers itself in the module that defines it, with :func:`declare_method` on its
build function (as Opacus registers a grad sampler beside its code); :mod:`fedge.methods`
imports every module of the package, so a new method is one new module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from fedge.core.errors import ConfigError
from fedge.core.registry import Registry
from fedge.methods.base import (
    MethodBuild,
    MethodConfigBase,
)
from fedge.methods.compose import section_model
from fedge.methods.spec import Capabilities, MethodSpec, SeedScalars, Upload

__all__ = ["METHODS", "declare_method", "get_method", "method_names", "register"]

_REGISTRY: Registry[MethodSpec] = Registry("method")
#: name -> spec, read-only view (add entries with :func:`register` or :func:`declare_method`).
METHODS: Mapping[str, MethodSpec] = _REGISTRY.view()

Build = TypeVar("Build", bound=Callable[..., MethodBuild])


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry.

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
    if spec.name in _REGISTRY:
        return _REGISTRY.register(spec.name, spec)  # refused: the name is taken
    return _REGISTRY.register(spec.name, dataclasses.replace(spec, section=section_model(spec)))


def declare_method(
    name: str,
    description: str,
    *,
    config: type[MethodConfigBase],
    capabilities: Capabilities = Capabilities(),
    defaults: Mapping[str, Any] | None = None,
    summary_keys: tuple[str, ...] = (),
    advice: Callable[[Any], list[str]] | None = None,
    upload: Callable[[Any], Upload | None] | None = None,
    seed_scalars: Callable[[Any, Mapping[str, Any], Mapping[str, Any], str], SeedScalars]
    | None = None,
) -> Callable[[Build], Build]:
    """Register the decorated build function as method ``name`` (the arguments are
    :class:`~fedge.methods.spec.MethodSpec`'s); the function is returned unchanged.

    Example::

        @declare_method("fedprox", "FedAvg with a proximal term", config=FedProxConfig,
                        capabilities=Capabilities(sums_replies=True, global_model=True))
        def build(cfg: FedProxConfig, env: MethodEnv) -> MethodBuild: ...
    """

    def decorate(build: Build) -> Build:
        extra: dict[str, Any] = {}
        if advice is not None:
            extra["advice"] = advice
        if upload is not None:
            extra["upload"] = upload
        if seed_scalars is not None:
            extra["seed_scalars"] = seed_scalars
        register(
            MethodSpec(
                name,
                description,
                config,
                build,
                capabilities,
                dict(defaults or {}),
                summary_keys,
                **extra,
            )
        )
        return build

    return decorate


def get_method(name: str) -> MethodSpec:
    """The entry for ``name``; UnknownNameError lists the registered methods."""
    return _REGISTRY.get(name)


def method_names() -> list[str]:
    """Registered method names, sorted."""
    return _REGISTRY.names()
