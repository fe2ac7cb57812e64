"""Evaluate an exponential moving average of the global model (BAFFLE Section 4.1,
"Using EMA to reduce oscillations", after BYOL).

:class:`EMAEvaluation` wraps any strategy with a global model (``strategy.global_model``):
after every aggregated round it updates ``avg ← d·avg + (1−d)·W`` over the model's floating
state (parameters and float buffers), and ``eval_model()`` returns a model holding ``avg``.
Training is unaffected: clients always receive ``W``, not the average, and the wrapper draws no
randomness. So with ``also_raw`` the raw ``W`` evaluated beside the average (the engine's
``raw_*`` metrics) is exactly what the same run with EMA off would report: one run gives both
the "with EMA" and the "w/o EMA" rows of BAFFLE's ablation.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from pydantic import Field, model_validator
from torch.utils._pytree import tree_map

from fedge.core import transforms as T
from fedge.core.errors import ConfigError
from fedge.core.protocols import Round, Strategy, StrategyWrapper
from fedge.methods.base import MethodConfigBase, load_arrays

__all__ = ["EMAEvaluation", "EMAOptions"]


class EMAOptions(MethodConfigBase):
    """The ``method.ema`` keys, spelled the same for every method with a global model (the
    composer attaches them; BAFFLE defaults ``ema`` to its paper's 0.995)."""

    ema: float | None = Field(
        None, ge=0, lt=1, description="EMA decay for evaluation; null or 0: off"
    )
    ema_warmup: bool = Field(
        True,
        description="decay min(ema, (1+n)/(10+n)), n the earlier updates (torch_ema, "
        "the reference code's, counts the current one too: one update ahead)",
    )
    ema_also_raw: bool = Field(
        False,
        description="also evaluate the raw global model W beside its EMA (metrics raw_test_accuracy, raw_val_accuracy, "
        "...): the EMA never feeds training, so these are exactly the figures of the same run with ema=null",
    )

    @model_validator(mode="after")
    def _raw_needs_ema(self) -> EMAOptions:
        if self.ema_also_raw and not self.ema:
            raise ValueError(
                f"ema_also_raw evaluates the raw model beside its EMA, but ema is {self.ema!r} (off): the evaluated "
                "model is already the raw one; set method.ema (e.g. 0.995) or drop method.ema_also_raw"
            )
        return self

    def evaluation(self, strategy: Strategy) -> Strategy:
        """``strategy`` with an EMA of its global model evaluated, when ``ema`` is on."""
        if not self.ema:
            return strategy
        return EMAEvaluation(
            strategy, decay=self.ema, warmup=self.ema_warmup, also_raw=self.ema_also_raw
        )


class EMAEvaluation(StrategyWrapper):
    """Strategy wrapper adding an EMA of the global model for evaluation.

    Args:
        inner: the wrapped strategy; must have a global model.
        decay: d, e.g. 0.995 (the paper's value).
        warmup: use ``min(d, (1+n)/(10+n))``, n the earlier updates, instead of a constant d
            (the reference code's torch_ema warm-up counts the current update too, one update
            ahead of this: see ``docs/methods/baffle.md``, "EMA schedule").
        also_raw: also offer the raw global model ``W`` for evaluation
            (:meth:`side_eval_models` ``{"raw": W}``).
    """

    def __init__(
        self, inner: Strategy, *, decay: float, warmup: bool = False, also_raw: bool = False
    ) -> None:
        super().__init__(inner)
        if inner.global_model is None:
            raise ConfigError(
                f"an EMA of the global model needs a strategy with one; {type(inner).__name__} has none"
            )
        self.decay, self.warmup, self.also_raw = decay, warmup, also_raw
        self._floating = [k for k, v in self.model.state_dict().items() if v.is_floating_point()]
        self.ema = T.ema_init(self._state())
        self._eval = copy.deepcopy(self.model)

    def _state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        return {k: state[k] for k in self._floating}

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        out = yield from self._restart_when_pruned(self.inner.round(rnd, client_ids))
        self.ema = T.ema_update(self.ema, self._state(), decay=self.decay, warmup=self.warmup)
        for name, mask in (
            self.global_model.masks or {}
        ).items():  # a pruned model's average is pruned too
            avg = self.ema["avg"][name]
            avg.mul_(mask.to(avg.device, avg.dtype))
        return out

    def _restart_when_pruned(self, inner: Round) -> Round:
        """``inner``'s exchanges, passed through. When the global model is pruned in the course of
        the round (NTK-Ori's pruning rounds are the first exchanges of round 1, and they rescale
        the kept weights), the average starts over from the pruned model, as it does for a model
        pruned before the run: an average of the dense model and the pruned one is neither."""
        masks, reply = self.global_model.masks, None
        try:
            while True:
                try:
                    step = inner.send(reply)
                except StopIteration as stop:
                    self._restart_if_pruned(masks)
                    return stop.value
                masks = self._restart_if_pruned(masks)
                reply = yield step
        finally:
            inner.close()  # a round the engine abandons (clients.min_replies) closes the inner one too

    def _restart_if_pruned(
        self, masks: dict[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor] | None:
        """Start the average from the current model if its masks are no longer ``masks``; the masks now."""
        if self.global_model.masks is not masks:
            self.ema = T.ema_init(self._state())
        return self.global_model.masks

    def eval_model(self) -> torch.nn.Module:
        full = {**self.model.state_dict(), **self.ema["avg"]}
        load_arrays(self._eval, full, who="EMA")
        return self._eval

    def side_eval_models(self) -> dict[str, torch.nn.Module]:
        inner = self.inner.side_eval_models()
        if "raw" in inner:
            raise ConfigError("two EMA wrappers both offer the raw model for evaluation; wrap once")
        return {"raw": self.model, **inner} if self.also_raw else inner

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        device = next(iter(self._state().values())).device
        # a checkpoint's tensors are read onto the CPU: the average lives with the model
        self.ema = (
            state["ema"]
            if device.type == "cpu"
            else tree_map(
                lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, state["ema"]
            )
        )
