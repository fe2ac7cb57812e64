"""PPFL tables (seed 001: Tables 3, 4 and 5, transfer, and the per-stage enclave memory of
Algorithm 1), reduced to fit a shared 2-core CPU machine. Writes the ``ppfl`` section of
docs/benchmarks.md (``--docs``) or prints it.

Protocols (the paper: 100 clients, 10 per round, end-to-end FedAvg's accuracy after 150 rounds
as the target; LeNet, AlexNet and VGG9 on Fashion-MNIST):

* **LeNet** (PPFL's C20-MP-C50-MP-FC500-FC10): 2000 training images over 20 clients (100
  each), 5 per round, 1000 test images, batch 16; FedAvg runs ``LENET_ROUNDS`` rounds and its
  final accuracy is the target; each PPFL stage runs until it reaches the target or for at most
  ``LENET_CAP`` rounds. Seeds ``SEEDS`` (each seed its own data subset, partition, init and
  target); 1-layer and 2-layer blocks (Table 5).
* **AlexNet-PPFL** (C128x3-AP16-FC10): the paper's 100 clients, 10 per round, but 3000 training
  images (30 per client), 500 test images, batch 8 (4 local steps a round), FedAvg
  ``LARGE_ROUNDS`` rounds, PPFL cap ``LARGE_CAP`` rounds per stage, one seed; client enclaves
  of 32 MiB so that PPFL trains with FedAvg's batch (its S_l exceeds 16 MiB at batch 8).
* IID, and non-IID with two label shards per client (as the paper). SGD lr 0.05, momentum 0.9,
  E = 1 for both methods.

Every run is a real ``fedge`` run directory under OUT; finished runs are skipped (resumable).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/ppfl_tables.py [--out runs/ppfl-bench] [--docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import textwrap
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedge.core.config import load_config
from fedge.core.messages import Message
from fedge.core.protocols import Exchange, PartyCall, Round, StrategyWrapper
from fedge.experiment.build import build_run
from fedge.experiment.run import run_experiment

COMMAND = (
    "OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/ppfl_tables.py --docs docs/benchmarks.md"
)
SEEDS = (0, 1, 2)
LENET_ROUNDS, LENET_CAP = 15, 10
LARGE_ROUNDS, LARGE_CAP = 15, 6
LARGE = ("alexnet-ppfl",)  # VGG9 did not fit the compute budget (see the docs section)
PARTS = {"iid": {"name": "iid"}, "noniid": {"name": "shards", "shards_per_client": 2}}
OPT = {"lr": 0.05, "momentum": 0.9}
OUT = Path("runs/ppfl-bench")


# -- configs -------------------------------------------------------------------------------
def base(model: str, part: str, seed: int = 0) -> dict[str, Any]:
    if model == "lenet-ppfl":
        clients, data = {"num": 20, "per_round": 5}, {"limit_train": 2000, "limit_test": 1000}
    else:
        clients, data = {"num": 100, "per_round": 10}, {"limit_train": 3000, "limit_test": 500}
    return {
        "seed": seed,
        "clients": clients,
        "partition": PARTS[part],
        "dataset": {"name": "fashion-mnist", **data},
        "model": {"name": model},
        "measure": {"memory": True},
    }


def batch(model: str) -> int:
    return 16 if model == "lenet-ppfl" else 8


def fedavg(model: str, part: str, seed: int = 0, rounds: int | None = None) -> dict[str, Any]:
    r = rounds or (LENET_ROUNDS if model == "lenet-ppfl" else LARGE_ROUNDS)
    return {
        **base(model, part, seed),
        "rounds": r,
        "method": {
            "name": "fedavg",
            "batch_size": batch(model),
            "local_epochs": 1,
            "client_optimizer": {"name": "sgd", **OPT},
        },
    }


def n_stages(model: str, block: int) -> int:
    convs = {"lenet-ppfl": 2, "alexnet-ppfl": 3, "vgg9": 6}[model]
    return -(-convs // block) + 1


def ppfl(
    model: str,
    part: str,
    target: float | None,
    block: int = 1,
    seed: int = 0,
    cap: int | None = None,
) -> dict[str, Any]:
    cap = cap or (LENET_CAP if model == "lenet-ppfl" else LARGE_CAP)
    method: dict[str, Any] = {
        "name": "ppfl",
        "batch_size": batch(model),
        "local_epochs": 1,
        **OPT,
        "block_layers": block,
        "rounds_per_stage": cap,
        "target_accuracy": target,
    }
    if model != "lenet-ppfl":
        method["tee"] = {"client_mb": 32}
    return {**base(model, part, seed), "rounds": cap * n_stages(model, block), "method": method}


# -- runs ----------------------------------------------------------------------------------
def run(name: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    d = OUT / name
    if not (d / "summary.json").exists():
        if d.exists():
            shutil.rmtree(d)
        t = time.perf_counter()
        run_experiment(load_config(cfg), out=d, render=False)
        print(f"[ppfl-bench] {name}: {time.perf_counter() - t:.0f} s", flush=True)
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


def total_bytes(lines: list[dict[str, Any]]) -> int:
    return sum(ln["bytes_up"] + ln["bytes_down"] for ln in lines)


def reach(lines: list[dict[str, Any]], target: float) -> tuple[int | None, int]:
    """Rounds and server↔client bytes until the final stage first reaches ``target``."""
    last = max(ln.get("stage", 0) for ln in lines)
    for i, ln in enumerate(lines):
        if ln.get("stage", 0) == last and ln["test_accuracy"] >= target:
            return i + 1, total_bytes(lines[: i + 1])
    return None, total_bytes(lines)


def per_stage(lines: list[dict[str, Any]]) -> list[int]:
    return [
        sum(1 for ln in lines if ln["stage"] == s)
        for s in range(max(ln["stage"] for ln in lines) + 1)
    ]


def table3_runs(
    model: str, part: str, seed: int, block: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tag = f"{model}/seed-{seed}"
    fa = run(f"{tag}/fedavg-{part}", fedavg(model, part, seed))
    return fa, run(
        f"{tag}/ppfl-{part}-b{block}", ppfl(model, part, fa[-1]["test_accuracy"], block, seed)
    )


def all_table3_runs() -> None:
    for seed in SEEDS:
        for part in PARTS:
            for block in (1, 2):
                table3_runs("lenet-ppfl", part, seed, block)
    for model in LARGE:
        for part in PARTS:
            table3_runs(model, part, 0, 1)


def ms(xs: list[float], fmt: str = ".3f") -> str:
    if len(xs) == 1:
        return format(xs[0], fmt)
    return f"{format(statistics.mean(xs), fmt)} ± {format(statistics.stdev(xs), fmt)}"


def table3() -> tuple[str, str]:
    """(the seeded LeNet table, the larger-model table)."""
    head = (
        "| data | PPFL block | FedAvg target acc | rounds to target (runs reaching it) | rounds ratio (vs FedAvg's "
        f"{LENET_ROUNDS}) | bytes ratio to target | whole-run bytes ratio (rounds) | best PPFL acc | final PPFL acc |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for part in PARTS:
        for block in (1, 2):
            tg, rr, br, wr, best, fin, reached = [], [], [], [], [], [], 0
            lengths = set()
            for seed in SEEDS:
                fa, lines = table3_runs("lenet-ppfl", part, seed, block)
                target = fa[-1]["test_accuracy"]
                r, b = reach(lines, target)
                tg.append(target)
                best.append(max(ln["test_accuracy"] for ln in lines))
                fin.append(lines[-1]["test_accuracy"])
                wr.append(total_bytes(lines) / total_bytes(fa))
                lengths.add(len(lines))
                if r is not None:
                    reached += 1
                    rr.append(float(r))
                    br.append(b / total_bytes(fa))
            rounds = (
                f"{ms(rr, '.1f')} ({reached}/{len(SEEDS)})"
                if rr
                else f"not reached (0/{len(SEEDS)})"
            )
            ratio = ms([r / LENET_ROUNDS for r in rr], ".2f") if rr else "—"
            rows.append(
                f"| {part} | {block} | {ms(tg)} | {rounds} | {ratio} | {ms(br, '.2f') if br else '—'} | "
                f"{ms(wr, '.2f')} ({'/'.join(map(str, sorted(lengths)))}) | {ms(best)} | {ms(fin)} |"
            )
    lenet = "\n".join(rows)
    rows = [
        "| model | data | FedAvg target acc (rounds) | FedAvg bytes | PPFL rounds to target (run) | rounds ratio | "
        "PPFL bytes to target (run) | bytes ratio | best PPFL acc | rounds per stage |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in LARGE:
        for part in PARTS:
            fa, lines = table3_runs(model, part, 0, 1)
            target, fb = fa[-1]["test_accuracy"], total_bytes(fa)
            r, b = reach(lines, target)
            rr = f"{r} ({len(lines)})" if r else f"not reached ({len(lines)})"
            ratio = f"{r / len(fa):.2f}" if r else "—"
            br = f"{b / fb:.2f}" if r else f"({b / fb:.2f} for the whole run)"
            rows.append(
                f"| {model} | {part} | {target:.3f} ({len(fa)}) | {fb / 1e6:.1f} MB | {rr} | {ratio} | "
                f"{b / 1e6:.1f} MB | {br} | {max(ln['test_accuracy'] for ln in lines):.3f} | {per_stage(lines)} |"
            )
    return lenet, "\n".join(rows)


# -- Table 4: time per phase in one round --------------------------------------------------
class PhaseTimer(StrategyWrapper):
    """Times a round's server-side steps: the strategy's own code before its first exchange
    (FedAvg: the broadcast message) and after its last (FedAvg: aggregation), each exchange
    with the clients, and each call into a server-side party by its ``op``. Re-encodes the
    exchanged messages once (as the engine does) to split serialization from client work."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.log: list[dict[str, float]] = []

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        t: dict[str, float] = {
            "pre": 0.0,
            "post": 0.0,
            "exchange": 0.0,
            "encode_down": 0.0,
            "encode_up": 0.0,
        }
        gen = self.inner.round(rnd, client_ids)
        reply: Any = None
        first, seen_exchange = True, False
        while True:
            t0 = time.perf_counter()
            try:
                step = next(gen) if first else gen.send(reply)
            except StopIteration as stop:
                t["post" if seen_exchange else "pre"] += time.perf_counter() - t0
                self.log.append(t)
                return stop.value
            first = False
            t["post" if seen_exchange else "pre"] += time.perf_counter() - t0
            t1 = time.perf_counter()
            reply = yield step
            dt = time.perf_counter() - t1
            if isinstance(step, Exchange):
                seen_exchange = True
                t["exchange"] += dt
                t["encode_down"] += _codec(step.messages)
                t["encode_up"] += _codec(reply)
            elif isinstance(step, PartyCall):
                key = f"call.{step.message.config.get('op', '?')}"
                t[key] = t.get(key, 0.0) + dt


