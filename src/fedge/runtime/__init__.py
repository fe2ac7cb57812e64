"""The in-process simulation engine: it moves serialized messages between a Strategy, the
sampled clients' programs and their side parties, and meters every party. It imports
nothing from :mod:`fedge.methods`: methods are handed to it already built."""

from fedge.runtime.engine import EngineConfig, Simulation, sample_clients

__all__ = ["EngineConfig", "Simulation", "sample_clients"]
