"""fedge: federated learning on resource-constrained edge devices.

One engine, five seed systems (BAFFLE, NTK-pruned BAFFLE, FedPT, PPFL, EPPFL) and the
FedAvg/FedSGD baselines, each measured honestly: bytes from real serialized messages,
client FLOPs from torch's flop counter, memory from measurement.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
