"""One home for fedge's exceptions.

Every error names the bad value, what was expected and how to fix it. They subclass
ValueError/TypeError/etc so callers that do not know fedge can still catch them.
"""

from __future__ import annotations

import difflib

__all__ = [
    "ConfigError",
    "DataNotFoundError",
    "DivergenceError",
    "FedgeError",
    "MessageError",
    "NonFiniteError",
    "PrivacyWarning",
    "ResumeError",
    "ShortRoundError",
    "UnknownNameError",
]


class FedgeError(Exception):
    """Base class of every error fedge raises on purpose."""


class ConfigError(FedgeError, ValueError):
    """A configuration key or value is invalid (unknown key, wrong type, out of range)."""


class UnknownNameError(ConfigError, KeyError):
    """A name was looked up in a registry that does not hold it."""

    def __init__(
        self, kind: str, name: str, choices: list[str] | tuple[str, ...], *, hint: str = ""
    ) -> None:
        self.kind, self.name, self.choices = kind, name, tuple(sorted(choices))
        close = self.closest(str(name), self.choices)
        super().__init__(
            f"unknown {kind} {name!r}{f' (did you mean {close!r}?)' if close else ''}; expected one of: "
            f"{', '.join(self.choices)}" + (f"; {hint}" if hint else "")
        )

    @staticmethod
    def closest(name: str, choices: tuple[str, ...]) -> str | None:
        """The choice ``name`` most likely meant: one equal up to case, ``-``/``_`` and spaces
        (``FedAvg``, ``Fashion_MNIST``), else the nearest spelling (``mnits``), else None."""

        def fold(s: str) -> str:
            return s.lower().replace("_", "-").replace(" ", "-")

        same = [c for c in choices if fold(c) == fold(name)]
        if same:
            return same[0]
        # cutoff 0.75, not difflib's 0.6: 'fedprox' (another method) must not read as 'fedpt'
        near = difflib.get_close_matches(fold(name), [fold(c) for c in choices], n=1, cutoff=0.75)
        return next(c for c in choices if fold(c) == near[0]) if near else None

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]


class DataNotFoundError(FedgeError, FileNotFoundError):
    """A dataset's files are not where fedge looked. The message lists the paths and the fix."""


class MessageError(FedgeError, ValueError):
    """A message is malformed, non-finite, or fails to decode."""


class DivergenceError(FedgeError, RuntimeError):
    """Training diverged: values went non-finite, or grew past what a run can go on with (a
    loss above its limit, a sum past secure aggregation's fixed-point range). ``round``: the
    round that diverged (None where the raiser does not know it); ``cause``: what diverged, in
    words, for a caller that writes its own message (the whole message unless given)."""

    def __init__(
        self,
        message: str,
        *,
        round: int | None = None,  # noqa: A002 - the config's word
        cause: str | None = None,
    ) -> None:
        super().__init__(message)
        self.round = round
        self.cause = message if cause is None else cause


class NonFiniteError(DivergenceError, MessageError):
    """A message or a client's contribution holds NaN or Inf: a :class:`DivergenceError`, and a
    :class:`MessageError` as every malformed message is."""


class ShortRoundError(MessageError):
    """A round cannot complete with the clients that replied: fewer than ``clients.min_replies``
    in an exchange, or fewer than a protocol's threshold (secure aggregation's t). With
    ``clients.min_replies`` set the engine skips such a round (the global model unchanged) and
    goes on; without it, it stops the run."""


class ResumeError(FedgeError, RuntimeError):
    """A run directory cannot be resumed (missing or corrupt checkpoint, config mismatch)."""


class PrivacyWarning(UserWarning):
    """A legal choice that exposes more than the method's paper assumes (the risk is named)."""
