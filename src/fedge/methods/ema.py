"""Evaluate an exponential moving average of the global model (BAFFLE Section 4.1,
"Using EMA to reduce oscillations", after BYOL).

:class:`EMAEvaluation` wraps any strategy that exposes its global model as ``.model``:
after every aggregated round it updates ``avg ← d·avg + (1−d)·W`` over the model's floating
state (parameters and float buffers), and ``eval_model()`` returns a model holding ``avg``.
Training is unaffected: clients always receive ``W``, not the average.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from fedge.core import transforms as T
from fedge.core.messages import Message
from fedge.core.protocols import NextPhase
from fedge.methods.base import load_arrays

__all__ = ["EMAEvaluation"]


class EMAEvaluation:
    """Strategy wrapper adding an EMA of the global model for evaluation.

    Args:
        inner: the wrapped strategy; must have a ``model`` attribute (the global model).
        decay: d, e.g. 0.995 (the paper's value).
        warmup: use ``min(d, (1+n)/(10+n))`` (the torch_ema schedule the reference code's
            EMA follows when its warm-up is on) instead of a constant d.
    """

    def __init__(self, inner: Any, *, decay: float, warmup: bool = False) -> None:
        self.inner, self.decay, self.warmup = inner, decay, warmup
        self.model = inner.model
        self.server = getattr(inner, "server", None)
        self._floating = [k for k, v in self.model.state_dict().items() if v.is_floating_point()]
        self.ema = T.ema_init(self._state())
        self._eval = copy.deepcopy(self.model)

    def _state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        return {k: state[k] for k in self._floating}

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        return self.inner.configure_round(rnd, client_ids)

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float] | NextPhase:
        out = self.inner.aggregate_round(rnd, replies)
        if not isinstance(out, NextPhase):
            self.ema = T.ema_update(self.ema, self._state(), decay=self.decay, warmup=self.warmup)
            masks = getattr(self.server, "masks", None)
            for name, mask in (masks or {}).items():  # a pruned model's average is pruned too
                self.ema["avg"][name].mul_(mask.to(self.ema["avg"][name].dtype))
        return out

    def eval_model(self) -> torch.nn.Module:
        full = {**self.model.state_dict(), **self.ema["avg"]}
        load_arrays(self._eval, full, who="EMA")
        return self._eval

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.ema = state["ema"]
