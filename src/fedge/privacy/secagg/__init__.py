"""Secure aggregation: the server learns only the sum of the clients' vectors.

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning"
(CCS 2017; arXiv:1611.04482) with double masking and dropout recovery, optionally over the
sparse neighbourhood graph of Bell et al. (CCS 2020; arXiv:2004.04637). Used by BAFFLE
(seed 000, Alg. 1 l. 9/13/15, Eq. (7)) to sum the clients' K weighted loss differences.

Modules (pure, one concept each): ``fixedpoint`` (reals <-> Z_{2^b}), ``prg`` (AES-CTR mask
expansion), ``shamir`` (t-of-n sharing over F_{2^130-5}), ``keys`` (X25519, HKDF, AES-GCM),
``graph`` (who masks with whom), ``messages`` (wire format), ``client`` / ``server`` (one
party's protocol state each), ``simulate`` (:func:`secure_sum`, the whole round in process).
The masks and fixed-point codec are reusable by other aggregation schemes (e.g. EPPFL's
third-party additive masks).

Threat model: an honest-but-curious server, and up to t - 1 clients colluding with it. Not
built (Bonawitz et al. Sec. 6, the actively secure variant): signatures on the advertised keys
(a PKI) and the consistency-check round, so a server that substitutes its own public keys for
the clients' could decrypt every share; and each reconstruction uses the first t shares without
cross-checking the rest, so a client that sends a wrong share corrupts the sum undetected. The
sparse graph's order is derived from the public run seed (reproducible), so, unlike Bell et al.'s
assumption, an adversary knows each client's neighbours before it chooses whom to corrupt.
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
