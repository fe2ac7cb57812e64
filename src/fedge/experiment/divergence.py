"""Divergence: a run whose values went non-finite, or whose loss rose above 100·ln(classes).
:class:`DivergenceWatch` checks each round's losses as it is written and, by the config's
``on_divergence``, stops the run with a :class:`~fedge.core.errors.DivergenceError` or warns
(:class:`DivergenceWarning`); a divergence the engine or a method detects while the rounds run
(a :class:`~fedge.core.errors.DivergenceError` by type: a non-finite reply, a sum past secure
aggregation's fixed-point range) stops it with the same words. Each names the round, the cause
and the config keys that exist for this method to lower, with the method's own advice from its
registered spec (:attr:`fedge.methods.spec.MethodSpec.advice`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from fedge.core import rundir_schema as schema
from fedge.core.errors import DivergenceError
from fedge.experiment.build import BuiltRun, resolved_config
from fedge.experiment.rundir import RunDir
from fedge.methods import get_method

__all__ = ["DivergenceWarning", "DivergenceWatch", "advice", "loss_limit", "over_limit"]

DIVERGED = "diverged"  # the metrics-line key marking a round whose loss crossed the limit


class DivergenceWarning(UserWarning):
    """A round diverged and ``on_divergence: continue`` let the run go on."""


def advice(built: BuiltRun) -> str:
    """The keys that exist for this method and would tame a diverging run, with their values."""
    m = resolved_config(built)["method"]
    keys = []
    if isinstance(m.get("client_optimizer"), dict) and m.get("mode") != "batch":
        keys.append(f"method.client_optimizer.lr (now {m['client_optimizer'].get('lr')})")
    if isinstance(m.get("optimizer"), dict):  # one optimizer both sides replay (DeComFL)
        keys.append(f"method.optimizer.lr (now {m['optimizer'].get('lr')})")
    if isinstance(m.get("lr"), int | float) and not isinstance(m.get("lr"), bool):
        keys.append(f"method.lr (now {m['lr']})")
    if isinstance(m.get("server_optimizer"), dict):
        keys.append(f"method.server_optimizer.lr (now {m['server_optimizer'].get('lr')})")
    text = "lower " + " or ".join(keys) if keys else "lower the learning rate"
    for more in get_method(built.config.method.name).advice(built.method_config):
        text += f", or {more}"
    return text


def loss_limit(built: BuiltRun) -> float:
    """The loss above which a round has diverged: 100·ln(classes) (100 times a uniform guess's)."""
    return 100.0 * math.log(max(2, built.dataset.num_classes))


def over_limit(line: dict[str, Any], limit: float) -> tuple[str, float] | None:
    """The first of the line's test and train losses that is non-finite or above ``limit``, as
    (key, value); None when neither is."""
    for key in (schema.TEST_LOSS, "train_loss"):
        v = line.get(key)
        if (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and (not math.isfinite(v) or v > limit)
        ):
            return key, float(v)
    return None


def _message(
    built: BuiltRun, rnd: int, what: str, rundir: RunDir, kept: int, *, hard: bool = False
) -> str:
    go_on = "" if hard else " (or set on_divergence: continue to go on regardless)"
    return (
        f"training diverged in round {rnd}: {what}; likely cause: a step size too large for this model: "
        f"{advice(built)}. The run directory {str(rundir.path)!r} keeps {'no round' if not kept else 'round 1' if kept == 1 else f'rounds 1-{kept}'} "
        "and is not complete: start a new run, or edit its config.yaml and continue with "
        f"fedge run --resume {rundir.path} --allow-config-change{go_on}"
    )


class DivergenceWatch:
    """Watches the rounds of ``built`` written into ``rundir`` for divergence."""

    def __init__(self, built: BuiltRun, rundir: RunDir) -> None:
        self.built, self.rundir = built, rundir
        self.limit = loss_limit(built)
        #: the error :meth:`after_write` stopped the run with (already worded; see :meth:`stop`)
        self.raised: DivergenceError | None = None

    def mark(self, line: dict[str, Any]) -> tuple[str, float] | None:
        """Before round ``line`` is written: the loss over the limit (:func:`over_limit`), and
        the line marked ``"diverged": true`` if there is one."""
        bad = over_limit(line, self.limit)
        if bad is not None:
            line[DIVERGED] = True
        return bad

    def after_write(self, line: dict[str, Any], bad: tuple[str, float]) -> None:
        """Round ``line`` was written with the loss ``bad`` over the limit: stop the run
        (``on_divergence: stop``, naming the keys to lower) or warn and go on (``continue``)."""
        key, value = bad
        rnd = line[schema.ROUND]
        n = self.built.dataset.num_classes
        what = f"{key}={value:.4g} (limit 100·ln({n}) = {self.limit:.4g})"
        if self.built.config.on_divergence == "stop":
            self.raised = DivergenceError(
                _message(self.built, rnd, what, self.rundir, rnd), round=rnd, cause=what
            )
            raise self.raised
        warnings.warn(
            f"training diverged in round {rnd}: {what}; {advice(self.built)}",
            DivergenceWarning,
            stacklevel=3,  # where the engine hands the round over, as the rounds' other warnings
        )

    def stop(self, exc: DivergenceError, done: int) -> DivergenceError:
        """The error that stops the run after the rounds raised ``exc`` with ``done`` rounds
        written: ``exc`` itself if :meth:`after_write` raised it, else the divergence the
        engine or a method detected, worded with the round, its cause and the keys to lower
        (there is no going on from it: no ``on_divergence: continue`` is offered)."""
        if exc is self.raised:
            return exc
        rnd = exc.round if exc.round is not None else done + 1
        return DivergenceError(
            _message(self.built, rnd, exc.cause, self.rundir, done, hard=True),
            round=rnd,
            cause=exc.cause,
        )
