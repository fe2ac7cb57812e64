"""Federated methods: one module per method, each a config, a Strategy and a ClientProgram.

Every module (or subpackage) of this package is imported here, and a method module registers
itself (:func:`~fedge.methods.registry.declare_method`), so adding a method is adding a module.
The registry maps ``method.name`` to a :class:`~fedge.methods.spec.MethodSpec`.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedge.methods.base import MethodBuild, MethodEnv
from fedge.methods.registry import METHODS, declare_method, get_method, method_names, register
from fedge.methods.spec import Capabilities, MethodSpec

__all__ = [
    "METHODS",
    "Capabilities",
    "MethodBuild",
    "MethodEnv",
    "MethodSpec",
    "declare_method",
    "get_method",
    "method_names",
    "register",
]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
