"""The zeroth-order frontier (issue 45): how close forward-only clients come to backprop's
accuracy, and at what total client FLOPs and bytes, on one protocol where BP FedAvg is useful
(>= 0.80 test accuracy), with every lever of docs/methods/baffle.md alone, the combination the
validation screens choose, forward-mode AD kept apart, and the peers registered at run time.

**Protocol.** Fashion-MNIST, an MLP 784-32-10 (ReLU; n = 25,450 parameters, the dimension of
BAFFLE's LeNet, 26,730, so a zeroth-order estimate's cosine with the gradient, about sqrt(K/n),
is the one measured there; a forward costs 50.9 kFLOP a sample, ~200x less than that LeNet's
10.6 MFLOP, which is what makes the whole table fit), 10 IID clients, all every round,
10,000 training samples (1,000 a client) plus 2,000 held out for validation, the full 10,000-image
test set, 20 rounds of one local epoch with batches of 20 (50 local steps a round), client Adam
(b2 0.99), seeds 0, 1, 2. Every row gets the same data, the same initial model (the seed's; the
warm-start rows first pretrain it on the server, with backprop, on 2,000 public training
images that no client and no validation split holds, and all fine-tune that one start) and
the same tuning: its learning rate (client Adam's; FedKSeed's SGD lr, from 1e-4, 3e-4, 1e-3; the
guided row's server Adam, batch mode) is picked from 0.001, 0.003, 0.01 by the final **validation**
accuracy of a 10-round run on seed 0 (a grid whose best sits at an edge grows one
step past it, at most twice; ``fedge.bench.screened.widened_grid``); the test set is never
looked at. The BP reference is whichever of BP FedAvg fresh / persistent Adam validates better.
The combination row takes every epoch-mode lever whose screen beat BAFFLE's own screen on
validation; a second one adds the warm start to them (every inference-only lever together);
the forward-mode combination takes the same levers with ``estimator: jvp``.

**Cost, by torch's FLOP counter at tiny size** (one client, 300 samples, one round; FLOPs a
training sample): BP 102 kFLOP (forward and backward), BAFFLE K = 100 5.13 MFLOP (101 forwards),
jvp 15.2 kFLOP a direction a sample (3.0 forwards). A run is 10 clients x 1,000 samples x 20
rounds = 200,000 sample-steps: BAFFLE K = 100 1.03e12 FLOP (10 s at 100 GFLOP/s), BP 2.0e10;
evaluation adds 12,000 x 50.9 kFLOP a round (1.2e10 a run). A row is 3 seeds plus a screen of
3-5 lrs x 10 rounds (<= 2.5 runs): at most ~5.5 runs, so ~57 s of a 100 GFLOP/s core for a
BAFFLE K = 100 row and ~9 CPU-minutes for the whole table at that nominal rate (``--estimate``
prints it row by row). **Measured on this machine** (one core) such small forwards run far below
100 GFLOP/s (call overhead): 3.15 GFLOP/s for BAFFLE's batched forwards, 2.1 for BP, 2.06 for
jvp, plus ~2 s a round of evaluation; so the runs keep torch's FLOP counter off (it costs 2.4x)
and take a row's FLOPs from its **probe** (one client's round metered, x 10 clients x rounds:
equal IID clients, one K), except rows with a K schedule, which meter every round (1.33 GFLOP/s).
At the measured rates a BAFFLE K = 100 row takes ~0.6 CPU-hours, a jvp row ~0.8, the K-schedule
row ~1.8, a BP row ~0.1 (measured: 3.2 CPU-minutes), **the whole table ~7 CPU-hours**.

**Per row**: final test accuracy (mean ± std over seeds), the total client FLOPs (all clients,
all rounds so far) at the first evaluated round whose test accuracy reaches the BP reference's
final mean less 1 point (mean over the seeds that reach it; else "not reached" and the best
accuracy), the run's total client FLOPs, bytes up and down per client over the run, and the
client memory of one metered round (``measure.memory``, tensor accounting). Rows that run
forward-mode AD (``forward_mode_ad`` in their round lines) are listed apart from the
inference-only ones, and so is activity perturbation (``estimator: activity``, epoch mode: its
directional derivatives are finite differences of forwards, but the client perturbs each layer's
output and forms that layer's weight gradient from the layer's input, which an inference-only
runtime does not do).

**Resumable units**: every screen run (row, lr), every main run (row, seed) and every row's memory
probe is a unit whose record (its resolved config and figures) is written to
``benchmarks/results/zo_frontier/`` when it finishes; a recorded unit is never rerun, an interrupted
one resumes from its run directory's checkpoint. ``--rows`` and ``--seeds`` pick units (to run rows
in parallel, one core each), ``--max-minutes`` starts no unit after that budget.

    python benchmarks/zo_frontier.py --estimate                    # the cost of every row, run nothing
    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/zo_frontier.py --rows "BP FedAvg" --seeds 0 1 2
    python benchmarks/zo_frontier.py --table-only --docs docs/benchmarks.md   # render the records
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedge.bench.docs import records_line, update_section
from fedge.bench.figures import read_run_logs
from fedge.bench.screened import grid_step
from fedge.bench.variants import with_neutral_additions
from fedge.core.config import load_config
from fedge.core.errors import ConfigError, DivergenceError
from fedge.experiment.build import resolved_config

ROOT = Path(__file__).resolve().parents[1]
RECORDS = Path(__file__).resolve().parent / "results" / "zo_frontier"
FIGURE = ROOT / "docs" / "figures" / "zo-frontier" / "frontier.png"
BASE = "baffle-fmnist-lenet"
SEEDS = (0, 1, 2)
ROUNDS = 20
SCREEN_ROUNDS = 10
TRAIN, VALIDATION, CLIENTS = 10_000, 2_000, 10
TARGET_GAP = 0.01  # the target: within 1 point of BP FedAvg ...
FLOPS_RATIO = 10.0  # ... at no more than 10x its total client FLOPs

PROTOCOL = [
    "threads=1",
    f"rounds={ROUNDS}",
    f"dataset.limit_train={TRAIN + VALIDATION}",
    f"dataset.validation={VALIDATION}",
    "dataset.limit_test=10000",
    "model.name=mlp",
    "model.hidden=[32]",
    "model.activation=relu",
    "model.norm=none",
    "method.batch_size=20",
    "measure.flops=false",
]
BP = ["method.name=fedavg", "method.client_optimizer.name=adam", "method.client_optimizer.b2=0.99"]
ADAM_LRS = (0.001, 0.003, 0.01)
LR = "method.client_optimizer.lr"

# The levers of docs/methods/baffle.md, each as the overrides it adds to BAFFLE (epoch mode).
LEVERS = {
    "persistent Adam": ["method.client_optimizer.state=persistent"],
    "mask 10% magnitude": ["method.train_mask={rule: magnitude, density: 0.1}"],
    "fc1 frozen, prefix once": ["method.freeze=[features.fc1]", "method.prefix_once=true"],
    "σ decay 0.9, K 100→200": ["method.sigma_decay=0.9", "method.k_final=200"],
    "layer-scaled σ": ["method.sigma_scale=layer"],
}
# Guided directions need batch mode: one server step a round on one batch of 20 per client, so the
# same client forwards as the epoch rows take 50x the rounds (evaluated every 50th round).
GUIDED = [
    "method.mode=batch",
    "method.delta_loss_on=batch",
    "method.guided_rank=4",
    "method.guided_share=0.5",
    f"rounds={ROUNDS * 50}",
    "eval_every=50",
    "method.server_optimizer={name: adam, lr: 0.01, b1: 0.9, b2: 0.99}",
]
# One server step a round on one batch of 20 per client (FedSGD; FeedSign): the epoch rows'
# client data per round take 50x the rounds, evaluated every 50th.
ONE_STEP_ROUNDS = (f"rounds={ROUNDS * 50}", "eval_every=50")
# FedZO (Fang et al. 2022) as the fedzo-fmnist-lenet preset maps it onto BAFFLE's epoch mode:
# b2 = 20 forward-difference directions, client SGD, server SGD lr 1, no clip or EMA; here with
# the other rows' one local epoch (50 steps) instead of the preset's H = 5.
FEDZO = (
    "method.k=20",
    "method.scheme=forward",
    "method.clip=null",
    "method.ema=null",
    "method.client_optimizer={name: sgd}",
    "method.server_optimizer={name: sgd, lr: 1.0}",
)
JVP_K = 32  # 3 forwards a direction: 96 forwards' FLOPs a sample, BAFFLE K = 100's 101
# Backprop with a compressed uplink (issue 44: the comparison that matters for slow uplinks):
# top-k 1% with error feedback, the codec of docs/methods/compression.md with the fewest bytes
# but randk's (8 bytes a kept coordinate, 254 of the MLP's 25,450: ~2 kB a round against 102 kB
# dense; randk 1% sends half that, but its d/k scaling adds a variance of ~99 times the update's
# squared norm). Compression refuses secure aggregation (off for FedAvg; said here so the row
# cannot inherit it).
BP_TOPK = "BP FedAvg, top-k 1% + error feedback"
TOPK = (
    "method.compress.name=topk",
    "method.compress.ratio=0.01",
    "method.compress.error_feedback=true",
    "method.secure_aggregation=false",
)
# Activity perturbation (Ren et al. 2023; fedge.estimators.activity): K perturbations of each
# layer's output per sample; a direction costs the layers after it only (on this MLP, 724 FLOP a
# sample against a forward's 50.9k), so K = 100 is 3.4 forwards' FLOPs a sample, within BAFFLE
# K = 100's 101 (the jvp row's convention: no more client FLOPs than BAFFLE K = 100).
ACTIVITY_K = 100
# Warm start from public data: before round 1 the server trains the seed's MLP with backprop on
# PUBLIC Fashion-MNIST training images that dataset.limit_train leaves out of the run
# (source: unused), so the clients' 10,000 samples, the validation set and the initial
# model's seed are exactly the other rows'; then BP FedAvg or BAFFLE fine-tunes from that one
# start. The recipe is fixed, not screened: 5 epochs of Adam (lr 1e-3, batch 32) reach 0.798 test
# accuracy on seed 0 alone; the server's FLOPs (1.02e9, torch's counter; ~2.5 s) are reported
# beside the table, never as client FLOPs.
PUBLIC = 2_000
WARM_START = (
    f"warm_start={{public: {PUBLIC}, source: unused, epochs: 5, lr: 0.001, batch_size: 32, "
    "optimizer: adam}",
)


WARM_BP = f"BP FedAvg, warm start ({PUBLIC:,} public)"
WARM_BAFFLE = f"BAFFLE K=100, warm start ({PUBLIC:,} public)"


@dataclass(frozen=True)
class Row:
    """A row of the table: its overrides (before the lr), which key its screened lr sets and
    the grid, its kind (``bp``, ``zo`` inference-only, ``fmad`` forward-mode AD, ``activity``
    activity perturbation, ``peer``)."""

    label: str
    kind: str
    overrides: tuple[str, ...]
    lr_key: str = LR
    lrs: tuple[float, ...] = ADAM_LRS
    needs: tuple[str, ...] = field(default=())  # rows whose screens this row's config depends on


def base_rows() -> dict[str, Row]:
    """Every row whose config is fixed before any screen (the dependent rows: :func:`rows`)."""
    out = [
        Row("BP FedAvg", "bp", tuple(BP)),
        Row("BP FedAvg, persistent Adam", "bp", (*BP, "method.client_optimizer.state=persistent")),
        Row("BAFFLE K=100", "zo", ("method.k=100",)),
        *(Row(f"BAFFLE + {name}", "zo", ("method.k=100", *o)) for name, o in LEVERS.items()),
        Row(
            "BAFFLE + guided r=4 (batch mode)",
            "zo",
            ("method.k=100", *GUIDED),
            lr_key="method.server_optimizer.lr",
        ),
        Row(f"jvp K={JVP_K}", "fmad", (f"method.k={JVP_K}", "method.estimator=jvp")),
        Row(ACTIVITY, "activity", (f"method.k={ACTIVITY_K}", "method.estimator=activity")),
        # issue 44's peer comparison: the rows it names beyond the levers and the peers
        Row(
            "BP FedSGD",
            "bp",
            ("method.name=fedsgd", *ONE_STEP_ROUNDS),
            lr_key="method.server_optimizer.lr",
            lrs=(0.03, 0.1, 0.3),
        ),
        Row(BP_TOPK, "bp", (*BP, *TOPK)),
        Row(
            "BAFFLE K=100 (batch mode)",
            "zo",
            ("method.k=100", *[o for o in GUIDED if "guided" not in o]),
            lr_key="method.server_optimizer.lr",
        ),
        Row("FedZO (BAFFLE epoch, forward, K=20, SGD)", "zo", FEDZO, lrs=(0.01, 0.03, 0.1)),
        Row(WARM_BP, "bp", (*BP, *WARM_START)),
        Row(WARM_BAFFLE, "zo", ("method.k=100", *WARM_START)),
    ]
    return {r.label: r for r in out}


def peer_rows(methods: Sequence[str]) -> dict[str, Row]:
    """The peers of issue 44 that ``methods`` (the registry at run time) holds, each on the
    epoch rows' client data per round (50 steps of a batch of 20): FedKSeed and DeComFL with 50
    local steps a round, FeedSign (one step a round) with 50x the rounds, evaluated every 50th,
    as the guided row; each its own lr key (FedKSeed's and FeedSign's ``method.lr``, DeComFL's
    optimizer's) on the SGD grid."""
    epoch = ("method.local_steps=50", "method.batch_size=20")
    peers = {
        "fedkseed": ("FedKSeed", ("method.name=fedkseed", *epoch), "method.lr"),
        "decomfl": ("DeComFL", ("method.name=decomfl", *epoch), "method.optimizer.lr"),
        "feedsign": (
            "FeedSign",
            (
                "method.name=feedsign",
                "method.batch_size=20",
                f"rounds={ROUNDS * 50}",
                "eval_every=50",
            ),
            "method.lr",
        ),
    }
    out = {
        label: Row(label, "peer", o, lr_key=key, lrs=(1e-4, 3e-4, 1e-3))
        for name, (label, o, key) in peers.items()
        if name in methods
    }
    if "FedKSeed" in out:  # FedKSeed-Pro: seeds sampled by their aggregated scalars' magnitudes
        pro = out["FedKSeed"]
        out["FedKSeed-Pro"] = Row(
            "FedKSeed-Pro", "peer", (*pro.overrides, "method.sampling=pro"), pro.lr_key, pro.lrs
        )
    return out


BP_REF_ROWS = ("BP FedAvg", "BP FedAvg, persistent Adam")
ACTIVITY = f"BAFFLE activity perturbation K={ACTIVITY_K}"
COMBO = "BAFFLE + levers chosen by validation"
COMBO_JVP = f"jvp K={JVP_K} + the same levers"
COMBO_WARM = f"BAFFLE + the same levers, warm start ({PUBLIC:,} public)"
BP_MASK = "BP, mask 10% magnitude (same trainable set)"
BP_FROZEN = "BP, fc1 frozen (same trainable set)"


def rows(screens: dict[str, dict[float, dict[str, Any]]], methods: Sequence[str]) -> dict[str, Row]:
    """Every row, the dependent ones included once the screens they depend on are recorded
    (``screens``: row label -> lr -> screen record): BP on the masked and frozen trainable sets
    with the BP reference's optimizer state, and the combinations of :func:`chosen_levers`."""
    out = dict(base_rows())
    ref = bp_reference(screens)
    state = () if ref in (None, "BP FedAvg") else ("method.client_optimizer.state=persistent",)
    bp_deps: tuple[str, ...] = BP_REF_ROWS
    out[BP_MASK] = Row(BP_MASK, "bp", (*BP, *state, *LEVERS["mask 10% magnitude"]), needs=bp_deps)
    out[BP_FROZEN] = Row(
        BP_FROZEN, "bp", (*BP, *state, "method.freeze=[features.fc1]"), needs=bp_deps
    )
    levers = chosen_levers(screens)
    deps = ("BAFFLE K=100", *(f"BAFFLE + {n}" for n in LEVERS))
    extra = tuple(o for n in levers or () for o in LEVERS[n])
    out[COMBO] = Row(COMBO, "zo", ("method.k=100", *extra), needs=deps)
    # the inference-only levers all together: the chosen ones from the warm-start rows' one start
    out[COMBO_WARM] = Row(COMBO_WARM, "zo", ("method.k=100", *extra, *WARM_START), needs=deps)
    jvp = (f"method.k={JVP_K}", "method.estimator=jvp")
    extra = tuple(o for o in extra if not o.startswith("method.k_final"))  # K's ramp: BAFFLE's
    out[COMBO_JVP] = Row(COMBO_JVP, "fmad", (*jvp, *extra), needs=deps)
    out.update(peer_rows(methods))
    return out


# --- screens and picks --------------------------------------------------------------------------


def grid(row: Row, screened: dict[float, dict[str, Any]]) -> tuple[float, ...]:
    """``row.lrs`` grown one step past an edge that won on validation, at most twice."""
    lrs = sorted(row.lrs)
    for _ in range(2):
        best = pick(lrs, screened)
        if best is None or lrs[0] < best < lrs[-1]:
            break
        if best == lrs[-1]:
            lrs.append(grid_step(best, up=True))
        else:
            lrs.insert(0, grid_step(best, up=False))
    return tuple(lrs)


def score(record: dict[str, Any]) -> float:
    """A screen run's final validation accuracy; a diverged run scores below every other."""
    val = record.get("val_accuracy_by_round") or []
    return -math.inf if record.get("diverged_round") or not val else float(val[-1])


def pick(lrs: Sequence[float], screened: dict[float, dict[str, Any]]) -> float | None:
    """The lr of ``lrs`` with the best final validation accuracy (ties: the smaller); None while
    one is not recorded."""
    if any(lr not in screened for lr in lrs):
        return None
    return max((score(screened[lr]), -lr, lr) for lr in lrs)[2]


def picked(row: Row, screened: dict[float, dict[str, Any]]) -> tuple[float, float] | None:
    """(lr, its validation score) once the row's (widened) grid is recorded."""
    lr = pick(grid(row, screened), screened)
    return None if lr is None else (lr, score(screened[lr]))


def bp_reference(screens: dict[str, dict[float, dict[str, Any]]]) -> str | None:
    """The stronger BP FedAvg recipe by validation (fresh or persistent Adam; ties: fresh)."""
    scored = []
    for i, label in enumerate(BP_REF_ROWS):
        p = picked(base_rows()[label], screens.get(label, {}))
        if p is None:
            return None
        scored.append((p[1], -i, label))
    return max(scored)[2]


def chosen_levers(screens: dict[str, dict[float, dict[str, Any]]]) -> list[str] | None:
    """The epoch-mode levers whose picked screen run beat BAFFLE K=100's on validation (None while
    a screen is missing): the combination row combines them all, chosen without the test set."""
    rows_ = base_rows()
    base = picked(rows_["BAFFLE K=100"], screens.get("BAFFLE K=100", {}))
    if base is None:
        return None
    out = []
    for name in LEVERS:
        label = f"BAFFLE + {name}"
        p = picked(rows_[label], screens.get(label, {}))
        if p is None:
            return None
        if p[1] > base[1]:
            out.append(name)
    return out


# --- units --------------------------------------------------------------------------------------


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "=.-" else "_" for c in text)


