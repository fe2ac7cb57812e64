"""NTK-BAFFLE Table 3 analogue (seed 004): Fashion-MNIST, LeNet-5, Dirichlet alpha = 0.1,
100 clients, 10 per round, 90% sparsity, K in {50, 100, 200}: NTK-BAFFLE vs vanilla BAFFLE vs
magnitude- and random-pruned BAFFLE at the same density, plus BP FedAvg. Also NTK-Rand vs
NTK-Ori at 80% sparsity (the paper's Figure 1) and accuracy-vs-client-FLOPs plots (Figures 3, 5).

Reduced to fit a 2-core CPU: 5000 training samples (at least 3 per client), batches of 32,
batch-level BAFFLE with BAFFLE's server Adam (the paper: CIFAR-10, full data, 3000 rounds, SGD
with momentum). Also: a learning-rate screen under the paper's SGD with momentum, and the
quality of one gradient estimate (cosine with the backprop gradient) for dense and pruned
models, which is the mechanism the paper's claim rests on (error O(sqrt(n/K))).

    python benchmarks/ntk_table3.py [--out runs/bench-ntk-table3] [--docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from fedge.bench.docs import update_section
from fedge.bench.variants import run_variants, variants_markdown

KS = (50, 100, 200)
ROUNDS, LONG_ROUNDS = 150, 300
# Batch-level (one server Adam step per round on the 10 clients' combined estimate): the
# cheapest setting in which zeroth-order training moves within a CPU budget of rounds. The K = 100
# comparison (dense, NTK, magnitude, random) runs twice as long.
COMMON = ["threads=1", f"rounds={ROUNDS}", "eval_every=10"]
LONG = [f"rounds={LONG_ROUNDS}"]
BATCH = ["method.mode=batch"]
# The paper's optimizer (SGD, momentum 0.9), screened over learning rates at K = 100.
SGD_LRS = (0.003, 0.01, 0.03, 0.1, 0.3)
SGD_COMMON = ["method.mode=batch", "threads=1", "rounds=80", "eval_every=10", "measure.flops=false", "method.k=100",
              "method.server_optimizer.name=sgd", "method.server_optimizer.momentum=0.9"]
# Then the best learning rate of the screen (0.03 for both), trained as long as the Adam table.
SGD_LR = 0.03
SGD_MAIN: dict[str, list[str]] = {
    f"SGD BP FedSGD (dense) lr={SGD_LR}": ["method.name=fedsgd", "method.batch_size=32", f"method.server_optimizer.lr={SGD_LR}"],
}
for k in KS:
    SGD_MAIN[f"SGD BAFFLE (dense) K={k} lr={SGD_LR}"] = ["method.name=baffle", *BATCH, "method.batch_size=32", f"method.k={k}",
                                                        f"method.server_optimizer.lr={SGD_LR}"]  # fmt: skip
    SGD_MAIN[f"SGD NTK-BAFFLE K={k} lr={SGD_LR}"] = [*BATCH, f"method.k={k}", f"method.server_optimizer.lr={SGD_LR}"]
for score in ("magnitude", "random"):
    SGD_MAIN[f"SGD {score}-pruned K=100 lr={SGD_LR}"] = [*BATCH, "method.k=100", f"method.prune_score={score}",
                                                        f"method.server_optimizer.lr={SGD_LR}"]  # fmt: skip
SGD_MAIN_COMMON = ["threads=1", f"rounds={LONG_ROUNDS}", "eval_every=10", "method.server_optimizer.name=sgd",
                   "method.server_optimizer.momentum=0.9"]
SGD_GRID: dict[str, list[str]] = {}
for lr in SGD_LRS:
    SGD_GRID[f"dense lr={lr}"] = ["method.name=baffle", "method.batch_size=32", f"method.server_optimizer.lr={lr}"]
    SGD_GRID[f"NTK lr={lr}"] = [f"method.server_optimizer.lr={lr}"]
VARIANTS: dict[str, list[str]] = {
    "BP FedSGD (dense)": ["method.name=fedsgd", "method.batch_size=32", "method.server_optimizer.name=adam",
                          "method.server_optimizer.lr=0.01", "method.server_optimizer.b2=0.99"],
}
for k in KS:
    longer = LONG if k == 100 else []
    VARIANTS[f"BAFFLE (dense) K={k}"] = ["method.name=baffle", "method.mode=batch", "method.batch_size=32", f"method.k={k}",
                                         *longer]  # fmt: skip
    VARIANTS[f"NTK-BAFFLE K={k}"] = [*BATCH, f"method.k={k}", *longer]
VARIANTS["magnitude-pruned K=100"] = [*BATCH, "method.k=100", "method.prune_score=magnitude", *LONG]
VARIANTS["random-pruned K=100"] = [*BATCH, "method.k=100", "method.prune_score=random", *LONG]
RAND_ORI = {
    "NTK-Rand d=0.2 K=100": [*BATCH, "method.density=0.2"],
    "NTK-Ori d=0.2 K=100": [*BATCH, "method.density=0.2", "method.prune_data=client", "method.prune_inputs=32", "method.prune_rounds=10"],
}
INTRO = f"""NTK-BAFFLE Table 3 analogue: Fashion-MNIST, LeNet-5 (Hardswish), Dirichlet alpha = 0.1 over 100
clients, 10 per round, **batch-level** BAFFLE (twice-FD, sigma 1e-4, EMA; each sampled client evaluates K
loss differences on a batch of 32 and the server takes one optimizer step per round on their weighted
combination), NTK-BAFFLE pruning to 10% density (90% sparsity) with 50 data-free NTK pruning rounds on the
server (kept weights rescaled by 1/sqrt(layer density), `method.rescale`, see methods/ntk_baffle.py), against
dense BAFFLE, magnitude- and random-pruned BAFFLE at the same density (K = 100) and backprop FedSGD.
**Reduced to fit a 2-core CPU**: 5000 training samples, 2000 test samples, {LONG_ROUNDS} rounds (the
paper: CIFAR-10, epoch-level with 1 local epoch, 3000 rounds). Executed FLOPs run dense kernels; effective
FLOPs count only multiplications by kept weights. Client peak memory: the sparse rows of `fedge bench
memory` (masks included). Paper (CIFAR-10, LeNet-5): NTK-BAFFLE beats vanilla BAFFLE by 3.8 to 6.35 points
(best accuracy).

