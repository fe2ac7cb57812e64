"""Run presets end to end and tabulate accuracy and bytes per client per round next to the
serialized size of the final model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from fedge.bench.docs import command_section, markdown_table
from fedge.bench.figures import read_run_logs
from fedge.bench.measured import Section
from fedge.bench.variants import per_client_costs
from fedge.core.config import load_config
from fedge.experiment.run import run_experiment

__all__ = ["PRESETS_SECTION", "presets_markdown", "run_presets"]


def run_presets(
    names: list[str], *, overrides: list[str] | None = None, out_root: str | Path | None = None
) -> dict[str, Any]:
    """Run each preset (with ``overrides``) and collect its figures."""
    root = Path(out_root) if out_root else Path(tempfile.mkdtemp(prefix="fedge-bench-"))
    results = []
    for name in names:
        cfg = load_config(name, overrides=overrides or [])
        out = root / name
        run_experiment(cfg, out=out, render=False)
        summary, lines = read_run_logs(out)
        costs = per_client_costs(lines)
        results.append(
            {
                "preset": name,
                "run_dir": str(out),
                "rounds": summary["rounds"],
                "final_test_accuracy": summary["final_test_accuracy"],
                "best_test_accuracy": summary["best_test_accuracy"],
                "accuracy_by_round": [x["test_accuracy"] for x in lines],
                "model_bytes": summary["model_bytes"],
                "bytes_down_per_client_round": costs["bytes_down_per_client_round"],
                "bytes_up_per_client_round": costs["bytes_up_per_client_round"],
                "wall_s": summary["wall_s"],
            }
        )
    return {"benchmark": "presets", "results": results}


def presets_markdown(report: dict[str, Any], command: str) -> str:
    head = [
        "preset",
        "rounds",
        "final acc",
        "best acc",
        "model bytes",
        "down B/client/round, mean of rounds (ratio)",
        "up B/client/round, mean of rounds (ratio)",
        "wall s",
    ]
    rows = [
        [
            f"{r['preset']}",
            f"{r['rounds']}",
            f"{r['final_test_accuracy']:.4f}",
            f"{r['best_test_accuracy']:.4f}",
            f"{r['model_bytes']}",
            f"{r['bytes_down_per_client_round']:.0f} ({r['bytes_down_per_client_round'] / r['model_bytes']:.4f})",
            f"{r['bytes_up_per_client_round']:.0f} ({r['bytes_up_per_client_round'] / r['model_bytes']:.4f})",
            f"{r['wall_s']:.0f}",
        ]
        for r in report["results"]
    ]
    curves = [
        f"- {r['preset']}: "
        + ", ".join("—" if a is None else f"{a:.3f}" for a in r["accuracy_by_round"])
        for r in report["results"]
    ]
    intro = [
        "End-to-end runs of presets. Ratios compare the bytes each client received/sent in a round",
        "(averaged over all rounds) with the serialized size of the model (the same encoding); they",
        "must be within 1% of 1.",
    ]
    return command_section(
        intro, command, [*markdown_table(head, rows), "", "Test accuracy by round:", "", *curves]
    )


#: The docs section this benchmark measures (:mod:`fedge.bench.measured`).
PRESETS_SECTION = Section("presets", "Baseline presets", presets_markdown)