def _codec(messages: Mapping[int, Message]) -> float:
    """Seconds to encode and decode ``messages`` (a shared broadcast encoded once)."""
    t0 = time.perf_counter()
    seen: dict[int, bytes] = {}
    for m in messages.values():
        b = seen.get(id(m))
        if b is None:
            b = seen[id(m)] = m.to_bytes()
        Message.from_bytes(b)
    return time.perf_counter() - t0


def phase_rounds(cfg: dict[str, Any], rounds: int) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """Run ``rounds`` rounds of ``cfg`` through the engine with a :class:`PhaseTimer`."""
    cfg = {**cfg, "rounds": rounds}
    built = build_run(load_config(cfg))
    timer = PhaseTimer(built.method.strategy)
    built = replace(built, method=replace(built.method, strategy=timer))
    sim = built.simulation()
    lines = []
    try:
        for r in range(1, rounds + 1):
            lines.append(sim.run_round(r))
    finally:
        sim.close()
    return list(zip(lines, timer.log, strict=True))


PHASE_ROUNDS = 2  # rounds timed per stage (and of FedAvg); the table shows their mean


def phases(model: str) -> list[dict[str, Any]]:
    """One row per FedAvg and per PPFL stage: seconds per phase in one round (IID)."""
    path = OUT / f"phases-{model}.json"
    if path.exists():
        return list(json.loads(path.read_text()))
    rows = []
    fa = phase_rounds(fedavg(model, "iid"), PHASE_ROUNDS)
    row: dict[str, Any] = {"run": "FedAvg E2E", "stage": "—"}
    for line, t in fa:
        enc = t["encode_down"] + t["encode_up"]
        _add(
            row,
            broadcast=t["pre"] + t["encode_down"],
            training=max(0.0, t["exchange"] - enc),
            upload=t["encode_up"],
            aggregation=t["post"],
            round=line["wall_s"],
        )
    rows.append(_mean(row, len(fa)))
    cfg = ppfl(model, "iid", None, 1, cap=PHASE_ROUNDS)
    pp = phase_rounds(cfg, PHASE_ROUNDS * n_stages(model, 1))
    for st in range(n_stages(model, 1)):
        row = {"run": "PPFL", "stage": st}
        sel = [(ln, t) for ln, t in pp if ln["stage"] == st]
        for line, t in sel:
            _add(
                row,
                broadcast=t.get("call.broadcast", 0.0) + t["encode_down"] + line["client_open_s"],
                training=line["client_train_s"],
                upload=line["client_upload_s"] + t["encode_up"],
                aggregation=t.get("call.aggregate", 0.0),
                round=line["wall_s"],
                attest=t.get("call.hello", 0.0) + t.get("call.register", 0.0),
                release=t.get("call.release", 0.0),
            )
        rows.append(_mean(row, len(sel)))
    path.write_text(json.dumps(rows))
    return rows


