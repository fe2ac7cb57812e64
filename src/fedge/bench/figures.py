"""A finished run directory's figures as the benchmark tables read them (:func:`read_run_logs`,
:func:`run_figures`, :func:`mean_over_seeds`; FedPT, seed 002, Tables 1, 2 and 4).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fedge.core.rundir_schema import FINAL_TEST_ACCURACY, METRICS, SUMMARY, loads

__all__ = [
    "communication_reduction",
    "few_seeds_note",
    "mean_over_seeds",
    "mib",
    "read_run_logs",
    "run_figures",
]


def read_run_logs(run_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(summary.json, the metrics.jsonl lines)`` of the run in ``run_dir`` (blank lines skipped)."""
    d = Path(run_dir)
    summary = loads((d / SUMMARY).read_text())
    lines = [loads(x) for x in (d / METRICS).read_text().splitlines() if x.strip()]
    return summary, lines


def run_figures(run_dir: str | Path) -> dict[str, Any]:
    """One run's figures: final test accuracy, trainable fraction, bytes per client per round
    (the last round's), client FLOPs per client per round (mean over rounds), client time per
    client step (mean over rounds) and the client memory peaks (``measure.memory``: tensor
    accounting and RSS growth, max over rounds; None when not measured)."""
    summary, lines = read_run_logs(run_dir)
    n = lines[0]["clients"]
    return {
        "accuracy": summary[FINAL_TEST_ACCURACY],
        "trainable_fraction": summary["trainable_fraction"],
        "bytes_down": lines[-1]["bytes_down"] / n,
        "bytes_up": lines[-1]["bytes_up"] / n,
        "client_flops": (
            None
            if summary.get("total_client_flops") is None
            else summary["total_client_flops"] / summary["rounds"] / n
        ),
        "client_s": statistics.mean(x["client_wall_s"] / n for x in lines),
        "tensor_peak": summary.get("client_tensor_peak_bytes"),
        # max over rounds: round 1, before the allocator holds memory
        "rss_peak": summary.get("client_rss_growth_bytes"),
    }


def mean_over_seeds(per: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over one row's runs (:func:`run_figures` of each seed) of every figure (None where
    no run has it); the accuracy also its sample std (0 for one seed), and ``seeds``."""
    acc = [p["accuracy"] for p in per]
    out: dict[str, Any] = {}
    for k in per[0]:
        vals = [p[k] for p in per if p[k] is not None]
        out[k] = statistics.mean(vals) if vals else None
    out.update(accuracy_std=statistics.stdev(acc) if len(acc) > 1 else 0.0, seeds=len(per))
    return out


def communication_reduction(full: dict[str, Any], row: dict[str, Any]) -> float:
    """Bytes per client per round (down + up) of ``full`` over those of ``row``: how many times
    less a client of ``row`` exchanges (FedPT's "communication reduction")."""
    return (full["bytes_down"] + full["bytes_up"]) / (row["bytes_down"] + row["bytes_up"])


def mib(b: float | None, digits: int = 1) -> str:
    """Bytes as MiB with ``digits`` decimals; ``n/a`` for a figure not measured (None)."""
    return "n/a" if b is None else f"{b / 2**20:.{digits}f}"


def few_seeds_note(rows: dict[str, dict[str, Any]], default: int = 3) -> str:
    """A sentence for a table whose rows have fewer seeds (``"seeds"``) than the script's
    ``default``, so a reader knows; empty when every row has them."""
    seeds = min(r["seeds"] for r in rows.values())
    if seeds >= default:
        return ""
    return f" Only {seeds} seed(s) were run (the script's default is {default}; rerun to add them)."
