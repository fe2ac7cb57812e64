"""FedPT Table 2/4 analogue (seed 002, Sec. 4.1, Tables 2 and 4): a residual network with
progressively more of its convolution blocks frozen, on Fashion-MNIST.

The paper freezes conv layers of ResNet-18 on CIFAR-10 at five trainable fractions and reports
accuracy and communication (Table 2), and runtime and peak memory (Table 4). Here: the zoo's
ResNet-20 (``resnet20``: 16-32-64 channels, BatchNorm, 269,434 parameters) on Fashion-MNIST at
28x28, frozen by FedPT's principle 1 (``method.freeze=largest:N``: the N blocks with the most
freezable parameters, largest first), normalization layers always trainable:

    fully trainable   method.freeze=[]
    largest:1         s3b2                                  (one 64-channel block)
    largest:3         s3b1..s3b3                            (the 64-channel stage)
    largest:6         + s2b1..s2b3                          (the 32- and 64-channel stages)
    largest:9         + s1b1..s1b3                          (every residual block; stem, norms, FC train)

Per row: trainable %, measured bytes per client per round (down, up), communication reduction
against the fully trainable row, final test accuracy (mean ± std over the seeds run), client time
per round and client peak memory (``measure.memory``: tensor accounting and peak RSS growth).

Reduced to fit about 10 minutes of one CPU thread (the paper: CIFAR-10, ResNet-18, hundreds of
rounds): preset ``fedpt-fmnist-cnn`` with the model swapped, 3,000 training samples over 10
clients partitioned by label skew Dirichlet(1) as the paper's CIFAR-10 clients
(``partition.name=dirichlet``, ``partition.alpha=1``), all 10 per round, 5 rounds of one local
epoch (batches of 32, SGD lr 0.05 momentum 0.9), evaluated on 2,000 test images at the end; 3 seeds.

    python benchmarks/fedpt_table2.py [--out runs/bench-fedpt-table2] [--seeds 3] [--docs docs/benchmarks.md]
    python benchmarks/fedpt_table2.py --table-only --docs docs/benchmarks.md   # render the records
    python benchmarks/fedpt_table2.py --estimate   # the CPU-minutes the runs not yet recorded need

Resumable per run (row and seed): each finished run is recorded under
``benchmarks/results/fedpt_table2/`` (its resolved config and row under ``runs/``, the table's
figures of it under ``figures/``; commit them), and the table is derived from those records alone.
"""

from __future__ import annotations

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
from fedge.bench.unit_records import (
    records_main,
    records_parser,
    records_section,
    run_units,
    wall_minutes,
)

RECORDS = Path(__file__).resolve().parent / "results" / "fedpt_table2"
COMMAND = "python benchmarks/fedpt_table2.py --seeds 3"
RENDER = "python benchmarks/fedpt_table2.py --table-only --docs docs/benchmarks.md"
#: CPU-minutes of one run (one thread), from the runs behind the first version of this table:
#: 10 clients × about 3.7 s per client step × 5 rounds, plus the evaluation
MINUTES_PER_RUN = 3.3

PRESET = "fedpt-fmnist-cnn"
ROUNDS = 5
COMMON = [
    "threads=1",
    "model.name=resnet20",
    f"rounds={ROUNDS}",
    f"eval_every={ROUNDS}",
    "measure.memory=true",
    "dataset.limit_train=3000",
    "dataset.limit_test=2000",
    "partition.name=dirichlet",
    "partition.alpha=1.0",
]
ROWS = {
    "fully trainable": "method.freeze=[]",
    "largest:1 frozen": "method.freeze=largest:1",
    "largest:3 frozen": "method.freeze=largest:3",
    "largest:6 frozen": "method.freeze=largest:6",
    "largest:9 frozen": "method.freeze=largest:9",
}
FROZEN_BLOCKS = {
    "fully trainable": "none",
    "largest:1 frozen": "s3b2",
    "largest:3 frozen": "s3b1–s3b3",
    "largest:6 frozen": "s2b1–s3b3",
    "largest:9 frozen": "s1b1–s3b3",
}


