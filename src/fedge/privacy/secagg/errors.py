"""Errors raised by secure aggregation.

They subclass :class:`fedge.core.errors.FedgeError` so a caller can catch every fedge error at
once, and a builtin (ValueError / RuntimeError) so a caller who does not know fedge still can.
"""

from __future__ import annotations

from fedge.core.errors import DivergenceError, FedgeError, ShortRoundError

__all__ = ["FixedPointRangeError", "SecAggError", "ShareDecryptionError", "TooFewClientsError"]


class SecAggError(FedgeError, RuntimeError):
    """The secure-aggregation round aborts: too few parties, a protocol step out of order, a
    message that does not fit the protocol. Never a silently wrong sum."""


class TooFewClientsError(SecAggError, ShortRoundError):
    """Fewer clients than the threshold t answered a step (or hold shares of a dropped client's
    secret): the round cannot be unmasked. A :class:`~fedge.core.errors.ShortRoundError`, so
    an engine that tolerates failures skips the round."""


class ShareDecryptionError(SecAggError):
    """An encrypted Shamir share failed AES-GCM authentication (tampered, misrouted or replayed
    from another round)."""


class FixedPointRangeError(DivergenceError, ValueError):
    """A value is outside what the fixed-point encoding can sum without wrapping around (it is
    non-finite, or too large): in a run, a :class:`~fedge.core.errors.DivergenceError`."""