def _add(row: dict[str, Any], **kv: float) -> None:
    for k, v in kv.items():
        row[k] = row.get(k, 0.0) + v


def _mean(row: dict[str, Any], n: int) -> dict[str, Any]:
    return {k: (v / n if isinstance(v, float) else v) for k, v in row.items()}


def table4() -> str:
    rows = [
        "| model | run | stage | broadcast s | training s | upload s | aggregation s | sum of phases s | "
        "× FedAvg's sum | round wall s (with eval) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in ("lenet-ppfl", *LARGE):
        ph = phases(model)
        keys = ("broadcast", "training", "upload", "aggregation", "round")
        base_sum = sum(ph[0][k] for k in keys[:4])
        total = {
            "run": "PPFL, all stages (sum)",
            "stage": "Σ",
            **{k: sum(r[k] for r in ph[1:]) for k in keys},
        }
        for r in [*ph, total]:
            s = sum(r[k] for k in ("broadcast", "training", "upload", "aggregation"))
            rows.append(
                f"| {model} | {r['run']} | {r['stage']} | {r['broadcast']:.4f} | {r['training']:.3f} | "
                f"{r['upload']:.4f} | {r['aggregation']:.4f} | {s:.3f} | {s / base_sum:.2f} | {r['round']:.3f} |"
            )
    return "\n".join(rows)


PHASE_KEYS = ("broadcast", "training", "upload", "aggregation")


def table4_notes(by_model: dict[str, list[dict[str, Any]]]) -> str:
    """The remarks under Table 4, their figures computed from the phase rows (FedAvg first, then
    one row per PPFL stage), so a re-timing cannot leave them describing another measurement."""

    def total(r: dict[str, Any]) -> float:
        return sum(r[k] for k in PHASE_KEYS)

    def overhead(r: dict[str, Any]) -> float:  # everything but training, as a share of the phases
        return (total(r) - r["training"]) / total(r)

    def span(vals: list[float], fmt: str) -> str:
        lo, hi = min(vals), max(vals)
        return f"{lo:{fmt}}-{hi:{fmt}}" if f"{lo:{fmt}}" != f"{hi:{fmt}}" else f"{lo:{fmt}}"

    def stage_ratios(ph: list[dict[str, Any]]) -> tuple[list[float], float]:
        base = total(ph[0])
        return [total(r) / base for r in ph[1:]], sum(total(r) for r in ph[1:]) / base

    lenet = by_model["lenet-ppfl"]
    large = by_model[LARGE[0]]
    l_stages, l_sum = stage_ratios(lenet)
    a_stages, a_sum = stage_ratios(large)
    both = [lenet, large]
    bcast = [r["broadcast"] / ph[0]["broadcast"] for ph in both for r in ph[1:]]
    upload = [r["upload"] / ph[0]["upload"] for ph in both for r in ph[1:]]
    bullets = [
        f"LeNet: one round of a PPFL stage costs {span(l_stages, '.2f')}x a FedAvg round (the early stages train the "
        "big head; later stages add the REE's frozen forward); one round of every stage adds up to "
        f"{l_sum:.1f}x FedAvg's round (the paper's LeNet row: 2.4x; it speaks of a \"3x or higher delay, similar "
        'to the number of layers" to train all layers).',
        f"AlexNet-PPFL: {span(a_stages, '.2f')}x a FedAvg round per stage (stage 0 trains one conv with a tiny head; "
        f"stages 1-2 re-run the frozen 128-channel convs at 28x28 in the REE), {a_sum:.1f}x summed over the "
        f"{len(large) - 1} stages (the paper: 3.8x on CIFAR-10, on a phone).",
        "The crypto is visible but not dominant: PPFL's broadcast (sealing per client, encoding, opening in the "
        f"enclave) costs {span(bcast, '.1f')}x FedAvg's plain broadcast, its upload (sealing) {span(upload, '.1f')}x "
        "FedAvg's; broadcast, upload and aggregation (opening every upload in the server enclave) together take "
        f"{span([100 * overhead(r) for r in lenet[1:]], '.1f')}% of a LeNet stage round's phases and "
        f"{span([100 * overhead(r) for r in large[1:]], '.1f')}% of an AlexNet one's (FedAvg: "
        f"{100 * overhead(lenet[0]):.1f}% and {100 * overhead(large[0]):.1f}%). Training dominates, as in the paper. "
        "(These remarks describe the measurement above, cached in `runs/ppfl-bench/phases-*.json`; delete those "
        "to re-time.)",
    ]
    return "\n".join(
        textwrap.fill(b, 95, initial_indent="- ", subsequent_indent="  ") for b in bullets
    )


# -- transfer and memory (LeNet, seed 0) ----------------------------------------------------
PUBLIC = 5000


def pretrain_public() -> Path:
    """Transfer (§6.6): LeNet-PPFL trained centrally on PUBLIC Fashion-MNIST training images
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
    private = stratified_subset(
        full.y_train.numpy(), 2000, numpy_rng(0, "data", "fashion-mnist", "train")
    )
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


def transfer() -> str:
    pre = pretrain_public()
    _, scratch = table3_runs("lenet-ppfl", "iid", 0, 1)
    cfg = ppfl("lenet-ppfl", "iid", None, 1)
    cfg["rounds"] = 2 * LENET_CAP
    cfg["method"].update(init_from=str(pre), freeze_from_init=1)
    tr = run("lenet-ppfl/seed-0/ppfl-iid-transfer", cfg)
    rows = [
        "| run | stages trained | rounds | final acc | best acc | bytes |",
        "|---|---|---|---|---|---|",
    ]
    for name, lines in (
        ("from scratch (1-layer, target schedule)", scratch),
        ("transfer: conv1 frozen from public", tr),
    ):
        rows.append(
            f"| {name} | {sorted({ln['stage'] for ln in lines})} | {len(lines)} | {lines[-1]['test_accuracy']:.3f} | "
            f"{max(ln['test_accuracy'] for ln in lines):.3f} | {total_bytes(lines) / 1e6:.1f} MB |"
        )
    return "\n".join(rows)


def memory() -> str:
    rows = [
        "| model, run | stage | S_l at the run's batch (predicted) | enclave peak (measured) | budget | eligible clients | "
        "client→tee bytes per round | sealing s per round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = [("lenet-ppfl", "iid", 1), ("lenet-ppfl", "iid", 2), *((m, "iid", 1) for m in LARGE)]
    for model, part, block in keys:
        _, lines = table3_runs(model, part, 0, block)
        budget = 16 if model == "lenet-ppfl" else 32
        n = base(model, part)["clients"]["num"]
        for s in sorted({ln["stage"] for ln in lines}):
            ls = [ln for ln in lines if ln["stage"] == s]
            ln = ls[0]
            rows.append(
                f"| {model} {part}-b{block} | {s} | {ln['tee_need_bytes'] / 2**20:.2f} MiB | "
                f"{max(x['tee_peak_bytes'] for x in ls) / 2**20:.2f} MiB | {budget} MiB | {ln['eligible_clients']} / {n} | "
                f"{sum(x['bytes.client->tee'] for x in ls) / len(ls) / 1e6:.2f} MB | {sum(x['seal_s'] for x in ls) / len(ls):.4f} |"
            )
    return "\n".join(rows)


def render(
    *,
    lenet: str,
    large: str,
    table4: str,
    table4_notes: str,
    transfer: str,
    memory: str,
    command: str,
) -> str:
    seeds = ", ".join(map(str, SEEDS))
    return f"""Command: `{command}` (resumable: finished run directories under `runs/ppfl-bench` are
skipped). The machine was shared with other developers' jobs (2 cores, load average 8-14 during
these runs): wall-clock
figures are inflated and noisy; compare them only as ratios within one table.

