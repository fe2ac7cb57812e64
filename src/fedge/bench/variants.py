"""Run one base config under several named sets of overrides (a table of a paper, an
ablation) and tabulate accuracy, bytes and client FLOPs side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedge.core.config import load_config
from fedge.runtime.run import resume_experiment, run_experiment
from fedge.runtime.rundir import RunDir

__all__ = ["run_variants", "variants_markdown"]


def run_variants(
    base: str,
    variants: dict[str, list[str]],
    *,
    out_root: str | Path,
    common: list[str] | None = None,
    run: bool = True,
) -> dict[str, Any]:
    """Run ``base`` with ``common + overrides`` for each variant into ``out_root/<label>``.

    A variant whose run directory is already complete is read, not rerun; an interrupted one
    is resumed. So a long benchmark can be stopped and continued. With ``run=False`` only the
    complete variants are tabulated (the rest are listed under ``"missing"``).
    """
    root = Path(out_root)
    results = []
    missing = []
    for label, overrides in variants.items():
        out = root / label
        if not run and not RunDir(out).is_complete():
            missing.append(label)
            continue
        if not RunDir(out).is_complete():
            if (out / "config.yaml").exists():
                resume_experiment(out, render=False)
            else:
                run_experiment(load_config(base, overrides=[*(common or []), *overrides]), out=out, render=False)
        summary = json.loads((out / "summary.json").read_text())
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        n = lines[0]["clients"]
        results.append(
            {
                "label": label,
                "overrides": overrides,
                "run_dir": str(out),
                "final_test_accuracy": summary["final_test_accuracy"],
                "best_test_accuracy": summary["best_test_accuracy"],
                "bytes_up_per_client_round": lines[0]["bytes_up"] / n,
                "bytes_down_per_client_round": lines[0]["bytes_down"] / n,
                "client_flops_per_round": summary["total_client_flops"] / summary["rounds"],
                "wall_s": summary["wall_s"],
                "accuracy_by_round": [x["test_accuracy"] for x in lines],
            }
        )
    return {"benchmark": "variants", "base": base, "common": common or [], "results": results, "missing": missing}


def variants_markdown(report: dict[str, Any], command: str, intro: str) -> str:
    rows = [
        "| variant | overrides | final acc | best acc | up B/client/round | down B/client/round | client GFLOP/round | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        rows.append(
            f"| {r['label']} | `{' '.join(r['overrides']) or '-'}` | {r['final_test_accuracy']:.4f} | {r['best_test_accuracy']:.4f} "
            f"| {r['bytes_up_per_client_round']:.0f} | {r['bytes_down_per_client_round']:.0f} "
            f"| {r['client_flops_per_round'] / 1e9:.1f} | {r['wall_s']:.0f} |"
        )
    common = " ".join(report["common"])
    missing = report.get("missing") or []
    note = ["", f"Not run yet (the command resumes them): {', '.join(missing)}"] if missing else []
    return "\n".join(
        [intro, "", f"Command: `{command}`", "", f"Base: `{report['base']}`" + (f" with `{common}`" if common else ""), "", *rows, *note]
    )
