"""Fake run directories, written with the names of :mod:`fedge.core.rundir_schema`, as the engine
writes them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedge.core import rundir_schema as schema
from fedge.data.partition import partition_summary

BYTES_DOWN = 1_000_000  # per round, summed over clients
BYTES_UP = 250_000
FLOPS = 2_000_000_000


def write_run(
    path: Path,
    *,
    accuracies: Sequence[float | None] = (0.2, None, 0.5, None, 0.875),
    complete: bool = True,
    method: str = "fedavg",
    model: str = "cnn",
    dataset: str = "cifar10",
    num_clients: int = 4,
    num_classes: int = 3,
    flops: int = FLOPS,
    peak_bytes: int | None = None,
    extra: dict[str, float] | None = None,
    sim_time_s: float | None = None,
) -> Path:
    """A run directory with one metrics row per entry of ``accuracies`` (None = not evaluated).

    Bytes are ``BYTES_DOWN``/``BYTES_UP`` per round, FLOPs ``flops`` per round, so the
    cumulative numbers after round r are r times those; with ``sim_time_s``, each round lasts
    that many simulated seconds (the time model's keys).
    """
    path.mkdir(parents=True, exist_ok=True)
    n = len(accuracies)
    config: dict[str, Any] = {
        "seed": 7,
        "rounds": n,
        "clients": {"num": num_clients, "per_round": 2},
        "dataset": {"name": dataset},
        "partition": {"name": "dirichlet", "alpha": 0.5},
        "model": {"name": model},
        "method": {"name": method, "lr": 0.1},
    }
    (path / schema.CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    # partition.json exactly as a run writes it (fedge.experiment.build): the partitioner's name
    # and parameters plus partition_summary of real index arrays. Client i holds 10*(i+1) samples,
    # all of class i % num_classes.
    labels, parts, start = [], [], 0
    for i in range(num_clients):
        labels += [i % num_classes] * (10 * (i + 1))
        parts.append(np.arange(start, start + 10 * (i + 1)))
        start += 10 * (i + 1)
    partition = {
        "name": "dirichlet",
        "params": {"alpha": 0.5},
        **partition_summary(parts, np.array(labels), num_classes),
    }
    (path / schema.PARTITION).write_text(json.dumps(partition))
    with (path / schema.METRICS).open("w") as f:
        for r, acc in enumerate(accuracies, start=1):
            row: dict[str, Any] = {
                "round": r,
                "test_accuracy": acc,
                "test_loss": None if acc is None else 2.0 * (1 - acc),
                "train_loss": 1.5 / r,
                "bytes_down": BYTES_DOWN,
                "bytes_up": BYTES_UP,
                "client_flops": flops,
                "wall_s": 0.5,
                "cum_bytes_down": r * BYTES_DOWN,
                "cum_bytes_up": r * BYTES_UP,
                "cum_client_flops": r * flops,
                "clients": 2,
            }
            if peak_bytes is not None:
                row["client_peak_bytes"] = peak_bytes
            if sim_time_s is not None:
                row[schema.SIM_TIME_S] = sim_time_s
                row[schema.SIM_TIME_TOTAL_S] = r * sim_time_s
            row.update(extra or {})
            f.write(json.dumps(row) + "\n")
    if complete:
        evaluated = [a for a in accuracies if a is not None]
        summary = {
            "final_test_accuracy": evaluated[-1],
            "best_test_accuracy": max(evaluated),
            "total_bytes_down": n * BYTES_DOWN,
            "total_bytes_up": n * BYTES_UP,
            "total_client_flops": n * flops,
            "rounds": n,
            "method": method,
            "model": model,
            "dataset": dataset,
            "seed": 7,
            "wall_s": 0.5 * n,
            "model_params": 62_006,
            "model_bytes": 248_024,
            schema.STATUS: schema.COMPLETE,
        }
        if peak_bytes is not None:
            summary["client_peak_bytes"] = peak_bytes
        if sim_time_s is not None:
            summary[schema.SIM_TIME_TOTAL_S] = n * sim_time_s
        (path / schema.SUMMARY).write_text(json.dumps(summary))
    return path


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """``make_run("name", **write_run_kwargs)`` -> a fake run directory under tmp_path."""

    def make(name: str = "run", **kwargs: Any) -> Path:
        return write_run(tmp_path / name, **kwargs)

    return make