def unit_overrides(row: Row, lr: float, unit: str) -> list[str]:
    """The overrides of one unit: ``screen`` (seed 0, ``SCREEN_ROUNDS`` rounds), ``seed-S``, or
    ``probe`` (one client's round with memory metered)."""
    rounds = [o for o in row.overrides if o.startswith("rounds=")]
    scale = int(rounds[0].split("=")[1]) // ROUNDS if rounds else 1
    common = [*PROTOCOL, *row.overrides, f"{row.lr_key}={lr}"]
    if any(o.startswith("method.k_final=") for o in row.overrides):
        common.append("measure.flops=true")  # K varies by round: meter every round as executed
    if unit == "screen":
        return [*common, "seed=0", f"rounds={SCREEN_ROUNDS * scale}"]
    if unit == "probe":
        # one client: secure aggregation (on by default for the peers and BAFFLE's batch mode)
        # needs two, and the sum of one reply is no secret; the probe meters the client's
        # training step, not its masks
        on = row.kind == "peer" or "method.mode=batch" in row.overrides  # secagg by default
        alone = ["method.secure_aggregation=false"] if on else []
        return [
            *common,
            *alone,
            "seed=0",
            "rounds=1",
            "clients.per_round=1",
            "measure.flops=true",
            "measure.memory=true",
            "eval_every=1",
        ]
    return [*common, f"seed={int(unit.removeprefix('seed-'))}"]


