"""Secure aggregation: the server learns only the sum of the clients' vectors (Bonawitz et al.,
CCS 2017, double masking and dropout recovery; optionally over the sparse graph of Bell et al.,
CCS 2020). Modules, threat model and what is not built: docs/privacy/secure-aggregation.md.
"""

from fedge.privacy.secagg.client import ClientState
from fedge.privacy.secagg.config import SecAggConfig
from fedge.privacy.secagg.errors import (
    FixedPointRangeError,
    SecAggError,
    ShareDecryptionError,
    TooFewClientsError,
)
from fedge.privacy.secagg.fixedpoint import FixedPoint, RingArray
from fedge.privacy.secagg.graph import MaskGraph, recommended_neighbors, recommended_threshold
from fedge.privacy.secagg.prg import prg
from fedge.privacy.secagg.server import ServerState
from fedge.privacy.secagg.simulate import SecAggResult, secure_sum

__all__ = [
    "ClientState",
    "FixedPoint",
    "FixedPointRangeError",
    "MaskGraph",
    "RingArray",
    "SecAggConfig",
    "SecAggError",
    "SecAggResult",
    "ServerState",
    "ShareDecryptionError",
    "TooFewClientsError",
    "prg",
    "recommended_neighbors",
    "recommended_threshold",
    "secure_sum",
]
