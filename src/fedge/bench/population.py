"""Engine cost against the population size (cross-device scale): 1e3 .. 1e6 lazily generated
clients, 1,000 a round. Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any

import torch

from fedge.bench.docs import command_section, markdown_table
from fedge.bench.engine import _SeedBroadcast, _Trivial, _warm_up
from fedge.bench.measured import Section
from fedge.core.context import ClientData
from fedge.core.meter import _status_kb
from fedge.runtime.engine import EngineConfig, Simulation

__all__ = ["POPULATION_SECTION", "population_markdown", "run_population_scale"]


class _LazyTrivialClients(Sequence[ClientData]):
    """A population whose client data (8 samples of 1×8×8) is made on access."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, cid: Any) -> Any:
        if isinstance(cid, slice):
            raise TypeError("a lazy population is indexed one client at a time")
        g = torch.Generator().manual_seed(int(cid))
        return ClientData(
            torch.randn(8, 1, 8, 8, generator=g), torch.zeros(8, dtype=torch.int64), torch.arange(8)
        )


def run_population_scale(
    populations: Sequence[int] = (1_000, 10_000, 100_000, 1_000_000),
    *,
    per_round: int = 1000,
    rounds: int = 10,
) -> dict[str, Any]:
    torch.set_num_threads(1)
    _warm_up()
    results = []
    for n in populations:
        gc.collect()
        rss0 = _status_kb("VmRSS") or 0
        t0 = time.perf_counter()
        sim = Simulation(
            strategy=_SeedBroadcast(),
            program=_Trivial(),
            clients=_LazyTrivialClients(n),
            test=(torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64)),
            num_classes=2,
            config=EngineConfig(
                seed=0, rounds=rounds + 1, per_round=min(per_round, n), eval_every=10**9
            ),
        )
        sim.run_round(1)
        startup = time.perf_counter() - t0
        rss_first = _status_kb("VmRSS") or 0
        overhead = []
        for rnd in range(2, rounds + 2):
            t = time.perf_counter()
            line = sim.run_round(rnd)
            overhead.append(time.perf_counter() - t - line["client_wall_s"])
        rss1 = _status_kb("VmRSS") or 0
        m = min(per_round, n)
        results.append(
            {
                "population": n,
                "clients_per_round": m,
                "startup_s": startup,
                "overhead_ms_per_client": 1e3 * sorted(overhead)[len(overhead) // 2] / m,
                "rss_mb": rss1 / 1e6,
                "rss_growth_mb_per_round": (rss1 - rss_first) / 1e6 / rounds,
                "rss_over_start_mb": (rss1 - rss0) / 1e6,
            }
        )
        del sim
    return {"benchmark": "population-scale", "rounds": rounds, "results": results}


def population_markdown(report: dict[str, Any], command: str) -> str:
    head = [
        "population",
        "clients/round",
        "start-up s",
        "overhead ms/client (median)",
        "RSS after rounds MB",
        "RSS growth MB/round",
    ]
    rows = [
        [
            f"{r['population']:,}",
            f"{r['clients_per_round']}",
            f"{r['startup_s']:.2f}",
            f"{r['overhead_ms_per_client']:.3f}",
            f"{r['rss_mb']:.1f}",
            f"{r['rss_growth_mb_per_round']:.2f}",
        ]
        for r in report["results"]
    ]
    intro = [
        f"A lazily generated population of trivial clients, {report['rounds']} timed rounds each; one process,",
        "one torch thread. Targets (cross-device issue): ≤ 0.05 ms per client per round at every population,",
        "RSS at 1e6 within 50 MB of RSS at 1e3, start-up ≤ 5 s.",
    ]
    return command_section(intro, command, markdown_table(head, rows))


#: The docs section this benchmark measures (:mod:`fedge.bench.measured`).
POPULATION_SECTION = Section(
    "population", "Engine cost against the population size", population_markdown
)