def record_path(records: Path, row: Row, unit: str, lr: float | None = None) -> Path:
    name = f"lr={lr:g}" if unit == "screen" else unit
    return records / slug(row.label) / f"{name}.json"


def figures(run_dir: Path) -> dict[str, Any]:
    """A finished run's figures, round by round (evaluated rounds only): test and validation
    accuracy, total client FLOPs and bytes up and down per client so far, memory, forward-mode AD."""
    summary, every = read_run_logs(run_dir)
    n = every[0]["clients"]
    peaks = [x["client_tensor_peak_bytes"] for x in every if "client_tensor_peak_bytes" in x]
    lines = [x for x in every if x.get("test_accuracy") is not None]  # the evaluated rounds
    return {
        "rounds": [x.get("round") for x in lines],
        "test_accuracy_by_round": [x["test_accuracy"] for x in lines],
        "val_accuracy_by_round": [x.get("val_accuracy") for x in lines],
        "cum_client_flops_by_round": [x.get("cum_client_flops") for x in lines],
        "cum_bytes_up_per_client_by_round": [x["cum_bytes_up"] / n for x in lines],
        "cum_bytes_down_per_client_by_round": [x["cum_bytes_down"] / n for x in lines],
        "client_tensor_peak_bytes": max(peaks) if peaks else None,
        "forward_mode_ad": any(x.get("forward_mode_ad") for x in every),
        "client_flops_round1": every[0].get("client_flops"),  # the probe's one client
        # the server's pretraining (warm start rows): its public size and FLOPs, not the clients'
        **({"warm_start": summary["warm_start"]} if "warm_start" in summary else {}),
        "wall_s": summary["wall_s"],
        **({"machines": summary["machines"]} if "machines" in summary else {}),
    }


def run_unit(overrides: list[str], record: Path, out: Path) -> dict[str, Any]:
    """One unit: read from ``record`` when it holds the same resolved config (never rerun), else
    run (resuming ``out``'s checkpoint) and write the record whole. A record of another config is
    an error naming the file to remove."""
    from fedge.experiment.resume import resume_experiment
    from fedge.experiment.run import run_experiment
    from fedge.experiment.rundir import RunDir

    cfg = load_config(BASE, overrides=overrides)
    want = json.loads(json.dumps(resolved_config(cfg), default=str))
    if record.exists():
        saved = json.loads(record.read_text())
        if with_neutral_additions(saved["config"], want) != want:
            raise ConfigError(
                f"{record} records another config than this unit's; expected the same protocol: "
                "remove the record to rerun it, or restore the script that wrote it"
            )
        result: dict[str, Any] = saved["result"]
        return result
    try:
        if (out / "config.yaml").exists() and not RunDir(out).is_complete():
            resume_experiment(out, render=False)
        elif not RunDir(out).is_complete():
            run_experiment(cfg, out=out, render=False)
        result = figures(out)
    except DivergenceError as exc:
        result = {"diverged_round": exc.round, "val_accuracy_by_round": []}
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"config": want, "result": result}, indent=1, sort_keys=True) + "\n")
    tmp.replace(record)
    return result


def read_records(records: Path, methods: Sequence[str]) -> dict[str, Any]:
    """What is recorded: ``screens`` (label -> lr -> result), ``runs`` (label -> seed -> result),
    ``probes`` (label -> result) and the ``rows`` they define (nothing runs)."""
    screens: dict[str, dict[float, dict[str, Any]]] = {}
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    probes: dict[str, dict[str, Any]] = {}
    every = rows({}, methods)
    for _ in range(3):  # dependent rows appear once the screens they need are read
        for row in every.values():
            folder = records / slug(row.label)
            for p in sorted(folder.glob("*.json")):
                result = json.loads(p.read_text())["result"]
                if p.stem.startswith("lr="):
                    screens.setdefault(row.label, {})[float(p.stem[3:])] = result
                elif p.stem.startswith("seed-"):
                    runs.setdefault(row.label, {})[int(p.stem[5:])] = result
                elif p.stem == "probe":
                    probes[row.label] = result
        every = rows(screens, methods)
    return {"screens": screens, "runs": runs, "probes": probes, "rows": every}


def pending(row: Row, screens: dict[str, dict[float, dict[str, Any]]]) -> list[str]:
    """The rows whose screens ``row`` waits for (empty when it can run)."""
    if not row.needs:
        return []
    if row.needs == BP_REF_ROWS:
        return [] if bp_reference(screens) is not None else list(BP_REF_ROWS)
    return [] if chosen_levers(screens) is not None else list(row.needs)


def run_all(
    records: Path,
    out: Path,
    *,
    only_rows: Sequence[str] = (),
    seeds: Sequence[int] = SEEDS,
    max_minutes: float | None = None,
    methods: Sequence[str] = (),
) -> list[str]:
    """Run the units that are not recorded, row by row (screen, then seeds, then the memory probe),
    for the rows in ``only_rows`` (all when empty) and ``seeds``; start no unit after
    ``max_minutes``. Returns the units left (waiting for another row's screen, or for time)."""
    start = time.monotonic()
    left: list[str] = []
    state = read_records(records, methods)
    labels = list(state["rows"])
    unknown = [r for r in only_rows if r not in labels]
    if unknown:
        raise ConfigError(f"--rows {unknown}: not a row of this table; expected some of {labels}")
    for label in labels if not only_rows else list(only_rows):
        state = read_records(records, methods)
        row = state["rows"][label]
        if wait := pending(row, state["screens"]):
            left.append(f"{label}: waits for the screens of {', '.join(wait)}")
            continue
        screened = state["screens"].get(label, {})

        def budget_spent() -> bool:
            return max_minutes is not None and (time.monotonic() - start) / 60 >= max_minutes

        while (lr := picked(row, screened)) is None:
            todo = [x for x in grid(row, screened) if x not in screened]
            if budget_spent():
                break
            for x in todo:
                if budget_spent():
                    break
                rec = record_path(records, row, "screen", x)
                screened[x] = run_unit(
                    unit_overrides(row, x, "screen"), rec, out / rec.parent.name / rec.stem
                )
        if lr is None:
            left.append(f"{label}: screen (time budget spent)")
            continue
        for unit in [*(f"seed-{s}" for s in seeds), "probe"]:
            if budget_spent():
                left.append(f"{label} {unit}: time budget spent")
                continue
            rec = record_path(records, row, unit)
            run_unit(unit_overrides(row, lr[0], unit), rec, out / rec.parent.name / rec.stem)
    return left


