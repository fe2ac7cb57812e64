"""NTK-BAFFLE Table 3 analogue (seed 004): Fashion-MNIST, LeNet-5, Dirichlet alpha = 0.1,
100 clients, 10 per round, 90% sparsity, K in {50, 100, 200}: NTK-BAFFLE vs vanilla BAFFLE vs
magnitude- and random-pruned BAFFLE at the same density, plus BP FedAvg. Also NTK-Rand vs
NTK-Ori at 80% sparsity (the paper's Figure 1) and accuracy-vs-client-FLOPs plots (Figures 3, 5).

Reduced to fit a 2-core CPU: 5000 training samples (at least 3 per client), batches of 32,
40 rounds, Adam on clients (the paper: CIFAR-10, full data, 3000 rounds, SGD with momentum).

    python benchmarks/ntk_table3.py [--out runs/bench-ntk-table3] [--docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fedge.bench.docs import update_section
from fedge.bench.variants import run_variants, variants_markdown

KS = (50, 100, 200)
# Batch-level (one server Adam step per round on the 10 clients' combined estimate): the
# cheapest setting in which zeroth-order training moves within a CPU budget of rounds.
COMMON = ["threads=1", "rounds=150", "eval_every=10"]
BATCH = ["method.mode=batch"]
VARIANTS: dict[str, list[str]] = {
    "BP FedSGD (dense)": ["method.name=fedsgd", "method.batch_size=32", "method.server_optimizer.name=adam",
                          "method.server_optimizer.lr=0.01", "method.server_optimizer.b2=0.99"],
}
for k in KS:
    VARIANTS[f"BAFFLE (dense) K={k}"] = ["method.name=baffle", "method.mode=batch", "method.batch_size=32", f"method.k={k}"]
    VARIANTS[f"NTK-BAFFLE K={k}"] = [*BATCH, f"method.k={k}"]
VARIANTS["magnitude-pruned K=100"] = [*BATCH, "method.k=100", "method.prune_score=magnitude"]
VARIANTS["random-pruned K=100"] = [*BATCH, "method.k=100", "method.prune_score=random"]
RAND_ORI = {
    "NTK-Rand d=0.2 K=100": [*BATCH, "method.density=0.2"],
    "NTK-Ori d=0.2 K=100": [*BATCH, "method.density=0.2", "method.prune_data=client", "method.prune_inputs=32", "method.prune_rounds=10"],
}
INTRO = """NTK-BAFFLE Table 3 analogue: Fashion-MNIST, LeNet-5 (Hardswish), Dirichlet alpha = 0.1 over 100
clients, 10 per round, **batch-level** BAFFLE (twice-FD, sigma 1e-4, EMA; each client evaluates K loss
differences on a batch of 32, the server takes one Adam step, lr 0.01, betas 0.9/0.99, per round),
pruning to 10% density (90% sparsity) with 50 data-free NTK pruning rounds on the server (kept
weights rescaled by 1/sqrt(layer density), `method.rescale`, see methods/ntk_baffle.py), against
dense BAFFLE, magnitude- and random-pruned BAFFLE at the same density (K = 100), and backprop FedSGD
with the same server optimizer. **Reduced to fit a 2-core CPU**: 5000 training samples, 150 rounds,
2000 test samples (the paper: CIFAR-10, epoch-level with 1 local epoch, 3000 rounds). Client GFLOP/round
counts executed (dense-kernel) FLOPs; the run directories' metrics also log the effective non-zero
FLOPs. Paper (CIFAR-10, LeNet-5): NTK-BAFFLE beats vanilla BAFFLE by 3.8 to 6.35 points (best accuracy)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench-ntk-table3")
    ap.add_argument("--docs", default=None)
    ap.add_argument("--figures", default="docs/figures/ntk-table3", help="where to write comparison plots")
    ap.add_argument("--no-run", action="store_true", help="only tabulate the variants already complete")
    args = ap.parse_args(argv)
    common = COMMON
    report = run_variants("ntk-baffle-fmnist-lenet", VARIANTS, out_root=args.out, common=common, run=not args.no_run)
    rand_ori = run_variants("ntk-baffle-fmnist-lenet", RAND_ORI, out_root=args.out, common=common, run=not args.no_run)
    print(json.dumps({"table3": report, "rand_vs_ori": rand_ori}, indent=2))
    from fedge.report import compare_runs

    figures = Path(args.figures)
    for k in KS:
        runs = [r["run_dir"] for r in report["results"] if r["label"].endswith(f"K={k}") or r["label"].startswith("BP")]
        if len(runs) > 1:
            compare_runs(runs, figures / f"K{k}")
    if args.docs:
        command = "python benchmarks/ntk_table3.py " + " ".join(a for a in sys.argv[1:] if a != "--no-run")
        body = variants_markdown(report, command, INTRO)
        body += "\n\nNTK-Rand vs NTK-Ori at 80% sparsity (density 0.2), K = 100 (paper Figure 1: Rand is better):\n\n"
        body += "\n".join(variants_markdown(rand_ori, command, "").splitlines()[5:])
        body += "\n\nAccuracy vs cumulative client FLOPs (paper Figures 3, 5): "
        plots = {k: figures / f"K{k}" / "accuracy_vs_flops.png" for k in KS}
        body += ", ".join(
            f"[K={k}]({os.path.relpath(p, Path(args.docs).parent)})" for k, p in plots.items() if p.exists()
        )
        update_section(args.docs, "ntk-table3", "NTK-BAFFLE Table 3 analogue", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