**Reductions** (the paper: 100 clients, 10 per round, end-to-end FedAvg's accuracy after 150
rounds as the target, batch 16; LeNet, AlexNet and VGG9 on Fashion-MNIST and CIFAR-10):

- **LeNet-PPFL** (C20-MP-C50-MP-FC500-FC10): 2000 training images over **20 clients** (100
  each), **5 per round**, 1000 test images; FedAvg for **{LENET_ROUNDS} rounds** gives the target (its
  final accuracy, per seed); each PPFL stage ends at the target or after a **cap of {LENET_CAP}
  rounds**. Batch 16. Seeds {seeds} (each seed draws its own data subset, partition,
  initialisation and so its own target).
- **AlexNet-PPFL** (C128x3-AP16-FC10, 297,738 weights on 1x28x28): the paper's **100 clients,
  10 per round**, but **3000 training images (30 per client)**, 500 test images, **batch 8**
  (4 local steps a round; batch 16 would give 2), FedAvg for **{LARGE_ROUNDS} rounds**, PPFL cap
  **{LARGE_CAP} rounds per stage**, **one seed** (0). Client enclaves of **32 MiB** (not 16): AlexNet's
  conv stages need S_l = 25-33 MiB at batch 16 and 12.5-17.2 MiB at batch 8 (128 channels at
  28x28), so 16 MiB devices would have to shrink their batch (Algorithm 1) and the comparison
  with FedAvg would mix batch sizes.
