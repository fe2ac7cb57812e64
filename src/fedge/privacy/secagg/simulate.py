"""One secure-aggregation round simulated in process with the real message bytes:
:func:`secure_sum`, the oracle-friendly entry point.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from fedge.core.errors import ConfigError
from fedge.core.rng import Draws
from fedge.privacy.secagg.client import ClientState
from fedge.privacy.secagg.config import SecAggConfig
from fedge.privacy.secagg.fixedpoint import FixedPoint, RingArray
from fedge.privacy.secagg.graph import MaskGraph
from fedge.privacy.secagg.server import ServerState

__all__ = ["SecAggResult", "secure_sum"]


@dataclass(frozen=True)
class SecAggResult:
    """What a secure-aggregation round produced and cost.

    Attributes:
        sum_fixed: Σ_{u ∈ survivors} encode(x_u) mod 2^b, ``uint64``, the inputs' shape.
        sum_float: ``fixed_point.decode(sum_fixed)``, float64.
        survivors: U3, the clients whose inputs are in the sum.
        dropped: clients that shared keys but never sent a masked input (U2 ∖ U3; clients
            that dropped before sharing keys are in neither set).
        bytes_up_per_client: bytes each client sent (all its messages).
        bytes_down_per_client: bytes the server sent to each client.
        degree: neighbours per client (n - 1 for the complete graph).
        threshold: t.
        fixed_point: the codec used.
    """

    sum_fixed: RingArray
    sum_float: npt.NDArray[np.float64]
    survivors: frozenset[int]
    dropped: frozenset[int]
    bytes_up_per_client: dict[int, int]
    bytes_down_per_client: dict[int, int]
    degree: int
    threshold: int
    fixed_point: FixedPoint


def secure_sum(
    inputs: Mapping[int, npt.ArrayLike],
    *,
    threshold: int,
    round: int,
    seed: int,
    dropouts_after_advertise: Collection[int] = frozenset(),
    dropouts_after_keys: Collection[int] = frozenset(),
    dropouts_before_unmask: Collection[int] = frozenset(),
    neighbors: int | None = None,
    bits: Literal[32, 64] = 64,
    frac_bits: int = 24,
    draws: Draws = "torch",
) -> SecAggResult:
    """Σ of the surviving clients' vectors, computed by secure aggregation.

    BAFFLE (seed 000) Alg. 1 l. 9, 13, 15 and Eq. (7): the server must learn only
    Σ_c N_c/N · ΔL(W_t, δ_k; D_c) for each k. Pass ``inputs[c] = (N_c / N) * delta_losses_c``
    (clients pre-multiply by their weight before encoding). If clients may drop out, append the
    weight itself as one more coordinate, ``[w_c·ΔL_c, w_c]``: the last coordinate of the sum is
    then Σ_{survivors} w_c, and dividing by it re-normalises without revealing any N_c.

    Args:
        inputs: client id -> real array; all of the same shape (K values).
        threshold: t of the k + 1 share holders of each client (itself and its k neighbours;
            k + 1 = n for the complete graph); see config.py. ``recommended_threshold(k)``.
        round: the FL round (binds keys, ciphertexts and the graph).
        seed: the public run seed; used only for the sparse graph, never for keys.
        dropouts_after_advertise: clients that vanish after advertising keys and before
            sharing them (nobody masks with them; they are not in the sum).
        dropouts_after_keys: clients that vanish after sending their shares and before their
            masked input (their pair masks are removed using s_sk shares).
        dropouts_before_unmask: clients that send their masked input (it is in the sum) but
            not their unmasking response.
        neighbors: k for the sparse Harary graph (even), or None for the complete graph;
            ``graph.recommended_neighbors(n)`` gives a default for large n.
        bits, frac_bits: the fixed-point ring (fixedpoint.py; the range bound uses n clients).
        draws: the generator of the sparse graph's ring order (:meth:`MaskGraph.harary`).

    Raises:
        SecAggError: the round aborts (e.g. fewer than t shares of some secret survive).
        FixedPointRangeError: an input is too large to be summed without wraparound.
    """
    ids = sorted(inputs)
    drops = (dropouts_after_advertise, dropouts_after_keys, dropouts_before_unmask)
    unknown = set().union(*map(set, drops)) - set(ids)
    if unknown:
        raise ConfigError(f"dropouts name clients without inputs: {sorted(unknown)}")
    arrays = {u: np.asarray(inputs[u], dtype=np.float64) for u in ids}
    shape = arrays[ids[0]].shape
    if any(a.shape != shape for a in arrays.values()):
        raise ConfigError(f"all inputs must have one shape; client {ids[0]} has {shape}")
    fp = FixedPoint(bits=bits, frac_bits=frac_bits)
    config = SecAggConfig(threshold=threshold, length=int(np.prod(shape)), fixed_point=fp)
    graph = MaskGraph.build(ids, neighbors, seed=seed, round=round, draws=draws)
    server = ServerState(round=round, config=config, graph=graph)
    clients = {u: ClientState(u, round=round, config=config, graph=graph) for u in ids}
    up = dict.fromkeys(ids, 0)
    down = dict.fromkeys(ids, 0)

    def send(u: int, msg: bytes) -> bytes:
        up[u] += len(msg)
        return msg

    def recv(u: int, msg: bytes) -> bytes:
        down[u] += len(msg)
        return msg

    for u in ids:
        server.receive_advertise(send(u, clients[u].advertise_keys()), sender=u)
    for u, msg in server.broadcast_keys().items():
        keys = recv(u, msg)
        if u not in dropouts_after_advertise:
            server.receive_shares(send(u, clients[u].share_keys(keys)), sender=u)
    for u, msg in server.forward_shares().items():
        fwd = recv(u, msg)
        if u not in dropouts_after_keys:
            server.receive_masked_input(send(u, clients[u].masked_input(fwd, arrays[u])), sender=u)
    for u, msg in server.unmask_requests().items():
        req = recv(u, msg)
        if u not in dropouts_before_unmask:
            server.receive_unmask(send(u, clients[u].unmask(req)), sender=u)
    total = server.finalize().reshape(shape)
    return SecAggResult(
        sum_fixed=total,
        sum_float=fp.decode(total),
        survivors=server.survivors,
        dropped=server.dropped,
        bytes_up_per_client=up,
        bytes_down_per_client=down,
        degree=graph.min_degree,
        threshold=threshold,
        fixed_point=fp,
    )
