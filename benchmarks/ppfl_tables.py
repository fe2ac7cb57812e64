"""PPFL tables (seed 001, Table 3, Table 5, and the per-stage enclave memory of Algorithm 1), reduced.

Reductions (the paper: 100 clients, 10 per round, FedAvg 150 rounds as the target, LeNet,
AlexNet and VGG9 on Fashion-MNIST/CIFAR-10): LeNet-PPFL only (C20-MP-C50-MP-FC500-FC10),
Fashion-MNIST with 2000 training images over 20 clients (100 each), 5 per round, 1000 test
images, one seed; end-to-end FedAvg runs FEDAVG_ROUNDS rounds and its final accuracy is the
target; each PPFL stage runs until it reaches the target or for at most CAP rounds. IID, and
non-IID with two label shards per client (as the paper). Every run is a real `fedge` run
directory under OUT; finished runs are skipped (resumable). Prints a markdown section.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/ppfl_tables.py [OUT]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from fedge.core.config import load_config
from fedge.experiment.run import run_experiment

FEDAVG_ROUNDS = 15
CAP = 10
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/ppfl-bench")
PARTS = {"iid": {"name": "iid"}, "noniid": {"name": "shards", "shards_per_client": 2}}
SGD = {"batch_size": 16, "local_epochs": 1}


def base(part: str) -> dict:
    return {"seed": 0, "clients": {"num": 20, "per_round": 5}, "partition": PARTS[part],
            "dataset": {"name": "fashion-mnist", "limit_train": 2000, "limit_test": 1000},
            "model": {"name": "lenet-ppfl"}, "measure": {"memory": True}}  # fmt: skip


def fedavg(part: str) -> dict:
    return {**base(part), "rounds": FEDAVG_ROUNDS,
            "method": {"name": "fedavg", **SGD, "client_optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}}}  # fmt: skip


def ppfl(part: str, target: float, block: int) -> dict:
    stages = 3 if block == 1 else 2
    return {**base(part), "rounds": CAP * stages,
            "method": {"name": "ppfl", **SGD, "lr": 0.05, "momentum": 0.9, "block_layers": block,
                       "rounds_per_stage": CAP, "target_accuracy": target}}  # fmt: skip


def run(name: str, cfg: dict) -> list[dict]:
    d = OUT / name
    if not (d / "summary.json").exists():
        if d.exists():
            shutil.rmtree(d)
        run_experiment(load_config(cfg), out=d, render=False)
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


def total_bytes(lines: list[dict]) -> int:
    return sum(ln["bytes_up"] + ln["bytes_down"] for ln in lines)


def reach(lines: list[dict], target: float) -> tuple[int | None, int]:
    """Rounds and server↔client bytes until the final stage first reaches ``target``."""
    last = max(ln.get("stage", 0) for ln in lines)
    for i, ln in enumerate(lines):
        if ln.get("stage", 0) == last and ln["test_accuracy"] >= target:
            return i + 1, total_bytes(lines[: i + 1])
    return None, total_bytes(lines)


PUBLIC = 5000


def pretrain_public() -> Path:
    """Transfer (Sec. 6.4): LeNet-PPFL trained centrally on PUBLIC Fashion-MNIST training images
    disjoint from the 2000 private ones the clients hold (the complement of the same seeded,
    stratified subset), 2 epochs of SGD (lr 0.05, momentum 0.9, batch 64). Normalized with the
    full training set's statistics (the private runs use their own 2000 images'; they agree to
    ~1e-3)."""
    path = OUT / "public-pretrained.safetensors"
    if path.exists():
        return path
    import numpy as np
    from safetensors.torch import save_file

    from fedge.core.rng import generator, numpy_rng
    from fedge.data.dataset import stratified_subset
    from fedge.data.registry import load_dataset
    from fedge.models import build_model

    full = load_dataset("fashion-mnist")
    private = stratified_subset(full.y_train.numpy(), 2000, numpy_rng(0, "data", "fashion-mnist", "train"))
    rest = np.setdiff1d(np.arange(len(full.y_train)), private)
    public = torch.from_numpy(np.sort(numpy_rng(0, "public").choice(rest, PUBLIC, replace=False)))
    assert not set(public.tolist()) & set(private.tolist())
    x, y = full.x_train[public], full.y_train[public]
    model = build_model("lenet-ppfl", input_shape=full.input_shape, num_classes=10, seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = generator(0, "public-pretrain")
    for _ in range(2):
        order = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), 64):
            idx = order[i : i + 64]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"### Table 3 analogue: rounds and bytes to end-to-end FedAvg's accuracy ({FEDAVG_ROUNDS} rounds)\n")
    print("| data | FedAvg target | FedAvg bytes | PPFL block | rounds to target (cap) | PPFL bytes | bytes ratio | best PPFL acc | rounds per stage |")
    print("|---|---|---|---|---|---|---|---|---|")
    mem: dict[str, list[dict]] = {}
    for part in PARTS:
        fa = run(f"fedavg-{part}", fedavg(part))
        target = fa[-1]["test_accuracy"]
        for block in (1, 2):
            lines = run(f"ppfl-{part}-b{block}", ppfl(part, target, block))
            mem[f"{part}-b{block}"] = lines
            r, b = reach(lines, target)
            per = [sum(1 for ln in lines if ln["stage"] == s) for s in range(max(ln["stage"] for ln in lines) + 1)]
            best = max(ln["test_accuracy"] for ln in lines)
            rr = f"{r} ({len(lines)})" if r else f"not reached ({len(lines)})"
            print(f"| {part} | {target:.3f} | {total_bytes(fa) / 1e6:.1f} MB | {block} | {rr} | {b / 1e6:.1f} MB | "
                  f"{b / total_bytes(fa):.2f} | {best:.3f} | {per} |")
    print("\n### Table 4 analogue: time per phase in one round (IID, mean over the rounds of each stage; 5 clients summed)\n")
    print("| run | stage | client REE (frozen fwd, batching) s | client enclave s | of which sealing s | server enclave s (broadcast seal, open, FedAvg) | round wall s |")
    print("|---|---|---|---|---|---|---|")
    fa = run("fedavg-iid", fedavg("iid"))
    print(f"| FedAvg E2E | — | {sum(x['client_wall_s'] for x in fa) / len(fa):.3f} (all training) | — | — | — | "
          f"{sum(x['wall_s'] for x in fa) / len(fa):.3f} |")
    for key in ("iid-b1", "iid-b2"):
        lines = mem[key]
        for st in sorted({ln["stage"] for ln in lines}):
            ls = [ln for ln in lines if ln["stage"] == st]
            avg = lambda k, ls=ls: sum(x[k] for x in ls) / len(ls)  # noqa: E731
            print(f"| PPFL {key} | {st} | {avg('client_ree_s'):.3f} | {avg('client_tee_s'):.3f} | {avg('seal_s'):.4f} | "
                  f"{avg('wall_s.server_tee'):.3f} | {avg('wall_s'):.3f} |")
    pre = pretrain_public()
    print(f"\n### Transfer (Sec. 6.4): conv1 pretrained on {PUBLIC} public images, frozen; IID private data\n")
    print("| run | stages trained | rounds | final acc | best acc | bytes |\n|---|---|---|---|---|---|")
    scratch = mem["iid-b1"]
    tr = run("ppfl-iid-transfer", {**ppfl("iid", 1.01, 1), "rounds": 2 * CAP,
                                   "method": {**ppfl("iid", 1.01, 1)["method"], "target_accuracy": None,
                                              "init_from": str(pre), "freeze_from_init": 1}})  # fmt: skip
    for name, lines in (("from scratch (1-layer, target schedule)", scratch), ("transfer: conv1 frozen from public", tr)):
        print(f"| {name} | {sorted({ln['stage'] for ln in lines})} | {len(lines)} | {lines[-1]['test_accuracy']:.3f} | "
              f"{max(ln['test_accuracy'] for ln in lines):.3f} | {total_bytes(lines) / 1e6:.1f} MB |")
    print("\n### Per-stage enclave memory (IID, 1-layer and 2-layer blocks; client budget 16 MiB)\n")
    print("| run | stage | S_l at batch 16 (predicted) | enclave peak (measured) | budget | eligible clients | client→tee bytes per round | sealing s per round |")
    print("|---|---|---|---|---|---|---|---|")
    for key in ("iid-b1", "iid-b2"):
        lines = mem[key]
        for s in sorted({ln["stage"] for ln in lines}):
            ls = [ln for ln in lines if ln["stage"] == s]
            ln = ls[0]
            print(f"| {key} | {s} | {ln['tee_need_bytes'] / 2**20:.2f} MiB | {max(x['tee_peak_bytes'] for x in ls) / 2**20:.2f} MiB | "
                  f"16 MiB | {ln['eligible_clients']} / 20 | {sum(x['bytes.client->tee'] for x in ls) / len(ls) / 1e6:.2f} MB | "
                  f"{sum(x['seal_s'] for x in ls) / len(ls):.4f} |")


if __name__ == "__main__":
    main()