- **VGG9 did not fit**: probes (100 clients, 10 per round, 2000 images, batch 16, not kept)
  left the paper's VGG9 (no normalisation) at chance (0.100) for 12 FedAvg rounds, and a
  BatchNorm variant (not the paper's) at 0.28 after 8 rounds, at 8-10 s a round on this
  shared machine; its PPFL run has 7 stages. A target worth reaching needed more rounds than
  the budget (~25 CPU-minutes for all larger-model rows) allowed. `vgg9` runs under PPFL
  (tests/methods/test_ppfl.py trains one round of one stage of every zoo model).
- **Departure from the paper's recipe**: both methods train with SGD lr 0.05, momentum 0.9 and
  E = 1 local epoch, where the paper uses lr 0.01 with decay, momentum 0.5 and E = 10; the
  rounds and bytes to the target are therefore not comparable with the paper's figures. IID, and
  non-IID with two label shards per client (`partition: shards`, 2 per client), as the paper. No
  CIFAR-10 rows.
- **Departure from the paper's protocol, the per-stage cap**: the paper runs each stage until it
  reaches the target; here a stage stops at the cap (LeNet {LENET_CAP}, AlexNet-PPFL {LARGE_CAP}), so a
  "not reached" below is the cap's as much as PPFL's. Uncapped LeNet runs (each stage until its
  validation accuracy plateaus), estimated at about 3 CPU-hours, wait for the long runs
  (docs/planned.md).

Bytes are server↔client message bytes (`bytes_up + bytes_down`: every sealed stage model and
frozen layer as sent). "Rounds to target" counts rounds until the *final* stage first reaches
FedAvg's accuracy; a run that does not reach it is reported as not reached (the paper's
protocol, where stages run until the target, would run longer).