def table(report: dict[str, Any]) -> str:
    rows = report["rows"]
    full = rows["fully trainable"]
    head = [
        "frozen (method.freeze)",
        "blocks frozen",
        "trainable %",
        "bytes down / client / round",
        "bytes up / client / round",
        "communication reduction",
        "final accuracy",
        "client GFLOP / round",
        "client s / round (ratio to full)",
        "client peak, tensors (MiB)",
    ]
    cells = []
    for label, r in rows.items():
        acc = f"{100 * r['accuracy']:.2f}" + (
            f" ± {100 * r['accuracy_std']:.2f}" if r["seeds"] > 1 else ""
        )
        cells.append(
            [
                ROWS[label].split("=", 1)[1],
                FROZEN_BLOCKS[label],
                f"{100 * r['trainable_fraction']:.2f}",
                f"{r['bytes_down']:,.0f}",
                f"{r['bytes_up']:,.0f}",
                f"{communication_reduction(full, r):.1f}×",
                acc,
                f"{r['client_flops'] / 1e9:.1f}",
                f"{r['client_s']:.2f} ({r['client_s'] / full['client_s']:.2f})",
                mib(r["tensor_peak"]),
            ]
        )
    return "\n".join(markdown_table(head, cells, left=2))


PARTITION = (
    "**Partition**: label skew by Dirichlet(1) over the 10 clients (`partition.name=dirichlet`, "
    "`partition.alpha=1`, at least 10 samples a client), as the paper partitions CIFAR-10; the "
    "model, data set, scale and rounds are this machine's (above), not the paper's. The Dirichlet "
    "split is drawn with numpy's generator (not fedge's portable draws), so a seed's split can "
    "differ between machines; each run record names the machine that ran it."
)


def markdown(report: dict[str, Any]) -> str:
    seeds = report["seeds"]
    return (
        "FedPT (seed 002) Tables 2 and 4: ResNet-18 on CIFAR-10 with conv layers frozen at five trainable "
        "fractions; accuracy holds down to a small trainable fraction while communication, client time and "
        "peak memory fall. Here: the zoo's ResNet-20 (`resnet20`, BatchNorm, 269,434 parameters) on "
        "Fashion-MNIST at 28x28, frozen by the paper's principle 1 (`method.freeze=largest:N`: the N blocks "
        "with the most freezable parameters; `fedge models --blocks resnet20` lists them), normalization "
        "layers always trainable. Reduced: preset `fedpt-fmnist-cnn` with `model.name=resnet20`, 3,000 "
        f"training samples over 10 Dirichlet(1) clients (all sampled each round), {ROUNDS} rounds of one local epoch "
        "(batches of 32, SGD lr 0.05 momentum 0.9), 2,000 test images, one torch thread, "
        + (f"{seeds} seed{'s' * (seeds > 1)}{' (mean ± std)' if seeds > 1 else ''}. ")
        + "Bytes are the real serialized messages per client per round (frozen rows: trainable tensors, "
        "BatchNorm statistics and the 8-byte seed down; the trainable delta up). Client GFLOP are counted "
        "by torch's flop counter per client step. Client time is wall time per client step on a machine shared "
        "with other jobs (noisy; the ratio to the fully trainable row in the same run is the figure to read). "
        "Memory per client step is tensor accounting (peak over rounds of parameters + live tensors). The "
        "runs also log RSS growth of the process high-water mark, but all rows run in one process, one "
        "after another, so only the first row's RSS grows and the later rows read (nearly) 0: "
        "not a per-row figure, so it is left out of the table.\n\n" + PARTITION
    )


def _notes(report: dict[str, Any]) -> str:
    rows = report["rows"]
    full = rows["fully trainable"]
    last = rows["largest:9 frozen"]
    return (
        f"\n\nFreezing every residual block leaves {100 * last['trainable_fraction']:.2f}% of the parameters "
        f"trainable, cuts the bytes per round {communication_reduction(full, last):.0f}× "
        f"and the client's tensor peak from {full['tensor_peak'] / 2**20:.1f} to {last['tensor_peak'] / 2**20:.1f} MiB, "
        f"at {100 * (full['accuracy'] - last['accuracy']):.1f} accuracy points after {ROUNDS} rounds. The blocks frozen "
        "first are the late, wide ones, whose weights dominate the count but whose activations are small "
        "(7x7 maps); a client still backpropagates through a frozen block to reach trainable layers before it, "
        "so the memory saved is mostly gradients, optimizer state and the start copy, not activations, and "
        "the FLOPs fall only by the frozen blocks' weight gradients. This budget is far from convergence, "
        "so the accuracies compare the rows with each other, not with the paper's." + _shape(rows)
    )


