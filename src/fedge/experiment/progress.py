"""What a run reports while it goes: :class:`Progress` (its start, the clients that have
replied inside a round, the steps of a long phase inside a round, each finished round), or a plain function called after every round;
:func:`as_progress` turns what a caller passes into a Progress, refusing anything else up front.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fedge.core.errors import ConfigError

__all__ = ["Progress", "ProgressLike", "as_progress"]


class Progress:
    """What a run reports while it goes; override the parts you show (all default to nothing).

    A plain function ``f(metrics_line, total_rounds)`` is accepted wherever a Progress is and
    is called after every round."""

    def start(self, total_rounds: int, done: int) -> None:
        """Before the first round runs (``done`` rounds already in the directory on resume)."""

    def clients(self, rnd: int, exchange: int, done: int, total: int) -> None:
        """Inside a round: ``done`` of the ``total`` clients of this exchange have replied."""

    def phase(self, rnd: int, name: str, done: int, total: int) -> None:
        """Inside round ``rnd``: ``done`` of the ``total`` steps of its phase ``name`` (e.g.
        NTK-Ori's pruning rounds) are finished, and checkpointed (a resume goes on from here)."""

    def round(self, line: dict[str, Any], total_rounds: int) -> None:
        """After round ``line["round"]`` completed and was written."""


class _FunctionProgress(Progress):
    def __init__(self, fn: Callable[[dict[str, Any], int], None]) -> None:
        self.fn = fn

    def round(self, line: dict[str, Any], total_rounds: int) -> None:
        self.fn(line, total_rounds)


ProgressLike = Progress | Callable[[dict[str, Any], int], None] | None


def as_progress(p: ProgressLike) -> Progress:
    """``p`` as a Progress; anything neither a Progress, a function nor None is refused up front."""
    if p is None:
        return Progress()
    if isinstance(p, Progress):
        return p
    if not callable(p):
        raise ConfigError(
            f"progress={p!r} ({type(p).__name__}) is neither a fedge Progress nor a function "
            "f(metrics_line, total_rounds); pass one of those, or None to show nothing"
        )
    try:
        inspect.signature(p).bind(None, None)
    except TypeError:
        raise ConfigError(
            f"progress={p!r} cannot be called as f(metrics_line, total_rounds); give it those two parameters"
        ) from None
    except ValueError:  # no signature to read (a builtin): it will tell when called
        pass
    return _FunctionProgress(p)