### Table 3 and Table 5 analogues, LeNet: rounds and bytes to FedAvg's accuracy ({len(SEEDS)} seeds)

Mean ± sample std over the seeds that reached the target (how many in parentheses); the
rounds ratio is PPFL's rounds over FedAvg's {LENET_ROUNDS}, the bytes ratio PPFL's bytes to the
target over FedAvg's {LENET_ROUNDS} rounds. Accuracy columns are over all seeds. Block 2 is Table 5's
2-layer blocks (conv1+conv2, then the classifier).

{lenet}

{LENET_NOTES}

### Table 3 analogue, AlexNet-PPFL (100 clients, 10 per round; one seed)

{large}

{LARGE_NOTES}

### Table 4 analogue: time per phase in one round (IID, seed 0)

{table4}

Seconds per round summed over the round's clients (they run one after another here), mean of
{PHASE_ROUNDS} rounds per row (PPFL: {PHASE_ROUNDS} rounds per stage, fixed schedule), measured by a strategy
wrapper around the real engine (`PhaseTimer`) and the PPFL client's own timers:

- **broadcast**: FedAvg: the server preparing the model message + encoding/decoding it; PPFL:
  the server enclave sealing the stage model per client (`call.broadcast`), encoding/decoding
  the messages (sealed blob + frozen layers a client lacks), and the client enclave opening
  it and building the stage model (`client_open_s`).
