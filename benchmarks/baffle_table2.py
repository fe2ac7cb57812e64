"""BAFFLE Table 2 analogue (seed 000): label non-IID, Dirichlet alpha = 0.3, C = 100.

Fashion-MNIST, BAFFLE's LeNet, epoch-level BAFFLE at K in {100, 200} and the backprop FedAvg
baseline with the same data, rounds and client optimizer. Reduced to fit a 2-core CPU:
2000 training samples over 100 clients (min 5 each), 10 clients per round, batches of 20,
30 rounds (the paper: CIFAR-10/100, full data, 40 rounds, all 100 clients).

    python benchmarks/baffle_table2.py [--out runs/bench-baffle-table2] [--docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import sys

from fedge.bench.docs import update_section
from fedge.bench.variants import run_variants, variants_markdown

COMMON = [
    "threads=1", "rounds=30", "clients.num=100", "clients.per_round=10", "dataset.limit_train=2000",
    "partition.name=dirichlet", "partition.alpha=0.3", "partition.min_size=5",
]  # fmt: skip
VARIANTS = {
    "BP FedAvg (baseline)": ["method.name=fedavg", "method.batch_size=20", "method.client_optimizer.name=adam",
                             "method.client_optimizer.lr=0.01", "method.client_optimizer.b2=0.99"],
    "BAFFLE K=100": ["method.k=100"],
    "BAFFLE K=200": ["method.k=200"],
}
INTRO = """BAFFLE Table 2 analogue (label non-IID): Fashion-MNIST, BAFFLE's LeNet, Dirichlet alpha = 0.3
over C = 100 clients, 10 sampled per round, epoch-level BAFFLE (twice-FD, sigma 1e-4, EMA) vs
backprop FedAvg with the same client optimizer. **Reduced to fit a 2-core CPU**: 2000 training
samples (min 5 per client), batches of 20, 30 rounds, 2000 test samples. Paper (CIFAR-10,
40 rounds): label skew costs BAFFLE about 14 points against its IID accuracy."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench-baffle-table2")
    ap.add_argument("--docs", default=None)
    args = ap.parse_args(argv)
    report = run_variants("baffle-fmnist-lenet", VARIANTS, out_root=args.out, common=COMMON)
    print(json.dumps(report, indent=2))
    if args.docs:
        command = "python benchmarks/baffle_table2.py " + " ".join(sys.argv[1:])
        update_section(args.docs, "baffle-table2", "BAFFLE Table 2 analogue", variants_markdown(report, command, INTRO))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
