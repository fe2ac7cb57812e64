"""The in-process simulation engine: it moves serialized messages between a Strategy, the
sampled clients' programs and their side parties, and meters every party; client steps run
behind a :class:`~fedge.runtime.executor.ClientExecutor`. It imports nothing from
:mod:`fedge.methods`: methods are handed to it already built."""

from fedge.runtime.engine import EngineConfig, Simulation, sample_clients
from fedge.runtime.executor import ClientExecutor
from fedge.runtime.spec import Runtime

__all__ = ["ClientExecutor", "EngineConfig", "Runtime", "Simulation", "sample_clients"]
