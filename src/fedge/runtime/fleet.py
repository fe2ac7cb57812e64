"""Simulated time on a fleet of devices (``clients.profiles`` with ``gflops``, ``uplink_kbps``,
``downlink_kbps``): each client's time in an exchange from what the engine measured, and which
replies an exchange keeps under a deadline and over-selection. Guide:
docs/guide/scale.md#simulated-time-on-a-device-fleet; design notes:
docs/decisions.md#runtime-and-engine.

The model is FedScale's (Lai et al., ICML 2022), on fedge's measurements: a client step's
simulated time is its download (the message's serialized bytes x 8 over ``downlink_kbps`` x
1000 bit/s), then its compute (the step's FLOPs, as torch's counter measured them, over
``gflops`` x 10^9 FLOP/s), then its upload (the reply's bytes x 8 over ``uplink_kbps`` x 1000).
An exchange lasts until the last reply it keeps arrives; a round lasts the sum of its
exchanges (the server's own work, side parties and evaluation take no simulated time).
With ``clients.deadline_s`` a reply arriving later is a straggler's; with
``clients.over_select`` the first exchange keeps the ``clients.per_round`` replies that
arrive first. Either way the exchange then ended when the server stopped waiting: at the
last kept reply when over-selection filled the cohort, else at the deadline when a client
missed it (or failed) — the server cannot tell a straggler from a lost client before then.
Ties in finishing time go to the lower client id, so a run is deterministic given its seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClientTime", "Cut", "RoundClock", "client_time", "cut_exchange"]

MiB = 1 << 20  # memory_mb counts MiB, as enclave_mb does


@dataclass(frozen=True)
class ClientTime:
    """One client's simulated seconds in one exchange (or summed over a round's)."""

    down_s: float
    compute_s: float
    up_s: float

    @property
    def total_s(self) -> float:
        return self.down_s + self.compute_s + self.up_s

    def __add__(self, other: ClientTime) -> ClientTime:
        return ClientTime(
            self.down_s + other.down_s,
            self.compute_s + other.compute_s,
            self.up_s + other.up_s,
        )


def client_time(
    profile: Mapping[str, Any], *, flops: int, bytes_down: int, bytes_up: int
) -> ClientTime:
    """The simulated time of a client step of ``flops`` FLOPs that received ``bytes_down``
    bytes and sent ``bytes_up``, on a device with ``profile``'s ``gflops``, ``downlink_kbps``
    and ``uplink_kbps`` (1 kbps = 1000 bit/s)."""
    return ClientTime(
        down_s=bytes_down * 8 / (profile["downlink_kbps"] * 1000),
        compute_s=flops / (profile["gflops"] * 1e9),
        up_s=bytes_up * 8 / (profile["uplink_kbps"] * 1000),
    )


@dataclass(frozen=True)
class Cut:
    """An exchange under a deadline and over-selection: the clients whose replies it keeps,
    why each other one is a straggler, and how long the exchange lasted (simulated s)."""

    kept: list[int]
    stragglers: dict[int, str]
    duration_s: float


def cut_exchange(
    finish: Mapping[int, float],
    *,
    deadline_s: float | None = None,
    keep: int | None = None,
    lost: bool = False,
) -> Cut:
    """Which replies an exchange keeps when client ``c``'s reply arrives ``finish[c]``
    simulated seconds after the exchange began: those within ``deadline_s`` (None: all),
    then the first ``keep`` of them (None: all; ties to the lower id). ``lost``: some addressed
    client will never reply (it dropped out), which the server notices only at the deadline."""
    order = sorted(finish, key=lambda c: (finish[c], c))
    in_time = [c for c in order if deadline_s is None or finish[c] <= deadline_s]
    stragglers = {
        c: f"straggler: its reply arrives at {finish[c]:.4g} s, after clients.deadline_s={deadline_s:g}"
        for c in order
        if c not in in_time
    }
    kept = in_time if keep is None else in_time[:keep]
    for c in in_time[len(kept) :]:
        stragglers[c] = (
            f"straggler: its reply arrives at {finish[c]:.4g} s, after the first {keep} "
            "(clients.over_select)"
        )
    if keep is not None and len(in_time) > keep:
        duration = finish[kept[-1]] if kept else 0.0  # the cohort filled: stop waiting
    elif deadline_s is not None and (lost or len(in_time) < len(order)):
        duration = deadline_s  # waited for who never came
    else:
        duration = max((finish[c] for c in kept), default=0.0)
    return Cut(sorted(kept), stragglers, duration)


@dataclass
class RoundClock:
    """One round's simulated time, added to exchange by exchange."""

    duration_s: float = 0.0
    clients: dict[int, ClientTime] = field(default_factory=dict)
    stragglers: set[int] = field(default_factory=set)

    def add(self, times: Mapping[int, ClientTime], cut: Cut) -> None:
        self.duration_s += cut.duration_s
        for cid, t in times.items():
            self.clients[cid] = self.clients[cid] + t if cid in self.clients else t
        self.stragglers.update(cut.stragglers)

    def state_dict(self) -> dict[str, Any]:
        """What a savepoint inside the round keeps of it (:meth:`from_state` rebuilds it)."""
        return {
            "duration_s": self.duration_s,
            "clients": {str(c): [t.down_s, t.compute_s, t.up_s] for c, t in self.clients.items()},
            "stragglers": sorted(self.stragglers),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RoundClock:
        return cls(
            float(state["duration_s"]),
            {int(c): ClientTime(*map(float, t)) for c, t in state["clients"].items()},
            {int(c) for c in state["stragglers"]},
        )

    def per_client(self) -> dict[str, dict[str, Any]]:
        """Each client's round time as the metrics line holds it (``sim_clients``)."""
        out: dict[str, dict[str, Any]] = {}
        for cid in sorted(self.clients):
            t = self.clients[cid]
            row: dict[str, Any] = {"down_s": t.down_s, "compute_s": t.compute_s, "up_s": t.up_s}
            if cid in self.stragglers:
                row["straggler"] = True
            out[str(cid)] = row
        return out
