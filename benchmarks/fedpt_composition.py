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
(betas 0.9/0.99; BAFFLE's client optimizer, used for every row), 2,000 test images, one seed.

    python benchmarks/fedpt_composition.py [--out runs/bench-fedpt-composition] [--docs docs/benchmarks.md]

Each run directory is reused when complete and resumed when interrupted, so the script resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fedge.bench.docs import update_section
from fedge.bench.variants import run_variants

PRESET = "baffle-fmnist-lenet"
ROUNDS = 10
FREEZE = "method.freeze=[features.conv2]"
COMMON = ["threads=1", f"rounds={ROUNDS}", f"eval_every={ROUNDS}", "measure.memory=true", "dataset.limit_train=500",
          "dataset.limit_test=2000", "method.batch_size=25"]  # fmt: skip
BP = ["method.client_optimizer.name=adam", "method.client_optimizer.lr=0.01", "method.client_optimizer.b2=0.99"]
# the preset's BAFFLE keys, spelled out for ntk-baffle (switching method.name drops the preset's method keys)
BAFFLE = ["method.mode=epoch", "method.k=100", "method.sigma=1e-4", "method.scheme=forward", "method.estimator=fast",
          "method.local_epochs=1", "method.clip=0.3", "method.ema=0.995", *BP]  # fmt: skip
ROWS = {
    "BP FedAvg full": ["method.name=fedavg", *BP],
    "BP FedPT": ["method.name=fedpt", *BP, FREEZE],
    "BAFFLE full": ["method.freeze=[]"],
    "BAFFLE + freeze": [FREEZE],
    "NTK-BAFFLE + freeze": ["method.name=ntk-baffle", *BAFFLE, "method.density=0.1", "method.prune_rounds=10", FREEZE],
}


def _read(run: dict[str, Any]) -> dict[str, Any]:
    d = Path(run["run_dir"])
    summary = json.loads((d / "summary.json").read_text())
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    n = lines[0]["clients"]
    return {
        "accuracy": run["final_test_accuracy"],
        "trainable_params": lines[-1].get("trainable_params", summary["model_params"]),
        "model_params": summary["model_params"],
        "client_flops": run["client_flops_per_round"] / n,
        "bytes_up": run["bytes_up_per_client_round"],
        "bytes_down": run["bytes_down_per_client_round"],
        "tensor_peak": run["client_tensor_peak_bytes"],
        "rss_peak": summary.get("client_peak_bytes"),
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    bp = rows["BP FedAvg full"]
    lines = [
        "| row | method.name | trainable params | final accuracy % | vs BP FedAvg (points) | client GFLOP / client / round "
        "| uplink B / client / round | downlink B / client / round | client peak, tensors (MiB) | client peak RSS growth (MiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in rows.items():
        name = next((o.split("=", 1)[1] for o in ROWS[label] if o.startswith("method.name=")), "baffle")
        rss = "n/a" if r["rss_peak"] is None else f"{r['rss_peak'] / 2**20:.1f}"
        peak = "n/a" if r["tensor_peak"] is None else f"{r['tensor_peak'] / 2**20:.2f}"
        lines.append(
            f"| {label} | {name} | {r['trainable_params']:,} | {100 * r['accuracy']:.2f} "
            f"| {100 * (r['accuracy'] - bp['accuracy']):+.2f} | {r['client_flops'] / 1e9:.2f} | {r['bytes_up']:,.0f} "
            f"| {r['bytes_down']:,.0f} | {peak} | {rss} |"
        )
    return "\n".join(lines)


def markdown(rows: dict[str, dict[str, Any]], command: str) -> str:
    return (
        f"Command: `{command}`\n\n"
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
        "every row, 2,000 test images, one seed (0). FLOPs are torch's flop counter per client per round "
        "(BAFFLE: forwards only); bytes are the measured messages; memory is per client step (tensor "
        "accounting, max over rounds; RSS growth of the process high-water mark, max over rounds).\n\n"
        + table(rows)
        + "\n\n"
        + _notes(rows)
    )


def _notes(rows: dict[str, dict[str, Any]]) -> str:
    bp, pt = rows["BP FedAvg full"], rows["BP FedPT"]
    full, frz, ntk = rows["BAFFLE full"], rows["BAFFLE + freeze"], rows["NTK-BAFFLE + freeze"]
    return (
        f"The answer in this budget: BAFFLE + freeze reaches {100 * frz['accuracy']:.1f}% against BP FedAvg's "
        f"{100 * bp['accuracy']:.1f}% and BP FedPT's {100 * pt['accuracy']:.1f}% (BAFFLE full: "
        f"{100 * full['accuracy']:.1f}%; NTK-BAFFLE + freeze: {100 * ntk['accuracy']:.1f}%). Freezing shrinks the "
        f"uplink {full['bytes_up'] / frz['bytes_up']:.0f}× (the delta of the trainable part only) but not the "
        "BAFFLE client's FLOPs: every forward still runs the whole network, and the K perturbed forwards are "
        f"the cost ({frz['client_flops'] / bp['client_flops']:.0f}× BP FedAvg's FLOPs here). One seed and "
        "10 rounds: differences of a point or two are within run-to-run noise."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench-fedpt-composition")
    ap.add_argument("--docs", default=None)
    args = ap.parse_args(argv)
    runs = run_variants(PRESET, ROWS, out_root=args.out, common=COMMON)
    rows = {r["label"]: _read(r) for r in runs["results"]}
    print(json.dumps(rows, indent=2))
    print(table(rows))
    if args.docs:
        command = "python benchmarks/fedpt_composition.py " + " ".join(sys.argv[1:] if argv is None else argv)
        update_section(args.docs, "fedpt-composition", "Composition: freezing with forward-only clients", markdown(rows, command.strip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
