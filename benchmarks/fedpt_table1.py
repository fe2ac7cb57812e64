"""FedPT Table 1 analogue (seed 002, Sec. 4.1): FedPT's EMNIST CNN on Fashion-MNIST, fully
trainable vs the dense layer after the convolutions frozen, over 3 seeds.

Per row: trainable %, measured bytes per client per round (down, up), communication reduction
against the fully trainable row, final test accuracy (mean ± std over seeds), client time per
round and client peak memory (tensor accounting and peak RSS; ``measure.memory``).

Reduced to fit about 20 minutes of one CPU thread (the paper: EMNIST-62, 3400 clients, 1500
rounds): 3,000 training samples over 10 IID clients, all 10 per round, 6 rounds of one local
epoch (batches of 32, SGD lr 0.05 momentum 0.9), evaluated on 2,000 test images at the end.

    python benchmarks/fedpt_table1.py [--out runs/bench-fedpt-table1] [--seeds 3] [--docs docs/benchmarks.md]
    python benchmarks/fedpt_table1.py --table-only --docs docs/benchmarks.md   # render the records
    python benchmarks/fedpt_table1.py --estimate   # the CPU-minutes the runs not yet recorded need

Resumable per run (row and seed): each finished run is recorded under
``benchmarks/results/fedpt_table1/`` (its resolved config and row under ``runs/``, the table's
figures of it under ``figures/``; commit them), and the table is derived from those records alone.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fedge.bench.docs import markdown_table
from fedge.bench.figures import (
    communication_reduction,
    few_seeds_note,
    mean_over_seeds,
    mib,
    run_figures,
)
from fedge.bench.stats import NO_INTERVAL, t_interval, verdict
from fedge.bench.unit_records import (
    records_main,
    records_parser,
    records_section,
    run_units,
    wall_minutes,
)

RECORDS = Path(__file__).resolve().parent / "results" / "fedpt_table1"
COMMAND = "python benchmarks/fedpt_table1.py --seeds 3"
RENDER = "python benchmarks/fedpt_table1.py --table-only --docs docs/benchmarks.md"
#: CPU-minutes of one run (one thread), from the runs behind the first version of this table:
#: 10 clients × about 2.4 s per client step × 6 rounds, plus the evaluation
MINUTES_PER_RUN = 3.0
PRESET = "fedpt-fmnist-cnn"
ROUNDS = 6
COMMON = [
    "threads=1",
    f"rounds={ROUNDS}",
    f"eval_every={ROUNDS}",
    "measure.memory=true",
    "dataset.limit_train=3000",
    "dataset.limit_test=2000",
]
ROWS = {
    "fully trainable": "method.freeze=[]",
    "dense layer frozen": "method.freeze=[classifier.fc1]",
}


#: The paper's Table 1 effect of freezing the dense layer, in accuracy points (EMNIST, 83.75 with
#: it frozen against 85.47 fully trainable).
PAPER_GAP = 83.75 - 85.47


def _row(per: list[dict[str, Any]]) -> dict[str, Any]:
    """One row over its seeds' figures (:func:`fedge.bench.figures.run_figures` of each run, as
    recorded), seed 0 first."""
    per = sorted(per, key=lambda p: p["seed"])
    agg = mean_over_seeds([{k: v for k, v in p.items() if k not in ("row", "seed")} for p in per])
    out = {
        k: agg[k]
        for k in (
            "trainable_fraction",
            "bytes_down",
            "bytes_up",
            "client_s",
            "tensor_peak",
            "rss_peak",
        )
    }
    out.update(
        accuracy_mean=agg["accuracy"],
        accuracy_std=agg["accuracy_std"],
        seeds=agg["seeds"],
        accuracies=[p["accuracy"] for p in per],  # by seed, 0, 1, ...: the rows pair by seed
        cpu_minutes=sum(p["row"]["wall_s"] for p in per) / 60,
    )
    return out


def table(report: dict[str, Any]) -> str:
    rows = report["rows"]
    full = rows["fully trainable"]
    head = [
        "model",
        "trainable %",
        "bytes down / client / round",
        "bytes up / client / round",
        "communication reduction",
        "final accuracy (mean ± std)",
        "client s / round",
        "client peak, tensors (MiB)",
    ]
    cells = [
        [
            label,
            f"{100 * r['trainable_fraction']:.2f}",
            f"{r['bytes_down']:,.0f}",
            f"{r['bytes_up']:,.0f}",
            f"{communication_reduction(full, r):.1f}×",
            f"{100 * r['accuracy_mean']:.2f} ± {100 * r['accuracy_std']:.2f} (n={r['seeds']})",
            f"{r['client_s']:.2f}",
            mib(r["tensor_peak"]),
        ]
        for label, r in rows.items()
    ]
    return "\n".join(markdown_table(head, cells, left=1))


def markdown(report: dict[str, Any]) -> str:
    return (
        "FedPT (seed 002) Table 1: EMNIST CNN, dense layer frozen: 4.97% trainable, 20× less communication, "
        "83.75 ± 0.16 vs 85.47 ± 0.21 accuracy. Here: the same CNN (`cnn-fedpt`: conv3x3(32), conv3x3(64), "
        "maxpool, FC 128, FC 10; dropout left out) on Fashion-MNIST, preset `fedpt-fmnist-cnn`, IID partition, "
        f"reduced to 3,000 training samples over 10 clients (all sampled each round), {ROUNDS} rounds of one "
        "local epoch, 2,000 test images, one torch thread. Bytes are the real serialized messages per client "
        "per round (the frozen row's downlink is the trainable tensors plus the 8-byte seed); client time and "
        "memory are per client step (tensor accounting: peak over rounds = parameters + live tensors, mean over "
        "seeds). The runs also log RSS growth of the process high-water mark, but the rows run one after "
        "another in one process, so a later row's RSS grows only beyond what an earlier row already took: "
        "not a per-row figure, so it is left out. Client time per round is wall time per client step on a "
        "machine shared with other jobs: noisy."
    )


def _notes(report: dict[str, Any]) -> str:
    rows = report["rows"]
    full, frozen = rows["fully trainable"], rows["dense layer frozen"]
    gap = 100 * (full["accuracy_mean"] - frozen["accuracy_mean"])
    text = (
        f"\n\nFreezing the dense layer cuts the bytes per round by the ratio of the serialized models and the client's "
        f"tensor peak by {(full['tensor_peak'] - frozen['tensor_peak']) / 2**20:.1f} MiB (no gradient, optimizer "
        f"state or start copy for fc1), at {gap:.1f} accuracy points after {ROUNDS} rounds (the paper: 1.7 points at "
        "convergence; this budget is far from convergence, so the gap is not comparable to the paper's)."
    )
    return text + " " + verdict_sentence(full, frozen) + few_seeds_note(rows)


def verdict_sentence(full: dict[str, Any], frozen: dict[str, Any]) -> str:
    """Frozen − fully trainable final accuracy, paired by seed (the same seed draws the same data
    and initial model for both rows), with its two-part verdict against the paper's
    :data:`PAPER_GAP` (:func:`fedge.bench.stats.verdict`); with one seed, no direction."""
    diffs = [100 * (b - a) for a, b in zip(full["accuracies"], frozen["accuracies"], strict=False)]
    head = f"Against the paper's {PAPER_GAP:+.2f} points (frozen − fully trainable"
    if len(diffs) < 2:
        return f"{head}): direction {NO_INTERVAL}; size not compared."
    lo, hi = t_interval(diffs)
    mean, std = statistics.mean(diffs), statistics.stdev(diffs)
    seeds = ", ".join(f"{s}: {d:+.1f}" for s, d in enumerate(diffs))
    return (
        f"{head}, paired by seed: {mean:+.2f} ± {std:.2f} points, seeds {seeds}; 95% interval "
        f"{lo:+.1f} to {hi:+.1f}) → {verdict(lo, hi, mean, PAPER_GAP)}."
    )


def variants() -> dict[str, list[str]]:
    return {label: [freeze] for label, freeze in ROWS.items()}


def read_report(
    records: Path = RECORDS, seeds: range = range(3), *, run: bool = False, out: str = "", extra=()
) -> dict[str, Any]:
    """The table's figures, from the committed records alone (``run=False``, ``--table-only``)
    or running the units not yet recorded into ``out`` first; rows whose seeds are not all
    recorded are ``awaiting``."""
    units = run_units(
        PRESET,
        variants(),
        seeds=seeds,
        out_root=out or records / ".unused",
        common=[*COMMON, *extra],
        records=records,
        figures=lambda run_dir, row: run_figures(run_dir),
        run=run,
    )
    rows = {label: _row(per) for label, per in units["rows"].items()}
    return {"rows": rows, "missing": units["missing"], "complete": len(rows) == len(ROWS)}


def section(report: dict[str, Any] | None = None) -> str:
    """The docs section, from the records alone: the protocol, the commands, the table, its
    reading and each row's CPU-minutes; while a row awaits records, the protocol and what is left."""
    report = report or read_report()
    return records_section(
        markdown(report),
        report,
        records="benchmarks/results/fedpt_table1/",
        command=COMMAND,
        render=RENDER,
        body=lambda: [table(report) + _notes(report), wall_minutes(report["rows"])],
    )


def main(argv: list[str] | None = None) -> int:
    ap = records_parser(__doc__, out="runs/bench-fedpt-table1", records=RECORDS, seeds=3)
    args = ap.parse_args(argv)
    return records_main(
        args,
        read=read_report,
        units=len(ROWS) * args.seeds,
        minutes_per_run=MINUTES_PER_RUN,
        section=section,
        name="fedpt-table1",
        title="FedPT Table 1 analogue",
        root=Path(__file__).resolve().parents[1],
    )


if __name__ == "__main__":
    raise SystemExit(main())