def _shape(rows: dict[str, dict[str, Any]]) -> str:
    """Say plainly where the accuracy is not monotone in the trainable fraction, and the time ratios."""
    full = rows["fully trainable"]
    order = sorted(rows.values(), key=lambda r: -r["trainable_fraction"])
    dips = [(a, b) for a, b in zip(order, order[1:], strict=False) if b["accuracy"] > a["accuracy"]]
    text = ""
    if dips:
        a, b = dips[0]
        text += (
            f" Accuracy is not monotone in the trainable fraction here: {100 * b['trainable_fraction']:.2f}% trainable "
            f"reaches {100 * b['accuracy']:.2f} against {100 * a['accuracy']:.2f} at {100 * a['trainable_fraction']:.2f}%. "
            + (
                "With one seed this table cannot say whether that is seed-to-seed spread or an effect "
                "of freezing part of a stage; rerun with `--seeds 3` to tell."
                if min(r["seeds"] for r in rows.values()) < 2
                else "Read it against the rows' std over the seeds."
            )
        )
    ratios = [r["client_s"] / full["client_s"] for r in rows.values()]
    text += (
        f" Client time per round does not fall measurably with freezing (ratios {min(ratios):.2f}–{max(ratios):.2f} "
        "to the fully trainable row, on a shared machine): the forward pass and the backward pass through the "
        "frozen late blocks remain, only their weight gradients go."
    )
    return text


def read_report(
    records: Path = RECORDS, seeds: range = range(3), *, run: bool = False, out: str = "", extra=()
) -> dict[str, Any]:
    """The table's figures, from the committed records alone (``run=False``, ``--table-only``)
    or running the units not yet recorded into ``out`` first; rows whose seeds are not all
    recorded are ``missing``."""
    units = run_units(
        PRESET,
        {k: [v] for k, v in ROWS.items()},
        seeds=seeds,
        out_root=out or records / ".unused",
        common=[*COMMON, *extra],
        records=records,
        figures=lambda run_dir, row: run_figures(run_dir),
        run=run,
    )
    rows = {}
    for label, per in units["rows"].items():
        row = mean_over_seeds(
            [{k: v for k, v in p.items() if k not in ("row", "seed")} for p in per]
        )
        row["cpu_minutes"] = sum(p["row"]["wall_s"] for p in per) / 60
        rows[label] = row
    return {
        "rows": rows,
        "seeds": len(seeds),
        "missing": units["missing"],
        "complete": len(rows) == len(ROWS),
    }


def section(report: dict[str, Any] | None = None) -> str:
    """The docs section, from the records alone: the protocol, the commands, the table, its
    reading and each row's CPU-minutes; while a row awaits records, the protocol and what is left."""
    report = report or read_report()
    rows = report["rows"]
    return records_section(
        markdown(report),
        report,
        records="benchmarks/results/fedpt_table2/",
        command=COMMAND,
        render=RENDER,
        body=lambda: [table(report) + _notes(report) + few_seeds_note(rows), wall_minutes(rows)],
    )


def main(argv: list[str] | None = None) -> int:
    ap = records_parser(__doc__, out="runs/bench-fedpt-table2", records=RECORDS, seeds=3)
    args = ap.parse_args(argv)
    return records_main(
        args,
        read=read_report,
        units=len(ROWS) * args.seeds,
        minutes_per_run=MINUTES_PER_RUN,
        section=section,
        name="fedpt-table2",
        title="FedPT Table 2/4 analogue",
        root=Path(__file__).resolve().parents[1],
    )


if __name__ == "__main__":
    raise SystemExit(main())
