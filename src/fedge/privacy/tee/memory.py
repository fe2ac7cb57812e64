"""The enclave's memory budget (PPFL, seed 001, Sec. 4.2: a TrustZone TEE of ~16 MiB).
Design notes: docs/decisions.md#trusted-execution-environment.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fedge.core.errors import FedgeError

__all__ = ["EnclaveMemory", "EnclaveMemoryError", "MiB", "tensor_bytes"]

MiB = 1 << 20


class EnclaveMemoryError(FedgeError, MemoryError):
    """An allocation inside the enclave would pass its memory budget."""


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class EnclaveMemory:
    """Named allocations against a fixed budget (bytes)."""

    def __init__(self, budget: int, *, who: str = "enclave") -> None:
        if budget <= 0:
            raise EnclaveMemoryError(
                f"{who}: a memory budget of {budget} bytes holds nothing; give a positive size"
            )
        self.budget, self.who = int(budget), who
        self.held: dict[str, int] = {}
        self.peak = 0

    @property
    def used(self) -> int:
        return sum(self.held.values())

    def alloc(self, name: str, nbytes: int) -> None:
        """Charge ``nbytes`` under ``name`` (replacing what ``name`` held)."""
        new = self.used - self.held.get(name, 0) + int(nbytes)
        if new > self.budget:
            raise EnclaveMemoryError(
                f"{self.who}: allocating {nbytes / MiB:.2f} MiB for {name!r} needs {new / MiB:.2f} MiB in all, "
                f"over the enclave's budget of {self.budget / MiB:.2f} MiB (held: "
                + ", ".join(f"{k}={v / MiB:.2f}" for k, v in self.held.items())
                + "); use a smaller batch or block, or a larger enclave"
            )
        self.held[name] = int(nbytes)
        self.peak = max(self.peak, new)

    def alloc_tensors(self, name: str, tensors: Iterable[torch.Tensor]) -> None:
        self.alloc(name, tensor_bytes(tensors))

    def free(self, name: str) -> None:
        self.held.pop(name, None)