**With the paper's optimizer** (SGD, momentum 0.9, on the server; learning rate {SGD_LR} for every row,
the best of the screen below for both dense and NTK-pruned BAFFLE):"""

ADAM_INTRO = f"""**With BAFFLE's optimizer** instead (Adam, lr 0.01, betas 0.9/0.99, on the server): {ROUNDS} rounds,
{LONG_ROUNDS} for the K = 100 comparison (`rounds=` in the overrides)."""


def estimate_quality(ks: tuple[int, ...] = KS, seeds: int = 5, batch: int = 320) -> dict[str, Any]:
    """Cosine between one zeroth-order estimate and the backprop gradient, dense vs pruned.

    The preset's initial LeNet-5 (the first round's model), its NTK / magnitude / random masks at
    density 0.1 built exactly as the method builds them (kept weights rescaled), one batch of
    ``batch`` training samples (10 clients x 32, what one batch-level round sees), forward
    scheme, sigma 1e-4, ``seeds`` perturbation seeds. ``cos_kept`` compares with the gradient
    restricted to the kept coordinates (what the estimator targets: about sqrt(K/n) for n
    trainable coordinates); ``cos_full`` with the whole gradient of the dense-initialised pruned
    model, i.e. how well the update descends; ``kept_energy`` is ||g_kept||^2 / ||g||^2.
    """
    import torch
    import torch.nn.functional as F

    from fedge.core.config import load_config
    from fedge.estimators import estimate_gradient, loss_differences
    from fedge.experiment.build import build_run
    from fedge.methods.ntk_baffle import data_free_masks
    from fedge.pruning import apply_masks_, rescale_

    torch.set_num_threads(1)
    built = build_run(load_config("ntk-baffle-fmnist-lenet", overrides=["threads=1", "method.mode=batch"]))
    cfg, data = built.method_config, built.dataset
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(len(data.y_train), generator=g)[:batch]
    x, y = data.x_train[idx], data.y_train[idx]
    rows, layers = [], {}
    for label, score in (("dense", None), ("NTK", "ntk"), ("magnitude", "magnitude"), ("random", "random")):
        model = built.model_fn()
        masks = None
        if score is not None:
            masks = data_free_masks(cfg.model_copy(update={"prune_score": score}), built.model_fn(),
                                    seed=built.config.seed, input_shape=tuple(data.input_shape))  # fmt: skip
            model = rescale_(apply_masks_(model, masks), masks)
            layers[label] = {name: float(m.float().mean()) for name, m in masks.items()}
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        grads = dict(zip(params, torch.autograd.grad(F.cross_entropy(model(x), y), list(params.values())), strict=True))
        kept = {n: gr * masks[n] if masks and n in masks else gr for n, gr in grads.items()}
        full = torch.cat([gr.flatten() for gr in grads.values()])
        target = torch.cat([gr.flatten() for gr in kept.values()])
        n = int(sum((masks[k].sum() if masks and k in masks else p.numel()) for k, p in params.items()))
        for k in ks:
            cos_kept, cos_full = [], []
            for seed in range(seeds):
                diffs = loss_differences(model, F.cross_entropy, (x, y), k=k, sigma=1e-4, seed=seed, scheme="forward",
                                         masks=masks)  # fmt: skip
                est = estimate_gradient(params, diffs, sigma=1e-4, seed=seed, scheme="forward", masks=masks)
                e = torch.cat([est[name].flatten() for name in params])
                cos_kept.append(float(F.cosine_similarity(e, target, dim=0)))
                cos_full.append(float(F.cosine_similarity(e, full, dim=0)))
            rows.append({"model": label, "k": k, "trainable": n, "cos_kept": sum(cos_kept) / seeds,
                         "cos_full": sum(cos_full) / seeds, "sqrt_k_over_n": (k / n) ** 0.5,
                         "kept_energy": float(target.square().sum() / full.square().sum())})  # fmt: skip
    return {"batch": batch, "seeds": seeds, "scheme": "forward", "sigma": 1e-4, "results": rows,
            "layer_density": layers}  # fmt: skip


def quality_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Quality of one gradient estimate at the first round (batch of {report['batch']} training samples, "
        f"{report['scheme']} scheme, sigma {report['sigma']}, mean over {report['seeds']} seeds; see "
        "`estimate_quality` in the script): cosine with the backprop gradient on the kept coordinates "
        "(the estimator's target, about sqrt(K/n)) and with the whole gradient (how well the step descends).",
        "",
        "| model (density) | trainable n | K | cos, kept coords | sqrt(K/n) | cos, whole gradient | kept gradient energy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(f"| {r['model']} | {r['trainable']} | {r['k']} | {r['cos_kept']:.3f} | {r['sqrt_k_over_n']:.3f} "
                     f"| {r['cos_full']:.3f} | {r['kept_energy']:.3f} |")  # fmt: skip
    dens = report.get("layer_density") or {}
    if dens:
        scores = list(dens)
        lines += ["", "Kept fraction per pruned tensor (one global threshold; overall density 0.1):", "",
                  "| tensor | " + " | ".join(scores) + " |", "|---|" + "---|" * len(scores)]  # fmt: skip
        for name in dens[scores[0]]:
            lines.append(f"| {name} | " + " | ".join(f"{dens[sc][name]:.3f}" for sc in scores) + " |")
    return "\n".join(lines)


def _best(report: dict[str, Any], prefix: str) -> str:
    rows = [r for r in report["results"] if r["label"].startswith(prefix)]
    if not rows:
        return "n/a"
    top = max(rows, key=lambda r: r["best_test_accuracy"])
    return f"{top['label']} ({top['best_test_accuracy']:.4f})"


def _verdict(report: dict[str, Any], prefix: str = "", suffix: str = "") -> str:
    """One line per K: NTK-BAFFLE's best accuracy against dense BAFFLE's (the issue's target)."""
    best = {r["label"]: r["best_test_accuracy"] for r in report["results"]}
    out = []
    for k in KS:
        ntk = best.get(f"{prefix}NTK-BAFFLE K={k}{suffix}")
        dense = best.get(f"{prefix}BAFFLE (dense) K={k}{suffix}")
        if ntk is None or dense is None:
            out.append(f"K={k}: not complete")
        else:
            out.append(f"K={k}: NTK {ntk:.4f} vs dense {dense:.4f} ({100 * (ntk - dense):+.2f} points, "
                       f"{'NTK above' if ntk > dense else 'NTK NOT above'})")  # fmt: skip
    return "; ".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench-ntk-table3")
    ap.add_argument("--docs", default=None)
    ap.add_argument("--figures", default="docs/figures/ntk-table3", help="where to write comparison plots")
    ap.add_argument("--no-run", action="store_true", help="only tabulate the variants already complete")
    args = ap.parse_args(argv)
    run = not args.no_run
    report = run_variants("ntk-baffle-fmnist-lenet", VARIANTS, out_root=args.out, common=COMMON, run=run)
    rand_ori = run_variants("ntk-baffle-fmnist-lenet", RAND_ORI, out_root=args.out, common=COMMON, run=run)
    sgd = run_variants("ntk-baffle-fmnist-lenet", SGD_GRID, out_root=Path(args.out) / "sgd-grid", common=SGD_COMMON,
                       run=run)  # fmt: skip
    sgd_main = run_variants("ntk-baffle-fmnist-lenet", SGD_MAIN, out_root=Path(args.out) / "sgd", common=SGD_MAIN_COMMON,
                            run=run)  # fmt: skip
    quality_file = Path(args.out) / "estimate_quality.json"
    if quality_file.exists():
        quality = json.loads(quality_file.read_text())
    else:
        quality = estimate_quality()
        quality_file.parent.mkdir(parents=True, exist_ok=True)
        quality_file.write_text(json.dumps(quality, indent=2))
    print(json.dumps({"table3": report, "rand_vs_ori": rand_ori, "sgd_grid": sgd, "sgd": sgd_main, "estimate_quality": quality,
                      "verdict_adam": _verdict(report), "verdict_sgd": _verdict(sgd_main, "SGD ", f" lr={SGD_LR}")},
                     indent=2))  # fmt: skip
    from fedge.report import compare_runs

    figures = Path(args.figures)
    for k in KS:
        runs = [r["run_dir"] for r in report["results"] if r["label"].endswith(f"K={k}") or r["label"].startswith("BP")]
        if len(runs) > 1:
            compare_runs(runs, figures / f"K{k}")
    for k in KS:
        runs = [r["run_dir"] for r in sgd_main["results"] if f" K={k} " in r["label"] or "BP" in r["label"]]
        if len(runs) > 1:
            compare_runs(runs, figures / f"sgd-K{k}")
    if args.docs:
        command = "python benchmarks/ntk_table3.py " + " ".join(a for a in sys.argv[1:] if a != "--no-run")
        docs_dir = Path(args.docs).parent
        sgd_suffix = f" lr={SGD_LR}"
        body = variants_markdown(sgd_main, command, INTRO)
        body += f"\n\nBest accuracy, NTK-BAFFLE vs dense BAFFLE (SGD): {_verdict(sgd_main, 'SGD ', sgd_suffix)}."
        body += "\n\n" + ADAM_INTRO + "\n\n"
        body += "\n".join(variants_markdown(report, command, "").splitlines()[5:])
        body += f"\n\nBest accuracy, NTK-BAFFLE vs dense BAFFLE (Adam): {_verdict(report)}."
        for name, title in (("accuracy_vs_flops.png", "executed"), ("accuracy_vs_effective_flops.png", "effective")):
            links = [f"[{opt} K={k}]({os.path.relpath(figures / sub / name, docs_dir)})"
                     for opt, sub, k in [("SGD", f"sgd-K{k}", k) for k in KS] + [("Adam", f"K{k}", k) for k in KS]
                     if (figures / sub / name).exists()]  # fmt: skip
            if links:
                body += f"\n\nAccuracy vs cumulative client FLOPs, {title} (paper Figures 3, 5): " + ", ".join(links)
        body += "\n\n" + quality_markdown(quality)
        body += (
            "\n\nLearning-rate screen for the SGD table (K = 100, 80 rounds, FLOP counting off; best: dense "
            f"{_best(sgd, 'dense')}, NTK {_best(sgd, 'NTK')}):\n\n"
        )
        body += "\n".join(variants_markdown(sgd, command, "").splitlines()[5:])
        body += "\n\nNTK-Rand vs NTK-Ori at 80% sparsity (density 0.2), K = 100, Adam, 150 rounds (paper Figure 1: "
        body += "Rand is better):\n\n" + "\n".join(variants_markdown(rand_ori, command, "").splitlines()[5:])
        update_section(args.docs, "ntk-table3", "NTK-BAFFLE Table 3 analogue", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
