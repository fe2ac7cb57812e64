"""PPFL's evaluation model (seed 001): the server REE never holds the stage's plaintext layer, so it
evaluates its frozen, released layers followed by an ECALL into the server enclave, which unseals
the aggregated stage model, runs it and returns only logits. Details: ``docs/methods/ppfl.md``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedge.core.errors import MessageError
from fedge.methods.ppfl.enclaves import EnclaveSpec, open_eval_blob

__all__ = ["EnclaveEval"]


class EnclaveEval(nn.Module):
    """Evaluation model: REE frozen layers, then an ECALL into the server enclave holding
    only the sealed stage model (``docs/methods/ppfl.md``, Evaluation)."""

    def __init__(
        self,
        frozen: nn.Sequential,
        blob: bytes | None,
        spec: EnclaveSpec,
        stage: int,
        released: dict[str, torch.Tensor],
    ) -> None:
        super().__init__()
        self.frozen = frozen
        self._blob, self._spec, self._stage, self._released = blob, spec, stage, released

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """What the REE holds: the released layers, under the model's names (a run's
        ``model.safetensors``; usable as ``method.init_from``)."""
        return dict(self._released)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.frozen(x)
        if self._blob is None:
            raise MessageError("ppfl: no stage model aggregated yet to evaluate")
        return _ecall_eval(self._spec, self._stage, self._blob, f)


def _ecall_eval(spec: EnclaveSpec, stage: int, blob: bytes, f: torch.Tensor) -> torch.Tensor:
    net = spec.net(stage, open_eval_blob(blob)).eval()
    return net(f).detach()