# --- the table ----------------------------------------------------------------------------------


def flops_by_round(result: dict[str, Any], probe_flops: float | None) -> list[float] | None:
    """Total client FLOPs (all clients) up to each evaluated round: as metered when the run kept
    the counter on (a K schedule), else the probe's one-client round x ``CLIENTS`` x the round
    number (every round of such a row costs the same: equal IID clients, a fixed K); None while the
    probe is not recorded."""
    metered = result.get("cum_client_flops_by_round") or []
    if metered and all(x is not None for x in metered):
        return [float(x) for x in metered]
    if probe_flops is None:
        return None
    return [float(probe_flops) * CLIENTS * r for r in result["rounds"]]


def flops_to_reach(
    accuracy: Sequence[float | None], flops: Sequence[float], target: float
) -> float | None:
    """Total client FLOPs at the first evaluated round whose test ``accuracy`` reaches ``target``;
    None when none does."""
    for acc, f in zip(accuracy, flops, strict=True):
        if acc is not None and acc >= target:
            return float(f)
    return None


def pareto(points: dict[str, tuple[float, float]]) -> list[str]:
    """The labels of ``points`` (cost, accuracy) on the Pareto front: no other point costs no more
    and reaches at least as much, one of the two strictly."""
    return [
        a
        for a, (ca, xa) in points.items()
        if not any(
            (cb <= ca and xb >= xa) and (cb < ca or xb > xa)
            for b, (cb, xb) in points.items()
            if b != a
        )
    ]


def aggregate(
    runs: dict[int, dict[str, Any]], target: float | None, probe_flops: float | None = None
) -> dict[str, Any] | None:
    """One row's figures over its recorded seeds (None when none is recorded): final accuracy
    mean ± std, best accuracy, total client FLOPs to ``target`` (mean over the seeds reaching it)
    and over the run, bytes per client up and down, whether it ran forward-mode AD."""
    done = {s: r for s, r in sorted(runs.items()) if "diverged_round" not in r}
    if not runs:
        return None
    if not done:
        return {"seeds": len(runs), "diverged": len(runs)}
    finals = [r["test_accuracy_by_round"][-1] for r in done.values()]
    flops = [flops_by_round(r, probe_flops) for r in done.values()]
    known = [f for f in flops if f is not None]
    reach = (
        []
        if target is None or len(known) < len(flops)
        else [
            flops_to_reach(r["test_accuracy_by_round"], f, target)
            for r, f in zip(done.values(), known, strict=True)
        ]
    )
    hit = [x for x in reach if x is not None]
    return {
        "seeds": len(runs),
        "diverged": len(runs) - len(done),
        "mean": statistics.mean(finals),
        "std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
        "finals": finals,
        "best": max(
            max(a for a in r["test_accuracy_by_round"] if a is not None) for r in done.values()
        ),
        "flops_known": len(known) == len(flops),
        "flops_to_target": statistics.mean(hit) if hit else None,
        "reached": len(hit),
        "total_flops": statistics.mean(f[-1] for f in known) if known else None,
        "bytes_up": statistics.mean(
            r["cum_bytes_up_per_client_by_round"][-1] for r in done.values()
        ),
        "bytes_down": statistics.mean(
            r["cum_bytes_down_per_client_by_round"][-1] for r in done.values()
        ),
        "fmad": any(r["forward_mode_ad"] for r in done.values()),
    }


