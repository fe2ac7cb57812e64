"""Engine overhead: everything a round costs except the clients' own compute, measured with
trivial clients. Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from typing import Any

import torch

from fedge.bench.docs import command_section, markdown_table
from fedge.bench.measured import Section
from fedge.core.context import ClientContext, ClientData
from fedge.core.messages import Message
from fedge.core.meter import _status_kb
from fedge.core.protocols import Strategy
from fedge.runtime.engine import EngineConfig, Simulation

__all__ = ["ENGINE_SECTION", "engine_markdown", "run_engine_overhead"]


class _SeedBroadcast(Strategy):
    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 2)
        self.total = 0.0

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        return dict.fromkeys(client_ids, Message(config={"seed": rnd}))

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        self.total += sum(float(r.arrays["s"][0]) for r in replies.values())
        return {}

    def eval_model(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total = state["total"]


class _Trivial:
    def run(self, message: Message, ctx: ClientContext) -> Message:
        return Message({"s": torch.tensor([message.config_float("seed")])})


def _warm_up() -> None:
    """Pay torch's and the engine's one-time costs before any memory is read."""
    x = torch.zeros(2, 1, 8, 8)
    y = torch.zeros(2, dtype=torch.int64)
    sim = Simulation(
        strategy=_SeedBroadcast(),
        program=_Trivial(),
        clients=[ClientData(x, y, torch.arange(2))],
        test=(torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=2, per_round=1, eval_every=1),
    )
    sim.run_round(1)
    sim.run_round(2)


def run_engine_overhead(
    client_counts: tuple[int, ...] = (10, 100, 1000),
    *,
    rounds: int = 5,
    samples_per_client: int = 32,
) -> dict[str, Any]:
    """Measure engine overhead per client per round for each number of clients per round."""
    torch.set_num_threads(1)
    results = []
    _warm_up()
    for n in client_counts:
        gc.collect()
        rss0 = _status_kb("VmRSS") or 0
        x = torch.randn(n * samples_per_client, 1, 8, 8)
        y = torch.zeros(n * samples_per_client, dtype=torch.int64)
        clients = [
            ClientData(x, y, torch.arange(i * samples_per_client, (i + 1) * samples_per_client))
            for i in range(n)
        ]
        data_bytes = x.nbytes + y.nbytes + sum(c.indices.nbytes for c in clients)
        sim = Simulation(
            strategy=_SeedBroadcast(),
            program=_Trivial(),
            clients=clients,
            test=(torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64)),
            num_classes=2,
            config=EngineConfig(seed=0, rounds=rounds, per_round=n, eval_every=10**9),
        )
        sim.run_round(1)  # warm-up (first-call costs)
        rss_steady = _status_kb("VmRSS") or 0
        per_round, overhead, client = [], [], []
        for rnd in range(2, rounds + 2):
            t0 = time.perf_counter()
            line = sim.run_round(rnd)
            wall = time.perf_counter() - t0
            per_round.append(wall)
            client.append(line["client_wall_s"])
            overhead.append(wall - line["client_wall_s"])
        rss1 = _status_kb("VmRSS") or 0
        best = min(range(len(overhead)), key=overhead.__getitem__)
        results.append(
            {
                "clients_per_round": n,
                "rounds_timed": rounds,
                "overhead_ms_per_client": 1e3 * overhead[best] / n,
                "overhead_ms_per_client_median": 1e3 * sorted(overhead)[len(overhead) // 2] / n,
                "client_step_ms_per_client": 1e3 * client[best] / n,
                "round_wall_s": per_round[best],
                "bytes_down_per_client": line["bytes_down"] // n,
                "bytes_up_per_client": line["bytes_up"] // n,
                "rss_growth_bytes": max(0, rss1 - rss0),
                "rss_growth_over_timed_rounds_bytes": max(0, rss1 - rss_steady),
                "client_data_bytes": data_bytes,
            }
        )
        del sim, clients, x, y
    return {"benchmark": "engine-overhead", "results": results}


def engine_markdown(report: dict[str, Any], command: str) -> str:
    """The docs/benchmarks.md section for :func:`run_engine_overhead`."""
    head = [
        "clients/round",
        "overhead ms/client (best, median)",
        "client step ms/client",
        "round wall s",
        "bytes down/up per client",
        "RSS growth (all / over timed rounds)",
        "client data bytes",
    ]
    rows = [
        [
            f"{r['clients_per_round']}",
            f"{r['overhead_ms_per_client']:.3f}, {r['overhead_ms_per_client_median']:.3f}",
            f"{r['client_step_ms_per_client']:.3f}",
            f"{r['round_wall_s']:.4f}",
            f"{r['bytes_down_per_client']} / {r['bytes_up_per_client']}",
            f"{r['rss_growth_bytes'] / 1e6:.2f} MB / {r['rss_growth_over_timed_rounds_bytes'] / 1e6:.2f} MB",
            f"{r['client_data_bytes'] / 1e6:.2f} MB",
        ]
        for r in report["results"]
    ]
    intro = [
        "Engine overhead per client per round with trivial clients, one torch thread (everything but client compute:",
        "sampling, serialization both ways, generator derivation, meter with FLOP counting, finiteness",
        "check, aggregation). Target: < 0.5 ms per client at 1000 clients per round (Flower's Ray",
        "simulation costs milliseconds per client message here: the section \"Engine vs Flower's Ray",
        'simulation engine"), and memory that does not grow with the number of clients beyond their data.',
    ]
    return command_section(intro, command, markdown_table(head, rows))


#: The docs section this benchmark measures (:mod:`fedge.bench.measured`).
ENGINE_SECTION = Section("engine", "Engine overhead", engine_markdown)