- **training**: FedAvg: the client exchange less the message encoding both ways; PPFL: the
  client REE's frozen forward plus the enclave's training steps (`client_train_s`).
- **upload**: FedAvg: encoding/decoding the replies; PPFL: the client enclave packing and
  sealing its update (`client_upload_s`) plus encoding/decoding the replies.
- **aggregation**: FedAvg: the server's weighted average (`post`); PPFL: the server enclave
  opening every upload (AES-GCM), FedAvg of layer + head, and sealing the evaluation blob.

Not in the phases: attestation and key agreement of clients seen for the first time (PPFL's
`hello`/`register` calls and an extra exchange), releasing a finished stage to the REE, and
the per-round test evaluation (FedAvg in the REE; PPFL's stage model through an ECALL), which
the round wall time includes. Simulated enclaves cost no world switch or TrustZone memory
encryption: the paper's client-side TEE overheads (up to ~15% CPU time, its Fig. 3) are not modelled;
what is measured is the crypto, (un)packing and the layer-wise work itself. "All stages
(sum)" adds one round of every stage, as the paper's PPFL row adds its layers' rows (its
LeNet: 6496.5 s against E2E's 2702.3 s, 2.4x).

{table4_notes}

### Transfer (§6.6): conv1 pretrained on {PUBLIC} public images, frozen; IID private data (LeNet, seed 0)

{transfer}

Split: the clients' 2000 private images are the seeded, stratified subset the other seed-0
runs use; the public set is {PUBLIC} other Fashion-MNIST training images (seeded draw from the
complement, disjoint by construction). LeNet-PPFL was trained centrally on them (2 epochs,
SGD lr 0.05, momentum 0.9, batch 64) and saved as safetensors; the PPFL run uses
`method.init_from` (every layer starts from it) and `freeze_from_init: 1` (conv1 released and
frozen; stages conv2 and the classifier run, {LENET_CAP} rounds each; heads fresh). Transfer
beats PPFL from scratch here, with a third fewer bytes (one seed).

### Enclave memory per stage (Algorithm 1's S_l; seed 0, IID)

{memory}

S_l counts the stage's layer and head with a gradient and a momentum buffer each, plus per
sample the input, the label and every leaf's output and its gradient; the enclave charges the
tensors it really holds against its budget, and its measured peak equals S_l at the full
batch. The preset `ppfl-fmnist-lenet` adds 6 MiB devices (they shrink their batch) and 4 MiB
devices (excluded from every stage: `eligible_clients` 17 of 20).

{MEMORY_NOTES}
"""


# Observations on the measured tables (the runs are deterministic per seed; re-check if the protocol changes)
LENET_NOTES = """- Within these caps (10 rounds a stage against FedAvg's 15 rounds in all), 1-layer PPFL reaches
  FedAvg's accuracy in no seed, and 2-layer blocks in one of three (IID, seed 0: 18 rounds,
  1.18x FedAvg's bytes); in the other runs the best PPFL accuracy stays 0.03-0.09 (IID)
  and 0.02-0.11 (non-IID) below that seed's target. The paper, with stages running until the 150-round target,
  reports 0.54x the rounds on average; with our short caps this is not a replication of that.
- Bytes: every conv stage ships its head, which for LeNet holds the 800→500→10 classifier
  (405k of LeNet-PPFL's 431k weights), so a PPFL round costs about what a FedAvg round does;
  30 rounds (1-layer) cost 1.93x FedAvg's 15, 20 rounds (2-layer) 1.31x, whatever the seed.
- The final accuracy is below the best in every row: the final (classifier) stage is short
  and noisy here, more so on non-IID data."""
LARGE_NOTES = """- At this budget AlexNet-PPFL barely leaves chance under either method: end-to-end FedAvg
  ends at 0.232 (IID) and 0.196 (non-IID) after 15 rounds (10 of 100 clients, 4 local steps of
  batch 8 each), and PPFL, 6 rounds a stage, peaks at 0.230 and 0.180 without reaching the
  target. The rows say little about the paper's regime (150-round target on CIFAR-10, stages
  run to the target); a fair comparison needs far more rounds than this budget held.
- What they do show is the traffic: AlexNet-PPFL's stage heads are small (a 1x1 conv 128→128
  and the 128→10 output layer), so a conv stage's round carries its layer and head plus the
  frozen layers a newly selected client lacks, and the whole 4-stage PPFL run (24 rounds)
  costs about two thirds of FedAvg's 15 rounds."""
MEMORY_NOTES = """AlexNet-PPFL's conv stages hold 128x28x28 activations per sample: 12.5-17.2 MiB at batch 8,
more than a 16 MiB enclave for stages 1-2 (hence 32 MiB here), and the REE→enclave crossing
carries the frozen layers' feature maps, ~127 MB a round for 10 clients of 30 images (the
server↔client traffic of the same rounds is 13-19 MB)."""


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(OUT), help="root of the run directories (resumable)")
    ap.add_argument(
        "--docs",
        default=None,
        help="write the `ppfl` section of this Markdown file (else print it)",
    )
    ap.add_argument("--runs-only", action="store_true", help="run the Table 3 runs and stop")
    a = ap.parse_args()
    OUT = Path(a.out)
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    all_table3_runs()
    if a.runs_only:
        return
    lenet, large = table3()
    notes = table4_notes({model: phases(model) for model in ("lenet-ppfl", *LARGE)})
    body = render(
        lenet=lenet,
        large=large,
        table4=table4(),
        table4_notes=notes,
        transfer=transfer(),
        memory=memory(),
        command=COMMAND,
    )
    if a.docs:
        from fedge.bench.docs import update_section

        update_section(a.docs, "ppfl", "PPFL", body)
        print(f"wrote the ppfl section of {a.docs}")
    else:
        print(body)


if __name__ == "__main__":
    main()
