"""Parameters of one secure-aggregation round, shared by the server and every client."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import IntEnum

from fedge.core.errors import ConfigError
from fedge.privacy.secagg.fixedpoint import FixedPoint
from fedge.privacy.secagg.graph import MaskGraph

__all__ = ["SecAggConfig", "Step", "check_round"]


class Step(IntEnum):
    """The round's protocol steps (Bonawitz et al. 2017, Fig. 4, rounds 0-3), then done.

    Client and server walk them once each, in this order; the server closes a step when it
    moves on, a client when it has answered it.
    """

    ADVERTISE = 0
    SHARE_KEYS = 1
    MASKED_INPUT = 2
    UNMASK = 3
    DONE = 4


def check_round(round: int) -> None:
    """Rounds travel as u32 in every message header."""
    if not isinstance(round, int) or not 0 <= round < 2**32:
        raise ConfigError(f"round must be an int in [0, 2^32), got {round!r}")


@dataclass(frozen=True)
class SecAggConfig:
    """Public parameters agreed before the round.

    Args:
        threshold: t. Each client u shares its secrets among its *share group*, u itself and
            its k graph neighbours (k + 1 holders; k + 1 = n for the complete graph, as in
            Bonawitz et al.'s t-out-of-n), and t of them must answer in the unmasking step to
            recover a secret. 1 <= t <= k + 1 (k = the graph's smallest degree). A t with
            2t <= k + 1 is allowed but warned about: a server that lies about who dropped out
            could then collect t shares of both secrets of one client and learn its input.
        length: K, the number of values each client sums (BAFFLE: the K loss differences).
        fixed_point: the ring Z_{2^b} and the fractional bits (fixedpoint.py).
    """

    threshold: int
    length: int
    fixed_point: FixedPoint = FixedPoint()

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, int) or self.threshold < 1:
            raise ConfigError(f"threshold must be an int >= 1, got {self.threshold!r}")
        if not isinstance(self.length, int) or self.length < 1:
            raise ConfigError(f"length (K) must be an int >= 1, got {self.length!r}")

    def check_graph(self, graph: MaskGraph) -> None:
        """Raise if t exceeds the smallest share group (k + 1); warn if 2t <= k + 1."""
        g = graph.min_degree + 1
        if self.threshold > g:
            raise ConfigError(
                f"threshold {self.threshold} exceeds the smallest share group ({g} clients: one "
                f"client and its neighbours); set threshold <= {g} (recommended {g // 2 + 1}) "
                f"or use more neighbors"
            )
        if 2 * self.threshold <= g:
            warnings.warn(
                f"threshold {self.threshold} is at most half of the share group size {g}: "
                f"secure only against a server that follows the protocol; use threshold >= "
                f"{g // 2 + 1} against one that lies about dropouts",
                UserWarning,
                stacklevel=3,
            )
