"""Composition table (beyond the seed papers): how close do forward-only clients get to backprop
FedAvg when they train only a small part of the network?

Five rows on the same data, model, clients, rounds and client optimizer (base preset
``baffle-fmnist-lenet``: BAFFLE's LeNet, conv5x5(16)-GN-act-maxpool, conv5x5(64)-GN-act, global
average pool, FC; 26,730 parameters, GroupNorm without affine parameters):

    BP FedAvg full        fedavg, every parameter trained by backprop
    BP FedPT              fedpt, conv2 (the largest block, 96% of the parameters) frozen at its seeded init
    BAFFLE full           baffle (epoch mode, K = 100 twice-FD forward differences), every parameter
    BAFFLE + freeze       baffle with conv2 frozen: the K perturbations touch only the 1,066 trainable coordinates
    NTK-BAFFLE + freeze   ntk-baffle (data-free NTK pruning to density 0.1, 10 pruning rounds), then
                          BAFFLE + freeze on the pruned network

Per row: trainable parameters, final test accuracy, client FLOPs per client per round (torch's
flop counter: backprop for BP, forwards only for BAFFLE), uplink bytes per client per round
(measured messages) and client peak memory (``measure.memory``: tensor accounting, max over
rounds).

Reduced to fit about 10 minutes of one CPU thread: 500 training samples over 10 IID clients (50
each), all 10 per round, 10 rounds, batches of 25 (2 local steps per round), Adam lr 0.01
(betas 0.9/0.99; BAFFLE's client optimizer, used for every row), 2,000 test images, one seed by default.

    python benchmarks/fedpt_composition.py [--out runs/bench-fedpt-composition] [--seeds 1] [--docs docs/benchmarks.md]
    python benchmarks/fedpt_composition.py --table-only --docs docs/benchmarks.md   # render the records
    python benchmarks/fedpt_composition.py --estimate   # the CPU-minutes the runs not yet recorded need

Resumable per run (row and seed): each finished run is recorded under
``benchmarks/results/fedpt_composition/`` (its resolved config and row under ``runs/``, the
table's figures of it under ``figures/``; commit them), and the table is derived from those
records alone.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from fedge.bench.docs import markdown_table
from fedge.bench.figures import mib, read_run_logs
from fedge.bench.unit_records import (
    records_main,
    records_parser,
    records_section,
    run_units,
    wall_minutes,
)
from fedge.core.config import load_config
from fedge.models import build_model
from fedge.models.blocks import resolve_freeze

RECORDS = Path(__file__).resolve().parent / "results" / "fedpt_composition"
COMMAND = "python benchmarks/fedpt_composition.py --seeds 1"
RENDER = "python benchmarks/fedpt_composition.py --table-only --docs docs/benchmarks.md"
#: CPU-minutes of one run (one thread), from the runs behind the first version of this table
#: (5 runs, one seed, in about 10 minutes; the BAFFLE rows take most of it)
MINUTES_PER_RUN = 2.0
PRESET = "baffle-fmnist-lenet"
ROUNDS = 10
FREEZE = "method.freeze=[features.conv2]"
COMMON = [
    "threads=1",
    f"rounds={ROUNDS}",
    f"eval_every={ROUNDS}",
    "measure.memory=true",
    "dataset.limit_train=500",
    "dataset.limit_test=2000",
    "method.batch_size=25",
]
BP = [
    "method.client_optimizer.name=adam",
    "method.client_optimizer.lr=0.01",
    "method.client_optimizer.b2=0.99",
]
# the preset's BAFFLE keys, spelled out for ntk-baffle (switching method.name drops the preset's method keys)
BAFFLE = [
    "method.mode=epoch",
    "method.k=100",
    "method.sigma=1e-4",
    "method.scheme=forward",
    "method.estimator=fast",
    "method.local_epochs=1",
    "method.clip=0.3",
    "method.ema=0.995",
    *BP,
]
ROWS = {
    "BP FedAvg full": ["method.name=fedavg", *BP],
    "BP FedPT": ["method.name=fedpt", *BP, FREEZE],
    "BAFFLE full": ["method.freeze=[]"],
    "BAFFLE + freeze": [FREEZE],
    "NTK-BAFFLE + freeze": [
        "method.name=ntk-baffle",
        *BAFFLE,
        "method.density=0.1",
        "method.prune_rounds=10",
        FREEZE,
    ],
}


def _trainable(run: dict[str, Any]) -> tuple[int, int]:
    """(trainable parameters, of them nonzero in the final model). Trainable: not frozen by
    ``method.freeze``. The second count differs only on a pruned model, whose pruned weights stay
    exactly zero (trained kept weights are never exactly zero here)."""
    d = Path(run["run_dir"])
    cfg = load_config(str(d / "config.yaml"))
    opts = cfg.model.model_dump(exclude={"name"})
    model = build_model(cfg.model.name, input_shape=(1, 28, 28), num_classes=10, **opts)
    freeze = getattr(cfg.method, "freeze", None) or []
    frozen = set(resolve_freeze(model, freeze)) if freeze else set()
    final = load_file(str(d / "model.safetensors"))
    names = [n for n, _ in model.named_parameters() if n not in frozen]
    return sum(final[n].numel() for n in names), sum(int((final[n] != 0).sum()) for n in names)


def _read(run: dict[str, Any]) -> dict[str, Any]:
    trainable, nonzero = _trainable(run)
    return {
        "accuracy": run["final_test_accuracy"],
        "trainable_params": trainable,
        "trainable_nonzero": nonzero,
        "client_flops": run["client_flops_per_round"] / _clients(run),
        "bytes_up": run["bytes_up_per_client_round"],
        "bytes_down": run["bytes_down_per_client_round"],
        "tensor_peak": run["client_tensor_peak_bytes"],
    }


def _clients(run: dict[str, Any]) -> int:
    return int(read_run_logs(run["run_dir"])[1][0]["clients"])


def table(rows: dict[str, dict[str, Any]]) -> str:
    bp = rows["BP FedAvg full"]
    head = [
        "row",
        "method.name",
        "trainable params",
        "final accuracy %",
        "vs BP FedAvg (points)",
        "client GFLOP / client / round",
        "uplink B / client / round",
        "downlink B / client / round",
        "client peak, tensors (MiB)",
    ]
    cells = []
    for label, r in rows.items():
        name = next(
            (o.split("=", 1)[1] for o in ROWS[label] if o.startswith("method.name=")), "baffle"
        )
        trainable = f"{r['trainable_params']:,}"
        if r["trainable_nonzero"] != r["trainable_params"]:
            trainable += f" ({r['trainable_nonzero']:,} kept)"
        cells.append(
            [
                label,
                name,
                trainable,
                f"{100 * r['accuracy']:.2f}",
                f"{100 * (r['accuracy'] - bp['accuracy']):+.2f}",
                f"{r['client_flops'] / 1e9:.2f}",
                f"{r['bytes_up']:,.0f}",
                f"{r['bytes_down']:,.0f}",
                mib(r["tensor_peak"], 2),
            ]
        )
    return "\n".join(markdown_table(head, cells, left=2))


def markdown(seeds: int) -> str:
    return (
        "No seed paper has this table: it composes FedPT's freezing (seed 002) with BAFFLE's forward-only "
        "clients (seed 000) and NTK pruning (seed 004). Same data, model, clients, rounds and client "
        "optimizer for every row: BAFFLE's LeNet (`lenet`, 26,730 parameters, GroupNorm without affine "
        "parameters, Hardswish) on Fashion-MNIST, base preset `baffle-fmnist-lenet`; freezing is "
        f"`{FREEZE}` (the largest block, 96% of the parameters, kept at its seeded init; 1,066 parameters "
        "stay trainable). BAFFLE rows are **epoch mode** (clients run local Adam steps on zeroth-order "
        "gradient estimates and upload their model delta), K = 100, twice-FD forward scheme, σ = 1e-4, "
        "EMA 0.995; NTK-BAFFLE first prunes the model on the server to density 0.1 by data-free NTK "
        "scores (10 pruning rounds), so its trainable coordinates are the kept ones outside conv2. "
        f"Reduced to fit a shared 2-core CPU: 500 training samples over 10 IID clients (all per round), "
        f"{ROUNDS} rounds of one local epoch with batches of 25 (2 steps), Adam lr 0.01 (betas 0.9/0.99) for "
        "every row, 2,000 test images, "
        + (f"{seeds} seeds (mean over them)" if seeds > 1 else "one seed (0)")
        + ". FLOPs are torch's flop counter per client per round "
        "(BAFFLE: forwards only); bytes are the measured messages; memory is per client step (tensor "
        "accounting: parameters + live tensors, max over rounds; the runs also log RSS growth of the process "
        "high-water mark, but the rows run one after another in one process, so only the first rows' RSS "
        "grows and it is not a per-row figure). `trainable params` excludes frozen tensors; on the pruned "
        "model, `kept` counts those that survive pruning (the coordinates BAFFLE perturbs and trains)."
    )


def _notes(rows: dict[str, dict[str, Any]]) -> str:
    bp, pt = rows["BP FedAvg full"], rows["BP FedPT"]
    full, frz, ntk = rows["BAFFLE full"], rows["BAFFLE + freeze"], rows["NTK-BAFFLE + freeze"]
    mib = 2**20
    return (
        f"The answer in this budget: BAFFLE + freeze reaches {100 * frz['accuracy']:.1f}% against BP FedAvg's "
        f"{100 * bp['accuracy']:.1f}% and BP FedPT's {100 * pt['accuracy']:.1f}% (BAFFLE full: "
        f"{100 * full['accuracy']:.1f}%), so forward-only clients training {frz['trainable_params']:,} of "
        f"{full['trainable_params']:,} parameters come within {100 * (bp['accuracy'] - frz['accuracy']):.1f} points "
        "of backprop FedAvg — but at a budget (20 local steps in all) where backprop itself is far from "
        "converged, so this table cannot say whether the gap stays small at convergence. Freezing shrinks the "
        f"BAFFLE uplink {full['bytes_up'] / frz['bytes_up']:.0f}× (the delta of the trainable part only; BAFFLE "
        "still sends the whole model down, where FedPT sends the trainable part and a seed) and the client's "
        f"tensor peak from {full['tensor_peak'] / mib:.2f} to {frz['tensor_peak'] / mib:.2f} MiB (below BP "
        f"FedAvg's {bp['tensor_peak'] / mib:.2f}), but not the client's FLOPs: every forward still runs the "
        f"whole network, and the K perturbed forwards cost {frz['client_flops'] / bp['client_flops']:.0f}× BP "
        f"FedAvg's FLOPs here. NTK-BAFFLE + freeze falls to {100 * ntk['accuracy']:.1f}%: pruning to density "
        "0.1 also prunes the frozen conv2, which then stays a 10%-dense random layer, and only "
        f"{ntk['trainable_nonzero']:,} coordinates are left to train; pruning and freezing the same block do "
        "not compose well. One seed: gaps of a point or two are not resolved (the 3-seed std of the FedPT "
        "Table 1 analogue, another setting, is 0.6–1.3 points)."
    )


def read_report(
    records: Path = RECORDS, seeds: range = range(1), *, run: bool = False, out: str = "", extra=()
) -> dict[str, Any]:
    """The table's figures, from the committed records alone (``run=False``, ``--table-only``)
    or running the units not yet recorded into ``out`` first (mean over the seeds); rows whose
    seeds are not all recorded are ``missing``."""
    units = run_units(
        PRESET,
        ROWS,
        seeds=seeds,
        out_root=out or records / ".unused",
        common=[*COMMON, *extra],
        records=records,
        figures=lambda run_dir, row: _read(row),
        run=run,
    )
    rows = {}
    for label, per in units["rows"].items():
        keys = [k for k in per[0] if k not in ("row", "seed")]
        rows[label] = {  # None: not measured (measure.memory=false)
            k: None if any(p[k] is None for p in per) else statistics.mean(p[k] for p in per)
            for k in keys
        }
        rows[label]["cpu_minutes"] = sum(p["row"]["wall_s"] for p in per) / 60
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
        markdown(report["seeds"]),
        report,
        records="benchmarks/results/fedpt_composition/",
        command=COMMAND,
        render=RENDER,
        body=lambda: [table(rows), _notes(rows), wall_minutes(rows)],
    )


def main(argv: list[str] | None = None) -> int:
    ap = records_parser(__doc__, out="runs/bench-fedpt-composition", records=RECORDS, seeds=1)
    args = ap.parse_args(argv)
    return records_main(
        args,
        read=read_report,
        units=len(ROWS) * args.seeds,
        minutes_per_run=MINUTES_PER_RUN,
        section=section,
        name="fedpt-composition",
        title="Composition: freezing with forward-only clients",
        root=Path(__file__).resolve().parents[1],
    )


if __name__ == "__main__":
    raise SystemExit(main())