def _e(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


KIND_TITLE = {
    "bp": "Backprop",
    "zo": "Forward-only, inference only",
    "peer": "Forward-only, inference only (peers)",
    "fmad": "Forward-mode AD (jvp; not inference-only)",
    "activity": "Activity perturbation (finite differences of forwards, each layer's weight "
    "gradient formed on the client from its input; not inference-only)",
}


def table(
    records: Path = RECORDS, methods: Sequence[str] | None = None
) -> tuple[str, dict[str, Any]]:
    """The section's body from the records alone, and the aggregates by row."""
    if methods is None:
        from fedge.methods import method_names

        methods = method_names()
    state = read_records(records, methods)
    screens, runs, probes, every = state["screens"], state["runs"], state["probes"], state["rows"]
    ref = bp_reference(screens)

    def probe_flops(label: str) -> float | None:
        return probes.get(label, {}).get("client_flops_round1")

    bp = aggregate(runs.get(ref, {}), None, probe_flops(ref)) if ref else None
    target = bp["mean"] - TARGET_GAP if bp and "mean" in bp else None
    agg = {label: aggregate(runs.get(label, {}), target, probe_flops(label)) for label in every}
    lines = [
        "| row | lr (screen) | seeds | final test acc (mean ± std) | total client FLOPs to target "
        "| total client FLOPs | up / down MB per client | client memory MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, title in KIND_TITLE.items():
        members = [r for r in every.values() if r.kind == kind]
        if not members:
            continue
        lines.append(f"| **{title}** | | | | | | | |")
        for row in members:
            p = picked(row, screens.get(row.label, {}))
            lr = "awaiting screen" if p is None else f"{p[0]:g}"
            a = agg[row.label]
            probe = probes.get(row.label, {})
            mem = _mb(probe.get("client_tensor_peak_bytes"))
            if a is None:
                lines.append(f"| {row.label} | {lr} | 0 | awaiting records | | | | {mem} |")
                continue
            if "mean" not in a:
                lines.append(f"| {row.label} | {lr} | {a['seeds']} | diverged | | | | {mem} |")
                continue
            reach = (
                "awaiting the probe"
                if not a["flops_known"]
                else "-"
                if target is None
                else (
                    f"not reached (best {a['best']:.4f})"
                    if a["reached"] == 0
                    else _e(a["flops_to_target"])
                    + (
                        ""
                        if a["reached"] == len(a["finals"])
                        else f" ({a['reached']}/{len(a['finals'])} seeds)"
                    )
                )
            )
            lines.append(
                f"| {row.label}{' (BP reference)' if row.label == ref else ''} | {lr} | {a['seeds']} "
                f"| {a['mean']:.4f} ± {a['std']:.4f} | {reach} | {_e(a['total_flops'])} "
                f"| {_mb(a['bytes_up'])} / {_mb(a['bytes_down'])} | {mem} |"
            )
    levers = chosen_levers(screens)
    lines += [
        "",
        "BP reference (the better BP FedAvg recipe on validation): "
        + (ref or "awaiting the BP screens")
        + (f"; target {target:.4f} (its final mean less 1 point)." if target is not None else "."),
        "Levers combined (each beat BAFFLE K=100's screen on validation): "
        + (
            "awaiting the lever screens." if levers is None else (", ".join(levers) or "none") + "."
        ),
        warm_start_note(state),
        "",
        verdict_sentence(agg, every, ref, run_walls(runs)),
        "",
        quality_note(records),
        "",
        "CPU-minutes a row (all its recorded units: screen, seeds, probe; one core each; each "
        "record names the machines its rounds ran on where the run logged them): "
        + (
            "; ".join(f"{label} {minutes:.1f}" for label, minutes in cpu_minutes(state).items())
            or "none recorded"
        )
        + ".",
    ]
    return "\n".join(lines), agg


def warm_start_note(state: dict[str, Any]) -> str:
    """What the warm-start rows' server did, from their records: the public set's size and
    source and the server's pretraining FLOPs (apart from the clients' in the table)."""
    seen = [
        r["warm_start"]
        for units in state["runs"].values()
        for r in units.values()
        if r.get("warm_start")
    ]
    head = (
        f"Warm start rows: the server pretrains on {PUBLIC:,} Fashion-MNIST training images that "
        "dataset.limit_train leaves out of the run (no client's, not the validation set's; the "
        "clients' data and the initial model's seed are the other rows'), 5 epochs of Adam "
        "(lr 0.001, batch 32), and every warm-start row fine-tunes that one start; "
    )
    if not seen:
        return head + "server FLOPs: awaiting records."
    flops = sorted({w["server_flops"] for w in seen})
    public = sorted({w["public"] for w in seen})
    return (
        head
        + f"server pretraining FLOPs {', '.join(_e(f) for f in flops)} a run (torch's counter; not "
        + f"in the client FLOPs above), public set {', '.join(f'{p:,}' for p in public)} samples."
    )


def cpu_minutes(state: dict[str, Any]) -> dict[str, float]:
    """Minutes of wall time per row over its recorded units (one core each)."""
    out: dict[str, float] = {}
    for kind in ("screens", "runs"):
        for label, units in state[kind].items():
            for r in units.values():
                out[label] = out.get(label, 0.0) + r.get("wall_s", 0.0) / 60
    for label, r in state["probes"].items():
        out[label] = out.get(label, 0.0) + r.get("wall_s", 0.0) / 60
    return {k: out[k] for k in state["rows"] if k in out}


def best_row(agg: dict[str, Any], every: dict[str, Row], kinds: Sequence[str]) -> str | None:
    """The row of ``kinds`` with the highest mean final accuracy among those with every seed
    recorded (a row with fewer seeds is not yet a result to name)."""
    done = {
        k: a
        for k, a in agg.items()
        if a and "mean" in a and a["seeds"] >= len(SEEDS) and every[k].kind in kinds
    }
    return max(done, key=lambda k: (done[k]["mean"], k)) if done else None


def run_walls(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each row's mean wall time of a seed's run (its records' ``wall_s``; evaluation included)."""
    return {
        label: statistics.fmean(r["wall_s"] for r in units.values())
        for label, units in runs.items()
        if units and all("wall_s" in r for r in units.values())
    }


def verdict_sentence(
    agg: dict[str, Any],
    every: dict[str, Row],
    ref: str | None,
    walls: dict[str, float] | None = None,
) -> str:
    """The plain verdict: the best inference-only row (and the best forward-mode one apart), its
    gap in points to the BP reference and its total-client-FLOPs ratio, met or missed; with
    ``walls`` (:func:`run_walls`), also its runs' wall time over BP's on this machine, which
    counts what torch's FLOP counter does not (elementwise work, per-direction overhead)."""
    walls = walls or {}
    bp = agg.get(ref) if ref else None
    best = best_row(agg, every, ("zo", "peer"))
    if bp is None or "mean" not in bp or best is None:
        return "Verdict: awaiting records (the BP reference and at least one forward-only row)."
    out = []
    for label in [best, best_row(agg, every, ("fmad",)), best_row(agg, every, ("activity",))]:
        if label is None:
            continue
        a = agg[label]
        gap = 100 * (bp["mean"] - a["mean"])
        if a["total_flops"] is None or bp["total_flops"] is None:
            out.append(
                f"{label} at {a['mean']:.4f}, {gap:.2f} points below BP; FLOPs await the probes"
            )
            continue
        ratio = a["total_flops"] / bp["total_flops"]
        met = gap <= 100 * TARGET_GAP and ratio <= FLOPS_RATIO
        kind = {"fmad": "forward-mode-AD", "activity": "activity-perturbation"}.get(
            every[label].kind, "forward-only"
        )
        wall = (
            f" (its runs took {walls[label] / walls[ref]:.1f}x BP's wall time by the records, "
            "one core each, evaluation included)"
            if ref and label in walls and ref in walls and walls[ref] > 0
            else ""
        )
        out.append(
            f"the best {kind} row is {label} at {a['mean']:.4f}, {gap:.2f} points below BP "
            f"({ref}, {bp['mean']:.4f}) at {ratio:.1f}x its total client FLOPs{wall}: the "
            "1-point / 10x " + ("target is met" if met else "target is not met")
        )
    return "Verdict: " + "; ".join(out) + "; " + within_budget(agg, every, bp) + "."


def within_budget(agg: dict[str, Any], every: dict[str, Row], bp: dict[str, Any]) -> str:
    """The best inference-only row (every seed recorded) whose total client FLOPs stay within the
    target's ratio of the BP reference's, and its gap: the frontier at the issue's budget (an
    inference-only client spends K + 1 forwards a sample, BP about 2, so the ratio caps K); ``bp``
    the BP reference's aggregate."""
    fits = {
        k: a
        for k, a in agg.items()
        if a
        and "mean" in a
        and a["seeds"] >= len(SEEDS)
        and every[k].kind in ("zo", "peer")
        and a["total_flops"] is not None
        and a["total_flops"] <= FLOPS_RATIO * bp["total_flops"]
    }
    if not fits:
        return f"no inference-only row runs within {FLOPS_RATIO:g}x BP's total client FLOPs"
    label = max(fits, key=lambda k: (fits[k]["mean"], k))
    a = fits[label]
    return (
        f"within {FLOPS_RATIO:g}x BP's total client FLOPs the best inference-only row is {label} at "
        f"{a['mean']:.4f}, {100 * (bp['mean'] - a['mean']):.2f} points below BP "
        f"({a['total_flops'] / bp['total_flops']:.1f}x)"
    )


def figure(agg: dict[str, Any], every: dict[str, Row], path: Path = FIGURE) -> list[str]:
    """Accuracy against total client FLOPs (log x) and against total bytes per client, one point a
    row (mean, with the seeds' std as a bar), the Pareto front of each panel marked, one legend
    beside them. A row's marker names its kind (square BP, circle zeroth-order, triangle peer,
    diamond jvp, plus activity); its colour, and from a kind's 11th row on a hollow marker, tell
    the rows of a kind apart, the same in both panels. Returns the front's labels on FLOPs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = {k: a for k, a in agg.items() if a and "mean" in a and a["total_flops"] is not None}
    nth = {k: [r for r in done if every[r].kind == every[k].kind].index(k) for k in done}
    fig, axes = plt.subplots(1, 2, figsize=(15, 5), layout="constrained")
    fronts = []
    for ax, (name, cost) in zip(
        axes,
        (
            ("total client FLOPs", lambda a: a["total_flops"]),
            ("total bytes per client (up + down)", lambda a: a["bytes_up"] + a["bytes_down"]),
        ),
        strict=True,
    ):
        points = {k: (cost(a), a["mean"]) for k, a in done.items()}
        front = pareto(points)
        fronts.append(front)
        for k, (c, m) in points.items():
            marker = {"bp": "s", "zo": "o", "peer": "^", "fmad": "D", "activity": "P"}[
                every[k].kind
            ]
            ax.errorbar(
                c,
                m,
                yerr=done[k]["std"],
                fmt=marker,
                color=f"C{nth[k] % 10}",
                markerfacecolor=f"C{nth[k] % 10}" if nth[k] < 10 else "none",
                capsize=3,
                label=k,
            )
        if front:
            xs = sorted((points[k] for k in front), key=lambda p: p[0])
            ax.plot([p[0] for p in xs], [p[1] for p in xs], "k--", lw=1, label="Pareto front")
            ax.scatter(
                [p[0] for p in xs], [p[1] for p in xs], s=220, facecolors="none", edgecolors="k"
            )  # each point on the front ringed
        ax.set_xscale("log")
        ax.set_xlabel(name + " (log)")
        ax.set_ylabel("final test accuracy")
    fig.legend(*axes[1].get_legend_handles_labels(), loc="outside right center", fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fronts[0]


INTRO = __doc__.split("**Resumable units**")[0].split("\n\n", 1)[1].strip()
COMMAND = "python benchmarks/zo_frontier.py --table-only --docs docs/benchmarks.md"


def section(records: Path = RECORDS, methods: Sequence[str] | None = None) -> str:
    """The docs section: the protocol, the command, the table, the figure and the verdict."""
    body, _ = table(records, methods)
    rel = FIGURE.relative_to(ROOT / "docs").as_posix()
    return "\n".join(
        [
            INTRO,
            "",
            "Run per row (one core each, resumable): `OMP_NUM_THREADS=1 taskset -c I python "
            'benchmarks/zo_frontier.py --rows "ROW" --seeds 0 1 2`; render: '
            f"`{COMMAND}`",
            "",
            body,
            "",
            f"![accuracy against total client FLOPs and bytes]({rel})",
        ]
    )


# --- what one estimate is worth, on this MLP and on BAFFLE's LeNet -------------------------------

QUALITY = RECORDS / "estimate-quality.json"
#: the models compared: this table's MLP and the LeNet of BAFFLE Table 1 (Hardswish, GroupNorm)
QUALITY_MODELS: dict[str, dict[str, Any]] = {
    "frontier MLP 784-32-10": {"name": "mlp", "hidden": [32], "activation": "relu", "norm": "none"},
    "BAFFLE's LeNet (Table 1)": {"name": "lenet", "activation": "hardswish", "norm": "group"},
}
#: label -> (estimator, K): the rows' three, and activity at a K whose FLOPs on the LeNet stay
#: within the issue's 10x BP (about 1 forward a direction there: conv1's suffix is the network)
QUALITY_ESTIMATORS = {
    "BAFFLE K=100 (weights)": ("weights", 100),
    f"jvp K={JVP_K} (weights)": ("jvp", JVP_K),
    f"activity K={ACTIVITY_K} (layer outputs)": ("activity", ACTIVITY_K),
    "activity K=25 (layer outputs)": ("activity", 25),
}
QUALITY_BATCH, QUALITY_REPEATS, QUALITY_SIGMA = 20, 5, 1e-4
#: local heads (method.local_heads, Ren et al.'s local losses) closing the named blocks, by model:
#: on the LeNet one after conv1's block cuts conv1's perturbed forwards from the network to the
#: head; on the MLP a head before the classifier would be the classifier again
QUALITY_HEADS: dict[str, tuple[str, ...]] = {"BAFFLE's LeNet (Table 1)": ("features.conv1",)}
#: label -> K of the activity estimates with those heads (global average pooling, head_pool 1)
QUALITY_HEAD_ESTIMATORS = {
    "activity K=25, local head after conv1": 25,
    "activity K=100, local head after conv1": 100,
}
#: the record's entry of the local objective's exact gradient (then ", G loss groups" and
#: ", PxP patches" where they apply)
EXACT_LOCAL = "local objective's exact gradient"
#: label -> (K, G, P) of the same heads with cell losses (Ren et al.'s group-wise and patch-wise
#: local losses): G channel groups (method.head_groups; 2 is GroupNorm's own grouping of conv1's 16
#: channels, no path between loss groups through its statistics; 16 one loss a channel, those
#: paths stopped) and P x P patches of its 14 x 14 block output (method.head_patches)
QUALITY_GROUP_ESTIMATORS = {
    "activity K=25, local head after conv1, 16 loss groups": (25, 16, 1),
    "activity K=100, local head after conv1, 2 loss groups": (100, 2, 1),
    "activity K=100, local head after conv1, 16 loss groups": (100, 16, 1),
    "activity K=25, local head after conv1, 16 loss groups x 7x7 patches": (25, 16, 7),
    "activity K=100, local head after conv1, 16 loss groups x 2x2 patches": (100, 16, 2),
    "activity K=100, local head after conv1, 16 loss groups x 7x7 patches": (100, 16, 7),
}


#: local heads closing every conv block of the LeNet (conv1's and conv2's): each conv scored by
#: its own head, only the classifier by the network's loss; label -> (K, G, P), the heads' cells
QUALITY_EVERY_BLOCK: dict[str, tuple[str, ...]] = {
    "BAFFLE's LeNet (Table 1)": ("features.conv1", "features.conv2")
}
QUALITY_EVERY_BLOCK_ESTIMATORS = {
    "activity K=25, local heads after conv1 and conv2": (25, 1, 1),
    "activity K=25, local heads after conv1 and conv2, 16 loss groups x 7x7 patches": (25, 16, 7),
}
EVERY_BLOCK = ", local heads after conv1 and conv2"


def _exact_label(groups: int, patches: int, *, every: bool = False) -> str:
    """The record's entry of the exact gradient of the objective with these cells (``every``:
    heads closing every conv block)."""
    return (
        EXACT_LOCAL
        + (EVERY_BLOCK if every else "")
        + (f", {groups} loss groups" if groups > 1 else "")
        + (f", {patches}x{patches} patches" if patches > 1 else "")
    )


def _per_sample_flops(fn: Any, batch: int) -> tuple[Any, float]:
    """``fn()`` and its FLOPs a sample by torch's counter."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = fn()
    return out, counter.get_total_flops() / batch


def _wall(fn: Any, repeats: int = 1) -> float:
    """The least wall time of ``repeats`` calls of ``fn()`` (no FLOP counter running)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def model_quality(
    net: Any,
    x: Any,
    y: Any,
    repeats: int,
    heads_at: Sequence[str] = (),
    every_block: Sequence[str] = (),
) -> dict[str, Any]:
    """One model's entry of :func:`estimate_quality` on the batch ``(x, y)``; with ``heads_at``,
    also the activity estimates scored by local heads closing those blocks, and with
    ``every_block`` those of :data:`QUALITY_EVERY_BLOCK_ESTIMATORS`, heads closing all of them."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from fedge.estimators import backprop_gradient, zeroth_order_gradient
    from fedge.estimators.activity import activity_gradient, activity_layers
    from fedge.estimators.local_objective import local_objective_gradient
    from fedge.methods.baffle.heads import block_ends, build_heads

    net.eval()
    layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    owned = {id(q) for m in layers for q in m.parameters()}
    names = [n for n, q in net.named_parameters() if id(q) in owned]
    outs: list[int] = []  # each estimated layer's outputs a sample, from one forward
    hooks = [m.register_forward_hook(lambda mod, i, o: outs.append(o[0].numel())) for m in layers]
    with torch.no_grad():
        net(x[:1])
    for h in hooks:
        h.remove()

    def flat(g: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([g[n].detach().flatten().double() for n in names])

    estimated = activity_layers(net, names)
    blocks = {  # kind -> the blocks its heads close
        "heads": block_ends(net, heads_at, estimated) if heads_at else [],
        "every": block_ends(net, every_block, estimated) if every_block else [],
    }
    cells: dict[str, set[tuple[int, int]]] = {
        "heads": {(g, p) for _, g, p in QUALITY_GROUP_ESTIMATORS.values()} | {(1, 1)},
        "every": {(g, p) for _, g, p in QUALITY_EVERY_BLOCK_ESTIMATORS.values()},
    }
    grouped = {  # (kind, G) -> the heads with G classifiers each
        (kind, g): build_heads(
            net, ends, input_shape=tuple(x.shape[1:]), num_classes=10, pool=1, seed=0, groups=g
        )
        for kind, ends in blocks.items()
        if ends
        for g in sorted({g for g, _ in cells[kind]})
    }
    heads = grouped.get(("heads", 1))

    def estimate(
        kind: str, k: int, seed: int, groups: int = 1, patches: int = 1
    ) -> dict[str, torch.Tensor]:
        if kind in ("activity", "heads", "every"):
            return activity_gradient(
                net,
                (x, y),
                k=k,
                sigma=QUALITY_SIGMA,
                scheme="forward",
                seed=seed,
                params=names,
                heads=grouped[kind, groups] if kind != "activity" else None,
                head_groups=groups,
                head_patches=patches,
            )
        return zeroth_order_gradient(
            net,
            F.cross_entropy,
            (x, y),
            k=k,
            sigma=QUALITY_SIGMA,
            scheme="forward",
            mode="jvp" if kind == "jvp" else "fast",
            seed=seed,
            params=names,
        )

    true, bp = _per_sample_flops(
        lambda: backprop_gradient(net, F.cross_entropy, (x, y), params=names), len(y)
    )
    ref = flat(true)
    exact = {  # (kind, G, P) -> the gradient of the objective the estimate with those targets
        (kind, g, p): local_objective_gradient(
            net, grouped[kind, g], (x, y), groups=g, patches=p, params=names
        )
        for kind, ends in blocks.items()
        if ends
        for g, p in sorted(cells[kind])
    }
    locals_ = {c: flat(e) for c, e in exact.items()}
    bp_wall = _wall(lambda: backprop_gradient(net, F.cross_entropy, (x, y), params=names), 5)
    out: dict[str, Any] = {}
    runs: dict[str, tuple[str, int, int, int]] = {
        **{label: (kind, k, 1, 1) for label, (kind, k) in QUALITY_ESTIMATORS.items()},
        **({k: ("heads", v, 1, 1) for k, v in QUALITY_HEAD_ESTIMATORS.items()} if heads else {}),
        **({k: ("heads", *v) for k, v in QUALITY_GROUP_ESTIMATORS.items()} if heads else {}),
        **(
            {k: ("every", *v) for k, v in QUALITY_EVERY_BLOCK_ESTIMATORS.items()}
            if blocks["every"]
            else {}
        ),
    }
    first = names[0]  # the layer a head after conv1's block scores

    def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.flatten().double(), b.flatten().double()
        return float(a @ b / (a.norm() * b.norm()))

    for label, (kind, k, groups, patches) in runs.items():
        cos, cos_local, cos_first, flops = [], [], [], 0.0
        for s in range(repeats):
            g, flops = _per_sample_flops(
                lambda: estimate(kind, k, 1000 + s, groups, patches),  # noqa: B023
                len(y),
            )
            v = flat(g)
            cos.append(cosine(v, ref))
            if kind in ("heads", "every"):
                cos_local.append(cosine(v, locals_[kind, groups, patches]))
                cos_first.append(cosine(g[first], exact[kind, groups, patches][first]))
        out[label] = {
            "cos_mean": statistics.fmean(cos),
            "cos_std": statistics.stdev(cos),
            "flops_per_sample": flops,
            "flops_over_bp": flops / bp,
            "wall_over_bp": _wall(
                lambda: estimate(kind, k, 1000, groups, patches),  # noqa: B023
                3,
            )
            / bp_wall,
        }
        if cos_local:  # against the objective it follows; conv1's alone too
            out[label] |= {
                "cos_local_mean": statistics.fmean(cos_local),
                "cos_local_std": statistics.stdev(cos_local),
                "cos_local_first_layer_mean": statistics.fmean(cos_first),
                "cos_local_first_layer_std": statistics.stdev(cos_first),
            }
    for (kind, groups, patches), grad in exact.items():  # each local objective's vs the global
        a, b = (g[names[0]].flatten().double() for g in (grad, true))
        local = locals_[kind, groups, patches]
        out[_exact_label(groups, patches, every=kind == "every")] = {
            "cos_mean": float(local @ ref / (local.norm() * ref.norm())),
            "cos_first_layer": float(a @ b / (a.norm() * b.norm())),  # the layer the head re-aims
        }
    return {
        "n": sum(int(q.numel()) for n, q in net.named_parameters() if n in names),
        "d_z": sum(outs),
        "bp_flops_per_sample": bp,
        "estimators": out,
    }


def estimate_quality(repeats: int = QUALITY_REPEATS) -> dict[str, Any]:
    """cos(ĝ, ∇L) of one estimate of each of :data:`QUALITY_ESTIMATORS` against autograd's gradient
    (mean and std over ``repeats`` perturbation seeds), for each of :data:`QUALITY_MODELS` at its
    seed-0 initialisation, on one batch of the rows' 20 Fashion-MNIST training images, over the
    weights and biases of the linear and convolutional layers (the parameters activity
    perturbation can estimate; the LeNet's GroupNorm affines are left out for every estimator
    alike); and each estimate's client FLOPs a sample by torch's counter, over one backprop
    gradient's, and its wall time over a backprop gradient's (the least of 3 calls against the
    least of 5, one thread: what the counter leaves out, elementwise work and per-direction
    overhead, shows there). Also each model's estimated parameters n and its estimated layers'
    outputs a sample d_z: a weight-perturbation cosine goes about as sqrt(K/n), an activity one
    with d_z. With :data:`QUALITY_HEADS`, the activity estimates scored by local heads too, with
    their cosine with the local objective's exact gradient beside the global one's."""
    from fedge.bench.measured import machine_facts
    from fedge.core.threads import torch_threads
    from fedge.data import load_dataset
    from fedge.models import build_model

    start = time.monotonic()
    data = load_dataset("fashion-mnist", limit_train=TRAIN + VALIDATION, seed=0)
    x, y = data.x_train[:QUALITY_BATCH], data.y_train[:QUALITY_BATCH]
    models = {}
    for label, opts in QUALITY_MODELS.items():
        kw = {k: v for k, v in opts.items() if k != "name"}
        net = build_model(opts["name"], input_shape=(1, 28, 28), num_classes=10, seed=0, **kw)
        with torch_threads(1):  # the rows' one thread: the same sums, so the same cosines
            models[label] = model_quality(
                net,
                x,
                y,
                repeats,
                QUALITY_HEADS.get(label, ()),
                QUALITY_EVERY_BLOCK.get(label, ()),
            )
    return {
        "config": {
            "models": QUALITY_MODELS,
            "estimators": {k: list(v) for k, v in QUALITY_ESTIMATORS.items()},
            "local_heads": {
                "models": QUALITY_HEADS,
                "estimators": QUALITY_HEAD_ESTIMATORS,
                "group_estimators": {k: list(v) for k, v in QUALITY_GROUP_ESTIMATORS.items()},
                "every_block": {
                    "models": QUALITY_EVERY_BLOCK,
                    "estimators": {k: list(v) for k, v in QUALITY_EVERY_BLOCK_ESTIMATORS.items()},
                },
                "head_pool": 1,
            },  # fmt: skip
            "batch": QUALITY_BATCH,
            "repeats": repeats,
            "sigma": QUALITY_SIGMA,
            "scheme": "forward",
            "seeds": [1000 + s for s in range(repeats)],
        },
        "result": {
            "models": models,
            "wall_s": time.monotonic() - start,
            "machine": machine_facts(),
        },
    }


def quality_note(records: Path = RECORDS) -> str:
    """What one estimate is worth on this table's MLP and on BAFFLE's LeNet, from the record of
    :func:`estimate_quality` (``--quality`` writes it): why the activity row's lead is a finding
    about this narrow MLP that does not carry over to a convolutional network."""
    path = records / QUALITY.name
    if not path.exists():
        return (
            "What one estimate is worth by model: awaiting its record "
            "(`python benchmarks/zo_frontier.py --quality`)."
        )
    rec = json.loads(path.read_text())
    cfg, res = rec["config"], rec["result"]
    parts = []
    for label, m in res["models"].items():
        cells = "; ".join(
            f"{name} {e['cos_mean']:.3f} ± {e['cos_std']:.3f} at {e['flops_over_bp']:.1f}x BP's FLOPs"
            + (f" ({e['wall_over_bp']:.0f}x its wall)" if "wall_over_bp" in e else "")
            for name, e in m["estimators"].items()
            if "cos_std" in e  # the local objective's exact gradient: its own sentence
        )
        parts.append(
            f"{label} (n = {m['n']:,} parameters, d_z = {m['d_z']:,} outputs a sample): {cells}"
        )
    mlp, lenet = (res["models"][k] for k in QUALITY_MODELS)
    weights, _, act, act25 = QUALITY_ESTIMATORS

    def cos(m: dict[str, Any], name: str) -> str:
        return f"{m['estimators'][name]['cos_mean']:.3f}"

    def ratio(m: dict[str, Any], name: str) -> str:
        return f"{m['estimators'][name]['flops_over_bp']:.1f}x"

    return (
        "**What one estimate is worth, by model** (`python benchmarks/zo_frontier.py --quality`; "
        f"cosine with autograd's gradient of one batch of {cfg['batch']} at the seed-0 "
        f"initialisation, mean ± std over {cfg['repeats']} perturbation seeds, σ = "
        f"{cfg['sigma']:g}, forward differences, over the linear and convolutional layers' "
        "weights and biases; client FLOPs a sample by torch's counter over one backprop "
        "gradient's): "
        + ". ".join(parts)
        + f". Perturbing layer outputs instead of weights gives the closer estimate on both "
        f"models (cosine {cos(mlp, act)} on the MLP and {cos(lenet, act)} on the LeNet, against "
        f"{cos(mlp, weights)} and {cos(lenet, weights)} for BAFFLE K=100), but its cost does not "
        f"carry over: on this MLP a direction runs only the 32-to-10 layer after fc1 "
        f"({ratio(mlp, act)} BP's FLOPs at K = {ACTIVITY_K}), on the LeNet a direction of conv1's "
        f"outputs runs nearly the whole network ({ratio(lenet, act)} at K = {ACTIVITY_K}; "
        f"{ratio(lenet, act25)} at K = 25, cosine {cos(lenet, act25)}). The activity row's "
        f"{ratio(mlp, act)} is a property of this narrow MLP: on a convolutional network the 10x "
        "budget holds K to about 25, and whether that trains to within 1 point of BP is not "
        "measured here." + _heads_note(lenet, act)
    )


def _heads_note(lenet: dict[str, Any], act: str) -> str:
    """The local-heads sentence of :func:`quality_note`, when the record has those estimates."""
    est = lenet["estimators"]
    headed, exact = list(QUALITY_HEAD_ESTIMATORS)[-1], est.get(EXACT_LOCAL)
    if headed not in est or exact is None or "wall_over_bp" not in est[act]:
        return ""
    h, a = est[headed], est[act]
    return (
        f" **Local heads** (`method.local_heads=[features.conv1]`: global average pooling and a "
        f"linear classifier closing conv1's block, Ren et al.'s local losses) stop conv1's perturbed "
        f"forwards at the head: {headed} costs {h['flops_over_bp']:.2f}x BP's FLOPs (without the "
        f"head {a['flops_over_bp']:.1f}x), its cosine with the global gradient "
        f"{h['cos_mean']:.3f} ({h['cos_local_mean']:.3f} with the local objective's, whose exact "
        f"gradient has cosine {exact['cos_mean']:.3f} with the global one over all layers but "
        f"{exact['cos_first_layer']:.3f} on conv1's weights: the head gives conv1 an objective of "
        f"its own). Its wall time falls far less, from {a['wall_over_bp']:.0f}x to "
        f"{h['wall_over_bp']:.0f}x a backprop gradient's: drawing the K perturbations of every "
        "output and running GroupNorm, Hardswish and pooling over the K perturbed copies is "
        "elementwise work torch's FLOP counter does not count. Wall ratios are this CPU's, one "
        "thread, with per-direction overhead included (on the MLP it dominates: a tiny backprop "
        "step against K loops of small kernels)."
        + _groups_note(est, exact)
        + _every_block_note(est)
    )


def _groups_note(est: dict[str, Any], exact: dict[str, Any]) -> str:
    """The cell-loss sentence of :func:`_heads_note`, when the record has those estimates."""
    rows = {tuple(v): k for k, v in QUALITY_GROUP_ESTIMATORS.items() if k in est}
    if not rows:
        return ""

    def local(label: str) -> str:
        e = est[label]
        first = e.get("cos_local_first_layer_mean")
        return f"{e['cos_local_mean']:.3f}" + (
            f" (conv1's {first:.3f} ± {e['cos_local_first_layer_std']:.3f})" if first else ""
        )

    def named(g: int, p: int) -> str:
        return f"{g} groups" + (f" x {p}x{p} patches" if p > 1 else "")

    cells = "; ".join(
        f"{named(g, p)} at K = {k}: {local(label)} with its objective's gradient, "
        f"{est[label]['cos_mean']:.3f} with the global one, {est[label]['flops_over_bp']:.2f}x "
        f"BP's FLOPs ({est[label]['wall_over_bp']:.0f}x its wall)"
        for (k, g, p), label in sorted(rows.items())
    )
    objectives = "; ".join(
        f"{named(g, p)} {e['cos_mean']:.3f} ({e['cos_first_layer']:.3f} on conv1's weights)"
        for g, p in sorted({(g, p) for _, g, p in rows})
        if (e := est.get(_exact_label(g, p))) is not None
    )
    return (
        " **Cell losses** (Ren et al.'s group-wise and patch-wise local losses: "
        "`method.head_groups` gives the head one classifier per group of conv1's 16 channels, "
        "`method.head_patches` splits the block's 14x14 output into patches; each cell's loss "
        "moves only with its own group's share of its own patch's pooled features, and conv1 "
        f"weights each output's perturbation by its own cell's loss): {cells}; one loss a head: "
        + "; ".join(
            f"K = {k}: {local(label)}"
            for label, k in QUALITY_HEAD_ESTIMATORS.items()
            if label in est
        )
        + " with its objective's gradient. The whole-model cosines move little between cell "
        "layouts: conv2 and the classifier, after the head and scored by the network's loss, "
        "carry most of the gradient; conv1's own cosine is where the cell losses act. "
        + "Each objective's exact "
        f"gradient against the global one: {objectives} (one loss: {exact['cos_mean']:.3f}). "
        "With 2 groups, GroupNorm's own, no path between loss groups runs through the norm's "
        "statistics; with 16, and between patches, those paths are stopped."
    )


def _every_block_note(est: dict[str, Any]) -> str:
    """The sentence on heads closing every conv block, when the record has those estimates."""
    rows = {k: v for k, v in QUALITY_EVERY_BLOCK_ESTIMATORS.items() if k in est}
    if not rows:
        return ""

    def cell(label: str, k: int, g: int, p: int) -> str:
        e = est[label]
        layout = "one loss a head" if g == p == 1 else f"{g} groups x {p}x{p} patches"
        exact = est.get(_exact_label(g, p, every=True), {}).get("cos_mean")
        return (
            f"{layout} at K = {k}: {e['cos_local_mean']:.3f} with its objective's gradient "
            f"(conv1's {e['cos_local_first_layer_mean']:.3f}), {e['cos_mean']:.3f} with the "
            f"global one, {e['flops_over_bp']:.2f}x BP's FLOPs ({e['wall_over_bp']:.0f}x its "
            "wall)"
            + (f", the objective's exact gradient {exact:.3f} with the global" if exact else "")
        )

    return (
        " **Every conv block local** (`method.local_heads=[features.conv1, features.conv2]`: only "
        "the classifier scored by the network's loss): "
        + "; ".join(cell(label, *v) for label, v in rows.items())
        + ". The cells make the estimate nearly the local objective's gradient at K = 25, and that "
        "objective is far from the network's: the local losses trade the estimate's noise for "
        "the objective's bias, and what that costs in accuracy is a training question."
    )


# --- cost estimate ------------------------------------------------------------------------------

FLOP_PER_SAMPLE = {
    "bp": 102_272.0,
    "forward": 50_900.0,
    "jvp_direction": 152_400.0,
    # activity (torch's counter, exact): the clean forward and each layer's local map (a forward's
    # FLOPs again: 101,632) plus one base suffix pass (640); then per direction the suffix after
    # fc1 (640) and the accumulation of Σ Δℓ u over fc1's 32 and the output's 10 units (84)
    "activity_fixed": 102_272.0,
    "activity_direction": 724.0,
}
# Measured here, FLOP counter off (one core, 300 samples of one client; FedKSeed assumed BP's).
MEASURED_FLOPS_PER_S = {
    "bp": 2.1e9,
    "zo": 3.15e9,
    "peer": 2.1e9,
    "fmad": 2.06e9,
    # activity K = 100: 20 ms a step of 20 samples (3.49 MFLOP) on one loaded core (load ~12 on 2
    # cores: an upper bound on its time); small passes, so call overhead, not FLOPs, sets the rate
    "activity": 0.17e9,
}
COUNTED_FLOPS_PER_S = 1.33e9  # BAFFLE with the counter on (rows with a K schedule keep it on)
NOMINAL_FLOPS_PER_S = 100e9
EVAL_S = (
    2.0  # measured: a BP FedAvg round took 2.5 s of which 0.5 s training (evaluation, overhead)
)


def estimate(row: Row) -> dict[str, float]:
    """A row's client FLOPs for its 3 seeds and a screen of 5 lrs (at most, widening included) of
    ``SCREEN_ROUNDS`` rounds, with evaluation; CPU-hours nominal and at the measured rates."""
    o = dict(x.split("=", 1) for x in row.overrides)
    k = int(o.get("method.k", 100))
    k_final = int(o.get("method.k_final", k))
    k_mean = (k + k_final) / 2
    if row.kind == "bp":
        per = FLOP_PER_SAMPLE["bp"]
    elif row.kind == "fmad":
        per = k_mean * FLOP_PER_SAMPLE["jvp_direction"]
    elif row.kind == "activity":
        per = FLOP_PER_SAMPLE["activity_fixed"] + k_mean * FLOP_PER_SAMPLE["activity_direction"]
    elif row.kind == "peer":
        per = 2 * FLOP_PER_SAMPLE["forward"]
    else:
        per = (k_mean + 1) * FLOP_PER_SAMPLE["forward"]
    run = TRAIN * ROUNDS * per + ROUNDS * (VALIDATION + 10_000) * FLOP_PER_SAMPLE["forward"]
    total = run * (len(SEEDS) + 5 * SCREEN_ROUNDS / ROUNDS)
    rate = COUNTED_FLOPS_PER_S if "method.k_final" in o else MEASURED_FLOPS_PER_S[row.kind]
    evals = ROUNDS * (len(SEEDS) + 5 * SCREEN_ROUNDS / ROUNDS)
    return {
        "flops": total,
        "nominal_h": total / NOMINAL_FLOPS_PER_S / 3600,
        "measured_h": (total / rate + evals * EVAL_S) / 3600,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", nargs="*", default=[], metavar="ROW", help="run only these rows")
    ap.add_argument(
        "--seeds", nargs="*", type=int, default=list(SEEDS), help="seeds (default 0 1 2)"
    )
    ap.add_argument("--max-minutes", type=float, default=None, help="start no unit after this")
    ap.add_argument("--out", default="runs/bench-zo-frontier", help="run directories (checkpoints)")
    ap.add_argument("--records", default=str(RECORDS), help=argparse.SUPPRESS)
    ap.add_argument(
        "--docs",
        default=None,
        help="rewrite the zo-frontier section of this file and the peer comparison (its records)",
    )
    ap.add_argument("--table-only", action="store_true", help="render the records, run nothing")
    ap.add_argument("--estimate", action="store_true", help="print each row's cost, run nothing")
    ap.add_argument(
        "--quality",
        action="store_true",
        help="measure one estimate's cosine and FLOPs by model (a minute; its record), run no row",
    )
    args = ap.parse_args(argv)
    from fedge.methods import method_names

    methods = method_names()
    records = Path(args.records)
    if args.estimate:
        total = {"nominal_h": 0.0, "measured_h": 0.0}
        for row in rows({}, methods).values():
            e = estimate(row)
            total = {k: total[k] + e[k] for k in total}
            print(
                f"{row.label}: {e['flops']:.2e} FLOP, {e['nominal_h']:.3f} CPU-h at 100 GFLOP/s, "
                f"{e['measured_h']:.2f} CPU-h at the measured rate"
            )
        print(f"table: {total['nominal_h']:.2f} CPU-h nominal, {total['measured_h']:.1f} measured")
        return 0
    if bad := [s for s in args.seeds if s not in SEEDS]:
        ap.error(f"--seeds {bad}: expected some of {list(SEEDS)}")
    if args.quality:
        from fedge.bench.measured import write_record

        write_record(records / QUALITY.name, estimate_quality())
    elif not args.table_only:
        try:
            left = run_all(
                records,
                Path(args.out),
                only_rows=args.rows,
                seeds=args.seeds,
                max_minutes=args.max_minutes,
                methods=methods,
            )
        except ConfigError as e:
            ap.error(str(e))
        for line in left:
            print("left:", line)
    text = section(records, methods)
    print(text)
    if args.docs:
        _, agg = table(records, methods)
        figure(agg, rows(read_records(records, methods)["screens"], methods))
        update_section(
            args.docs,
            "zo-frontier",
            "The zeroth-order frontier: forward-only clients against backprop (issue 45)",
            text,
            machine=records_line(records, root=ROOT),
        )
        import peer_comparison  # issue 44's comparison, read from the same records

        peer_comparison.render(records, args.docs, methods)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
