"""fedge: federated learning on resource-constrained edge devices, measured honestly.

FedAvg, FedSGD, FedProx, BAFFLE, NTK-BAFFLE, FedPT, EPPFL and PPFL on one engine, with secure
aggregation, differential privacy, privacy attacks and a Flower runtime. The public API
(:mod:`fedge.api`, imported lazily): ``fedge.run``, ``fedge.load_run``, ``fedge.register_dataset``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedge.core.version import __version__

# public name -> module that defines it (imported on first use)
_LAZY = {
    "ConfigError": "fedge.core.errors",
    "DataNotFoundError": "fedge.core.errors",
    "Dataset": "fedge.data",
    "DatasetSpec": "fedge.data",
    "ExportResult": "fedge.experiment.export",
    "FedgeError": "fedge.core.errors",
    "MethodSpec": "fedge.methods",
    "ModelOptions": "fedge.models.registry",
    "Network": "fedge.models",
    "RawData": "fedge.data",
    "ResumeError": "fedge.core.errors",
    "RunConfig": "fedge.core.config",
    "RunLog": "fedge.report.runlog",
    "RunResult": "fedge.api",
    "TrainedModel": "fedge.experiment.export",
    "UnknownNameError": "fedge.core.errors",
    "build_model": "fedge.models",
    "dataset_names": "fedge.data",
    "export_model": "fedge.experiment.export",
    "load_config": "fedge.core.config",
    "load_dataset": "fedge.data",
    "load_run": "fedge.api",
    "method_names": "fedge.methods",
    "model_names": "fedge.models",
    "preset_names": "fedge.core.presets",
    "register_dataset": "fedge.api",
    "register_method": "fedge.methods",
    "register_model": "fedge.models",
    "register_partitioner": "fedge.data.partition",
    "resume": "fedge.api",
    "run": "fedge.api",
}
_RENAMED = {"register_method": "register"}  # fedge.register_method is fedge.methods.register

__all__ = [
    "ConfigError",
    "DataNotFoundError",
    "Dataset",
    "DatasetSpec",
    "ExportResult",
    "FedgeError",
    "MethodSpec",
    "ModelOptions",
    "Network",
    "RawData",
    "ResumeError",
    "RunConfig",
    "RunLog",
    "RunResult",
    "TrainedModel",
    "UnknownNameError",
    "__version__",
    "build_model",
    "dataset_names",
    "export_model",
    "load_config",
    "load_dataset",
    "load_run",
    "method_names",
    "model_names",
    "preset_names",
    "register_dataset",
    "register_method",
    "register_model",
    "register_partitioner",
    "resume",
    "run",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fedge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value  # later lookups skip this function
    return value


assert set(__all__) == {"__version__", *_LAZY}


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


if TYPE_CHECKING:  # static checkers and IDEs see the real objects
    from fedge.api import RunResult, load_run, register_dataset, resume, run
    from fedge.core.config import RunConfig, load_config
    from fedge.core.errors import (
        ConfigError,
        DataNotFoundError,
        FedgeError,
        ResumeError,
        UnknownNameError,
    )
    from fedge.core.presets import preset_names
    from fedge.data import Dataset, DatasetSpec, RawData, dataset_names, load_dataset
    from fedge.data.partition import register_partitioner
    from fedge.experiment.export import ExportResult, TrainedModel, export_model
    from fedge.methods import MethodSpec, method_names
    from fedge.methods import register as register_method
    from fedge.models import Network, build_model, model_names, register_model
    from fedge.models.registry import ModelOptions
    from fedge.report.runlog import RunLog
