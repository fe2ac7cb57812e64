"""BAFFLE communication measured from real messages (seed 000, Section 3.2 "Remark on
communication cost": batch-level uplink 4K bytes instead of 4|W|). Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

from typing import Any

import torch

from fedge.bench.docs import command_section, markdown_table
from fedge.core.config import load_config
from fedge.core.messages import Message
from fedge.experiment.build import build_run

__all__ = ["comm_markdown", "run_comm"]


def _rounds(overrides: list[str], rounds: int = 1) -> list[dict[str, Any]]:
    base = {
        "seed": 0,
        "draws": "torch",  # as the committed benchmarks/results/baffle_comm/report.json was made
        "rounds": 1,
        "clients": {"num": 10, "per_round": 10},
        "dataset": {"name": "digits"},
        "model": {"name": "lenet"},
        "method": {"name": "baffle", "batch_size": 16, "estimator": "fast"},
    }
    built = build_run(load_config(base, overrides=overrides))
    sim = built.simulation()
    return [sim.run_round(r) for r in range(1, rounds + 1)]


def _round(overrides: list[str]) -> dict[str, Any]:
    return _rounds(overrides)[0]


def run_comm(ks: tuple[int, ...] = (100, 200, 500)) -> dict[str, Any]:
    torch.set_num_threads(1)
    results = []
    seed_msg = Message(config={"seed": 2**62 - 1})
    seed_bytes = len(seed_msg.to_bytes()) - len(Message().to_bytes())
    for k in ks:
        batch = _round(["method.mode=batch", f"method.k={k}", "method.secure_aggregation=false"])
        secure = _round(["method.mode=batch", f"method.k={k}", "method.secure_aggregation=true"])
        seeds = _rounds(
            [
                "method.mode=batch",
                f"method.k={k}",
                "method.secure_aggregation=false",
                "method.downlink=seeds",
            ],
            2,
        )
        n = batch["clients"]
        up = batch["bytes_up"] / n
        results.append(
            {
                "k": k,
                "batch_up_per_client": up,
                "payload_bytes": 4 * k,
                "framing_bytes": up - 4 * k,
                "batch_down_per_client": batch["bytes_down"] / n,
                "seed_entry_bytes": seed_bytes,
                "secure_up_per_client": secure["bytes_up"] / n,
                "secure_down_per_client": secure["bytes_down"] / n,
                "seeds_down_first_round": seeds[0]["bytes_down"] / n,
                "seeds_down_next_round": seeds[1]["bytes_down"] / n,
            }
        )
    epoch = _round(["method.mode=epoch", "method.k=100", "method.max_steps=1"])
    return {
        "benchmark": "baffle-communication",
        "epoch_up_per_client": epoch["bytes_up"] / epoch["clients"],
        "epoch_down_per_client": epoch["bytes_down"] / epoch["clients"],
        "results": results,
    }


def comm_markdown(report: dict[str, Any], command: str) -> str:
    head = [
        "K",
        "uplink B/client (payload 4K + framing)",
        "downlink B/client (seed entry)",
        "with secure aggregation: up / down B/client",
        "`downlink: seeds`: down B/client, first round / each next round",
    ]
    rows = [
        [
            f"{r['k']}",
            f"{r['batch_up_per_client']:.0f} ({r['payload_bytes']} + {r['framing_bytes']:.0f})",
            f"{r['batch_down_per_client']:.0f} ({r['seed_entry_bytes']})",
            f"{r['secure_up_per_client']:.0f} / {r['secure_down_per_client']:.0f}",
            f"{r['seeds_down_first_round']:.0f} / {r['seeds_down_next_round']:.0f}",
        ]
        for r in report["results"]
    ]
    return command_section(
        [
            "Batch-level BAFFLE messages measured from one real round (digits, BAFFLE's LeNet, 10 clients).",
            "Target: uplink = 4K bytes of payload plus at most 64 bytes of framing; the seed travels as",
            "one 8-byte integer (its entry, key included, is the figure in parentheses). The downlink also",
            "carries the model (the paper's Algorithm 1 sends W_t each round). Secure aggregation adds",
            "key agreement, encrypted Shamir shares and unmasking (complete mask graph, 10 clients, one",
            "masked (K+1)-vector of 64-bit ring elements). With `downlink: seeds` a client that took part",
            "in the previous round gets that round's seed and the K aggregated loss differences and rebuilds",
            "the model (the first round carries the model and the server optimizer's state, Adam's two moments).",
            f"Epoch-level, for comparison: {report['epoch_up_per_client']:.0f} B up and "
            f"{report['epoch_down_per_client']:.0f} B down per client per round (model deltas, as FedAvg).",
        ],
        command,
        markdown_table(head, rows),
    )
