"""Named device profiles for ``clients.profiles`` (``device: phone-mid``): a phone- or
IoT-class device's effective training speed and link bandwidths, each figure with where it
comes from. A profile that names a device takes these figures and may override any of them.

Units, as everywhere in the time model (:mod:`fedge.runtime.fleet`): ``gflops`` is the
*effective* training throughput in GFLOP/s (10^9 of the FLOPs fedge counts per client step,
torch's FLOP counter, divided by the step's seconds on that device: sustained, not peak);
``uplink_kbps`` and ``downlink_kbps`` are kilobits per second with k = 1000 (1 kbps =
1000 bit/s; 0.25 MB/s = 2000 kbps).

The approach is FedScale's (Lai et al., ICML 2022): a client's round time is its compute time
(its work over its device's speed) plus its communication time (its bytes over its link's
bandwidth). FedScale draws per-device figures from AI Benchmark (compute) and MobiPerf
(bandwidth) traces; fedge ships a few fixed classes instead, so runs stay small and
deterministic. The link figures of ``phone-mid`` are the 0.75 MB/s down and 0.25 MB/s up that
FedPT's wall-clock estimate assumes (Sidahmed et al. 2021, as issue 51 cites it; not checked
against the paper here). Every other figure is an assumption, stated as such, of the right
order for its class: pass your own measurements as overrides.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEVICES", "NamedDevice", "TIME_FIELDS", "device_fields"]

#: the profile fields the time model reads; a profile gives all of them or none
TIME_FIELDS = ("gflops", "uplink_kbps", "downlink_kbps")


@dataclass(frozen=True)
class NamedDevice:
    """One named device class: its figures and where each comes from."""

    gflops: float
    downlink_kbps: float
    uplink_kbps: float
    source: str


DEVICES: dict[str, NamedDevice] = {
    "phone-high": NamedDevice(
        gflops=10.0,
        downlink_kbps=24000.0,
        uplink_kbps=8000.0,
        source="assumption: a recent flagship phone's CPU training fp32 (10 GFLOP/s sustained) "
        "on good LTE/5G (4x phone-mid's links)",
    ),
    "phone-mid": NamedDevice(
        gflops=3.0,
        downlink_kbps=6000.0,
        uplink_kbps=2000.0,
        source="links: FedPT's 0.75 MB/s down, 0.25 MB/s up (as issue 51 cites it); compute: "
        "assumption, a mid-range phone CPU sustaining 3 GFLOP/s fp32 in training",
    ),
    "phone-low": NamedDevice(
        gflops=1.0,
        downlink_kbps=1500.0,
        uplink_kbps=500.0,
        source="assumption: an entry-level phone (1 GFLOP/s) on a weak link (a quarter of "
        "phone-mid's)",
    ),
    "iot": NamedDevice(
        gflops=0.2,
        downlink_kbps=250.0,
        uplink_kbps=100.0,
        source="assumption: a microcontroller-class or single-board device (0.2 GFLOP/s) on a "
        "low-power cellular link (LTE-M class, 250/100 kbps)",
    ),
}


def device_fields(name: str) -> dict[str, float]:
    """The figures of the named device ``name`` as profile fields; a ValueError naming the
    known devices if there is none by that name."""
    dev = DEVICES.get(name)
    if dev is None:
        raise ValueError(f"unknown device {name!r}; the named devices are {sorted(DEVICES)}")
    return {
        "gflops": dev.gflops,
        "downlink_kbps": dev.downlink_kbps,
        "uplink_kbps": dev.uplink_kbps,
    }
