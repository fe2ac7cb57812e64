"""Engine vs Flower: per-round overhead per client, trivial clients.

The same trivial federation as ``fedge bench engine`` (a seed-sized broadcast, a one-float
reply) run by the built-in engine and by :class:`fedge.runtime.flower.FlowerSimulation` on
Flower's Grid API with in-process SuperNodes (:class:`fedge.runtime.flower.LocalGrid`: every
message and reply encoded to Flower's protobuf wire format and decoded again, each node's
ClientApp with its own Context). Overhead per client is (round wall time - summed client step
time) / clients; median over the timed rounds, after one warm-up round. Memory: resident-set
growth from before the population was built to after the timed rounds.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/flower_overhead.py --docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

from fedge.bench.docs import update_section  # noqa: E402
from fedge.bench.engine import _SeedBroadcast, _Trivial, _warm_up  # noqa: E402
from fedge.core.context import ClientData  # noqa: E402
from fedge.core.meter import _status_kb  # noqa: E402
from fedge.runtime.engine import EngineConfig, Simulation  # noqa: E402
from fedge.runtime.flower import FlowerSimulation, LocalGrid, client_app  # noqa: E402


def _measure(kind: str, n: int, rounds: int) -> dict:
    gc.collect()
    rss0 = _status_kb("VmRSS") or 0
    x = torch.randn(n * 32, 1, 8, 8)
    y = torch.zeros(n * 32, dtype=torch.int64)
    clients = [ClientData(x, y, torch.arange(i * 32, (i + 1) * 32)) for i in range(n)]
    kw = dict(strategy=_SeedBroadcast(), program=_Trivial(), clients=clients,
              test=(torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64)), num_classes=2,
              config=EngineConfig(seed=0, rounds=rounds + 1, per_round=n, eval_every=10**9))  # fmt: skip
    if kind == "engine":
        sim = Simulation(**kw)
    else:
        sim = FlowerSimulation(**kw)
        app = client_app(sim.program, clients.__getitem__, **sim._kwargs())
        sim.connect(LocalGrid(app, [{"partition-id": i, "num-partitions": n} for i in range(n)]))
    sim.run_round(1)  # warm-up
    over, lines = [], []
    for rnd in range(2, rounds + 2):
        t0 = time.perf_counter()
        line = sim.run_round(rnd)
        wall = time.perf_counter() - t0
        over.append(wall - line["client_wall_s"])
        lines.append(line)
    rss1 = _status_kb("VmRSS") or 0
    out = {
        "runtime": kind, "clients_per_round": n, "rounds_timed": rounds,
        "overhead_ms_per_client_median": 1e3 * sorted(over)[len(over) // 2] / n,
        "overhead_ms_per_client_best": 1e3 * min(over) / n,
        "bytes_down_per_client": lines[-1]["bytes_down"] // n, "bytes_up_per_client": lines[-1]["bytes_up"] // n,
        "flower_bytes_down_per_client": lines[-1].get("flower_bytes_down", 0) // n,
        "flower_bytes_up_per_client": lines[-1].get("flower_bytes_up", 0) // n,
        "rss_growth_bytes": max(0, rss1 - rss0),
    }  # fmt: skip
    del sim, clients, x, y
    return out


def markdown(results: list[dict], command: str) -> str:
    rows = ["| clients/round | runtime | overhead ms/client (median, best) | bytes down/up per client (fedge) "
            "| Flower message bytes down/up per client | RSS growth |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        fl = f"{r['flower_bytes_down_per_client']} / {r['flower_bytes_up_per_client']}" if r["runtime"] != "engine" else "—"
        rows.append(f"| {r['clients_per_round']} | {r['runtime']} | {r['overhead_ms_per_client_median']:.3f}, "
                    f"{r['overhead_ms_per_client_best']:.3f} | {r['bytes_down_per_client']} / {r['bytes_up_per_client']} "
                    f"| {fl} | {r['rss_growth_bytes'] / 1e6:.1f} MB |")  # fmt: skip
    return "\n".join([
        "Per-round overhead per client with trivial clients (as in *Engine overhead*): the built-in engine",
        "against the same rounds through Flower's Grid API (`--runtime flower-sim`: `FlowerSimulation` on",
        "`LocalGrid`, in-process SuperNodes; every message encoded to Flower's protobuf wire format and",
        "decoded on both ends, a handshake once per run, each node's ClientApp with its own `Context`).",
        "fedge's byte counts are identical on both runtimes; Flower's message bytes add its metadata",
        "(ids, run, node, type, TTL) and record framing to fedge's bytes; a reply also carries the client's",
        "meter readings (FLOPs, time, memory; JSON, about 200 bytes). Not measured here: Flower's Ray",
        "simulation backend (Ray is not installed); a loopback deployment: below.",
        "",
        f"Command: `{command}`",
        "",
        *rows,
    ])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="10,100,1000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    _warm_up()
    results = []
    for n in (int(c) for c in a.clients.split(",")):
        for kind in ("engine", "flower-sim"):
            results.append(_measure(kind, n, a.rounds))
            print(json.dumps(results[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "flower-overhead", "results": results}, f, indent=1)
    if a.docs:
        update_section(a.docs, "flower", "Engine vs Flower overhead",
                       markdown(results, "OMP_NUM_THREADS=1 python benchmarks/flower_overhead.py --docs docs/benchmarks.md"))  # fmt: skip


if __name__ == "__main__":
    main()
