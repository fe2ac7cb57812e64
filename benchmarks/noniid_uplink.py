"""Non-IID devices and slow uplinks (issue 46): FedAvg, FedProx, SCAFFOLD, FedNova and FedAvg
with each registered uplink compressor, beside BAFFLE and the forward-only peers, on
label-skewed Fashion-MNIST (Dirichlet α = 0.1 and 0.5), 3 seeds, learning rates and μ tuned
on a validation split.

Protocol: Fashion-MNIST reduced to 6,000 training images (500 of them held out, stratified,
as the validation set: ``dataset.validation``) and 2,000 test images; 20 clients split by
``partition.name=dirichlet`` with α = 0.1 or 0.5; each client holds out 20% of its shard as
its local test split (``partition.local_test=0.2``), on which the final global model is
evaluated client by client; 10 clients a round, 30 rounds, test and validation accuracy every
5 rounds and after the last. The backprop rows run the ``fedavg-fmnist-lenet`` preset (LeNet-5,
one local epoch, batches of 32, SGD with momentum 0.9, the update averaged weighted by samples;
SCAFFOLD's option II needs plain SGD, so its momentum is 0, and its counterpart is the row
"FedAvg, no momentum": the same steps without control variates; SCAFFOLD's averaging, the paper's
uniform mean or FedAvg's sample-weighted one, is tuned with its rate; the row "SCAFFOLD, option I"
is the same with the paper's other control-variate update (``method.control_variate=option1``:
c_i the gradient at the global model over the client's data, one extra pass a round); FedNova draws each
client's local epochs from 1..3 per round, the heterogeneous work it normalizes); a compressor row is FedAvg with the uplink compression
mechanism set, by its name key, to each codec its registry (the CODECS of fedge's compress
module) holds when the script runs, with the codec's defaults; the
forward-only rows run their own presets (``baffle-fmnist-lenet``, ``fedkseed-fmnist-lenet``,
and ``<method>-fmnist-lenet`` for each other peer registered when the script runs) on the
same data, partition and clients. The forward-only presets train BAFFLE's LeNet (26,730
parameters, Hardswish, GroupNorm), the backprop rows the classic LeNet-5 (44,426), so the row
"FedAvg, BAFFLE's LeNet" (FedAvg's recipe on the forward-only rows' model) is their reference:
each forward-only row is paired against it below the table. Every row gets the same 30 rounds,
each doing its preset's local work: FedAvg one epoch (about 7 steps of 32 on a client's ~220
training images), FedKSeed 50 zeroth-order steps, DeComFL 10, BAFFLE one epoch of K = 100
perturbations per batch in epoch mode (the model delta travels, so its uplink is FedAvg's).
FeedSign takes one step a round by design (its paper runs thousands of one-step rounds), so a
FeedSign round stands for one local step: it runs 30 × 50 = 1,500 rounds, the zeroth-order steps
a FedKSeed client takes (``Row.round_factor``, FedKSeed's preset's ``local_steps``), with its
evaluation every 250 rounds and its local evaluation after the last, at the same points of the
budget as the others'.

Tuning: per row and α, one run per setting of a small grid on seed 1000 (never a reported seed),
the setting with the highest final validation accuracy kept: client learning rate {0.02, 0.05}
(both FedAvg rows, both SCAFFOLD rows, FedNova), × μ {0.01, 0.1} for FedProx, × the averaging
{uniform, samples} for SCAFFOLD; each forward-only peer's rate, its preset's
and about a third of it: FedKSeed's ``method.lr`` {3e-4, 1e-3}, DeComFL's ``method.optimizer.lr``
{1.5e-3, 5e-3}, FeedSign's ``method.lr`` {3e-3, 1e-2}. A pick at the edge of its grid is widened:
the learning rate is stepped past that edge by the grid's own ratio (2.5, or 10/3 for the peers),
the other settings kept, while the step validates better, at most 2 steps; a pick still at the
edge after them is marked † in the table (FedProx's μ is not widened: μ → 0 is the FedAvg row). A compressor row takes FedAvg's tuned rate (the
codec is the variable). A run that diverges is recorded as diverged (its round) and counted apart
in the table; in tuning it ranks below every finished setting. BAFFLE keeps its preset's Adam rate 0.01 (tuned for the Table 1
reproduction) untuned here: a BAFFLE run costs as much as ~34 FedAvg runs (below). Reported:
final test accuracy, mean ± std over seeds 0, 1, 2; total uplink bytes (all rounds, all clients,
the encoded messages); uplink bytes until the test accuracy first reaches the target, 50% at
α = 0.1 and 70% at α = 0.5 (FedAvg's tuned final accuracy there less a few points, so the column
tells rows apart at both skews; the seeds reaching it are counted, the bytes averaged over them); and the worst-10% client accuracy (mean of the lowest
⌈0.1·N⌉ clients' accuracies on their local test splits, N the clients holding one: 20, so the
worst 2, unless a client has under 2 samples).

Cost, from one round of each kind measured on a shared 2-core machine (single-threaded, under a
load of 7 to 9, so an upper bound): FedAvg 2.5 s a round, so c = 75 s a 30-round run (the codecs
cost what FedAvg does); FedKSeed 26 s a round (13 min a run), DeComFL the same (the same 319
GFLOP a round); BAFFLE 85 s a round (42.5 min a run). Per α: the backprop rows' tuning is 12 c
(FedAvg 2, FedProx 4, SCAFFOLD 2, FedNova 2 × 2 for its 1..3 epochs), their seeds 15 c (FedNova
counting double) and the five codecs' seeds 15 c: 42 c = 52.5 min; FedKSeed and DeComFL 2
tuning + 3 seed runs = 65 min each; BAFFLE 3 seed runs = 128 min. Both α: 105 + 260 + 255 min
≈ 10.3 CPU-hours. Measured again at a load of 4 (FedAvg 0.6 s, DeComFL 6.5 s a round), the
whole table is about a quarter of that. FeedSign's 1,500 one-step rounds took 9.6 minutes a run
(a load of 3 on the 2 cores), 5 to 7 runs per α. Widening a grid adds at most 2 runs per row
and α, the FedAvg-without-momentum row and SCAFFOLD's averaging grid about 10 c per α, the
option I row twice SCAFFOLD's (its extra pass over the client's data costs one more local epoch:
twice the client FLOPs at E = 1); the wall minutes the runs took are given under the table.

    python benchmarks/noniid_uplink.py [--rows fedavg,fedprox] [--alphas 0.1,0.5] [--seeds 0,1,2] [--max-minutes 600] [--docs docs/benchmarks.md]

Each (row, α, seed) and each tuning setting is one resumable unit: its run directory under
``--out`` (an interrupted run resumes from its checkpoint) and, once finished, its JSON record
under ``benchmarks/results/noniid_uplink/`` (commit them); a unit with a record is not run
again, so the table fills in across sessions. ``--max-minutes`` starts no new unit after that
many minutes. ``--docs`` renders the section and its figure from the records committed to git
only (nothing runs).

Launch, four processes each pinned to a core (``--list`` prints the rows registered now; the
codec rows reuse FedAvg's tuning units, so they run in FedAvg's process), at most 3.5 hours:

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/noniid_uplink.py --rows baffle --alphas 0.1
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/noniid_uplink.py --rows baffle --alphas 0.5
    OMP_NUM_THREADS=1 taskset -c 2 python benchmarks/noniid_uplink.py --rows fedavg,fedavg-topk,fedavg-randk,fedavg-qsgd,fedavg-sign,fedavg-quantize,decomfl
    OMP_NUM_THREADS=1 taskset -c 3 python benchmarks/noniid_uplink.py --rows fedprox,scaffold,scaffold-option1,fednova,fedkseed,feedsign
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedge.bench.docs import markdown_table, records_line, update_section
from fedge.bench.stats import comparison, t_interval
from fedge.core.config import load_config
from fedge.core.errors import DivergenceError
from fedge.core.presets import preset_names
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from fedge.methods import method_names

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "benchmarks" / "results" / "noniid_uplink"
SECTION, TITLE = "noniid-uplink", "Non-IID devices and slow uplinks"
ALPHAS = (0.1, 0.5)
SEEDS = (0, 1, 2)
TUNE_SEED = 1000
ROUNDS = 30
#: the test accuracy whose uplink bytes the table gives, by α: about FedAvg's tuned final accuracy
#: there less a few points, so the column tells the rows apart at both skews
TARGETS = {0.1: 0.50, 0.5: 0.70}
LR = "method.client_optimizer.lr"
LRS = (0.02, 0.05)


def common(alpha: float, rounds: int, factor: int = 1) -> list[str]:
    """The overrides every unit shares (data, partition, clients, cadence); ``factor``: the
    row's rounds per protocol round (:attr:`Row.round_factor`), its cadence scaled alike."""
    return [
        "threads=1",
        f"rounds={rounds * factor}",
        f"eval_every={5 * factor}",
        f"local_eval_every={rounds * factor}",
        "dataset.name=fashion-mnist",
        "dataset.limit_train=6000",
        "dataset.limit_test=2000",
        "dataset.validation=500",
        "clients.num=20",
        "clients.per_round=10",
        "partition.name=dirichlet",
        f"partition.alpha={alpha}",
        "partition.local_test=0.2",
    ]


@dataclass(frozen=True)
class Row:
    """A table row: its preset, fixed overrides and the tuning grid (each a list of overrides);
    ``tuned_from``: take that row's tuned setting instead of a grid of its own."""

    name: str
    label: str
    preset: str
    fixed: tuple[str, ...] = ()
    grid: tuple[tuple[str, ...], ...] = ()
    tuned_from: str | None = None
    kind: str = "backprop"  # backprop, compressed, forward-only
    widen: str | None = None  # the grid key stepped past the grid's edge when picked there
    versus: str = "fedavg"  # the row it is paired against (the same steps without its change)
    #: the row's rounds per protocol round: FeedSign's one-step rounds run FedKSeed's local
    #: steps a round (its rounds, evaluation cadence and local evaluation scaled alike)
    round_factor: int = 1


def _lr_grid(key: str, values: tuple[float, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple((f"{key}={v}",) for v in values)


#: SCAFFOLD's averaging: the paper's uniform mean, or FedAvg's sample-weighted one (tuned)
WEIGHTINGS = ("uniform", "samples")

#: steps past a grid's edge, at most, while they validate better (:func:`widened`)
WIDEN = 2

BACKPROP = (
    Row("fedavg", "FedAvg", "fedavg-fmnist-lenet", grid=_lr_grid(LR, LRS), widen=LR),
    Row(
        "fedprox",
        "FedProx",
        "fedavg-fmnist-lenet",
        ("method.name=fedprox",),
        grid=tuple((f"{LR}={lr}", f"method.mu={mu}") for lr in LRS for mu in (0.01, 0.1)),
        widen=LR,
    ),
    Row(
        "fedavg-lenet",
        "FedAvg, BAFFLE's LeNet",
        "fedavg-fmnist-lenet",
        ("model.name=lenet", "model.activation=hardswish", "model.norm=group"),
        grid=_lr_grid(LR, LRS),
        widen=LR,
    ),
    Row(
        "fedavg-sgd",
        "FedAvg, no momentum",
        "fedavg-fmnist-lenet",
        ("method.client_optimizer.momentum=0",),
        grid=_lr_grid(LR, LRS),
        widen=LR,
    ),
    Row(
        "scaffold",
        "SCAFFOLD",
        "fedavg-fmnist-lenet",
        ("method.name=scaffold", "method.client_optimizer.momentum=0"),
        grid=tuple((f"{LR}={lr}", f"method.weighting={w}") for lr in LRS for w in WEIGHTINGS),
        widen=LR,
        versus="fedavg-sgd",
    ),
    Row(
        "scaffold-option1",
        "SCAFFOLD, option I",
        "fedavg-fmnist-lenet",
        (
            "method.name=scaffold",
            "method.client_optimizer.momentum=0",
            "method.control_variate=option1",
        ),
        grid=tuple((f"{LR}={lr}", f"method.weighting={w}") for lr in LRS for w in WEIGHTINGS),
        widen=LR,
        versus="fedavg-sgd",
    ),
    Row(
        "fednova",
        "FedNova",
        "fedavg-fmnist-lenet",
        ("method.name=fednova", "method.local_epochs_range=[1, 3]"),
        grid=_lr_grid(LR, LRS),
        widen=LR,
    ),
)


def compressor_rows() -> list[Row]:
    """FedAvg with each codec the compression registry holds when the script runs (none when
    ``fedge.core.compress`` is not there)."""
    try:
        codecs = importlib.import_module("fedge.core.compress").CODECS
    except ImportError:
        return []
    return [
        Row(
            f"fedavg-{c}",
            f"FedAvg + {c}",
            "fedavg-fmnist-lenet",
            (f"method.compress.name={c}",),
            tuned_from="fedavg",
            kind="compressed",
        )
        for c in codecs
    ]


#: the forward-only peers: label, the learning-rate key and its grid (the preset's rate and
#: about a third of it)
PEERS = {
    "fedkseed": ("FedKSeed", "method.lr", (3e-4, 1e-3)),
    "decomfl": ("DeComFL", "method.optimizer.lr", (1.5e-3, 5e-3)),
    "feedsign": ("FeedSign", "method.lr", (3e-3, 1e-2)),
}


#: the forward-only rows' backprop reference: FedAvg on their model, BAFFLE's LeNet
ON_THEIR_MODEL = "fedavg-lenet"


def peer_rows() -> list[Row]:
    """BAFFLE and the forward-only peers registered when the script runs, each on its preset."""
    out = []
    if "baffle" in method_names():
        out.append(
            Row(
                "baffle",
                "BAFFLE",
                "baffle-fmnist-lenet",
                kind="forward-only",
                versus=ON_THEIR_MODEL,
            )
        )
    presets = set(preset_names())
    for m in ("fedkseed", "decomfl", "feedsign"):
        if m in method_names() and f"{m}-fmnist-lenet" in presets:
            label, key, rates = PEERS[m]
            grid = _lr_grid(key, rates)
            out.append(
                Row(
                    m,
                    label,
                    f"{m}-fmnist-lenet",
                    grid=grid,
                    kind="forward-only",
                    widen=key,
                    versus=ON_THEIR_MODEL,
                    round_factor=feedsign_factor() if m == "feedsign" else 1,
                )
            )
    return out


def feedsign_factor() -> int:
    """FeedSign's one-step rounds per protocol round: FedKSeed's local steps a round (its
    preset's ``method.local_steps``), so a FeedSign client takes as many zeroth-order steps
    as a FedKSeed client (one when the FedKSeed preset is not there)."""
    if "fedkseed-fmnist-lenet" not in set(preset_names()):
        return 1
    return int(load_config("fedkseed-fmnist-lenet").to_dict()["method"]["local_steps"])


def all_rows() -> dict[str, Row]:
    return {r.name: r for r in (*BACKPROP, *compressor_rows(), *peer_rows())}


# ---- units --------------------------------------------------------------------------------


@dataclass
class Budget:
    """Start no new unit after ``minutes`` (None: no limit)."""

    minutes: float | None
    start: float = field(default_factory=time.monotonic)

    def left(self) -> bool:
        return self.minutes is None or time.monotonic() - self.start < 60 * self.minutes


def _slug(overrides: tuple[str, ...]) -> str:
    return "_".join(o.split("=", 1)[0].split(".")[-1] + "-" + o.split("=", 1)[1] for o in overrides)


def unit_record(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """What the table needs of one finished run: ``meta`` plus its accuracies, uplink bytes,
    the (cumulative uplink bytes, test accuracy) curve and the fairness figures."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = [
        [x["cum_bytes_up"], x["test_accuracy"]] for x in lines if x["test_accuracy"] is not None
    ]
    vals = [x["val_accuracy"] for x in lines if x.get("val_accuracy") is not None]
    return {
        **meta,
        "final_test_accuracy": summary["final_test_accuracy"],
        "final_val_accuracy": vals[-1] if vals else None,
        "total_bytes_up": summary["total_bytes_up"],
        "total_bytes_down": summary["total_bytes_down"],
        "curve": curve,
        **{
            k: summary.get(f"final_{k}")
            for k in (
                "client_acc_mean",
                "client_acc_worst10",
                "client_acc_best10",
                "client_acc_var",
            )
        },
        "rounds": summary["rounds"],
        "wall_s": summary["wall_s"],
        "machine": (summary.get("machines") or [{}])[-1].get("machine"),
    }


def run_unit(
    row: Row,
    overrides: list[str],
    record: Path,
    out: Path,
    meta: dict[str, Any],
    budget: Budget,
) -> dict[str, Any] | None:
    """The unit's record: read, or run (resuming its directory) and written; None when the
    budget is spent before it starts. A run that diverges is recorded as such (its round), a
    result like any other: the table counts it, tuning ranks it below every finished setting."""
    if record.exists():
        got: dict[str, Any] = json.loads(record.read_text())
        asked = [int(o.split("=", 1)[1]) for o in overrides if o.startswith("rounds=")]
        rounds = got.get("rounds")
        if got.get("setting") == meta.get("setting") and (
            rounds is None or not asked or rounds == asked[-1]
        ):
            return got
        # run at a setting tuning no longer picks (its grid was widened since), or for another
        # number of rounds (the row's budget changed): run it again
        record.unlink()
        shutil.rmtree(out, ignore_errors=True)
    if not budget.left():
        return None
    rec: dict[str, Any] | None = None
    if (out / "summary.json").exists():
        pass
    elif (out / "checkpoint.pt").exists():
        try:
            resume_experiment(out)
        except DivergenceError as exc:
            rec = {**meta, "overrides": overrides, "diverged_round": exc.round}
            rec["final_test_accuracy"] = rec["final_val_accuracy"] = None
    else:
        if out.exists():  # killed before its first checkpoint: start it again
            for p in sorted(out.rglob("*"), reverse=True):
                p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
        try:
            run_experiment(load_config(row.preset, overrides=overrides), out=out)
        except DivergenceError as exc:
            rec = {**meta, "overrides": overrides, "diverged_round": exc.round}
            rec["final_test_accuracy"] = rec["final_val_accuracy"] = None
    if rec is None:
        rec = unit_record(out, {**meta, "overrides": overrides})
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(record)
    return rec


def _value(setting: tuple[str, ...], key: str) -> float:
    return float(next(o.split("=", 1)[1] for o in setting if o.split("=", 1)[0] == key))


def _with(setting: tuple[str, ...], key: str, value: float) -> tuple[str, ...]:
    return tuple(f"{key}={value:.3g}" if o.split("=", 1)[0] == key else o for o in setting)


#: one tuning unit's record: ``(row, setting)`` to the record, or None when it is not there
Unit = Callable[[Row, tuple[str, ...]], "dict[str, Any] | None"]


def tuned_setting(row: Row, unit: Unit) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """The row's tuned setting and how it was found (``{"tried": [[setting, validation
    accuracy], ...], "at_edge": bool}``), from its grid's units, or None while one is missing.

    The setting with the highest final validation accuracy wins (a diverged run scores -1, the
    first of equals wins); a winner at the edge of the grid in ``row.widen`` is stepped past it
    by the grid's ratio, the other settings kept, while the step validates better, at most
    ``WIDEN`` steps; ``at_edge`` says the last step still won."""
    scores: dict[tuple[str, ...], float] = {}

    def score(setting: tuple[str, ...]) -> bool:
        rec = unit(row, setting)
        if rec is None:
            return False
        val = rec.get("final_val_accuracy")
        scores[setting] = -1.0 if val is None else float(val)
        return True

    if not all(score(setting) for setting in row.grid):
        return None
    best = max(row.grid, key=lambda st: scores[st])
    edge = False
    if row.widen is not None:
        values = sorted({_value(st, row.widen) for st in row.grid})
        v = _value(best, row.widen)
        if len(values) > 1 and v in (values[0], values[-1]):
            ratio = values[-1] / values[-2] if v == values[-1] else values[0] / values[1]
            edge = True
            for _ in range(WIDEN):
                step = _with(best, row.widen, _value(best, row.widen) * ratio)
                if not score(step):
                    return None
                if scores[step] <= scores[best]:
                    edge = False
                    break
                best = step
    tried = [[list(st), sc] for st, sc in scores.items()]
    return best, {"tried": tried, "at_edge": edge}


def _tune_where(row: Row, alpha: float, setting: tuple[str, ...]) -> Path:
    return Path("tune") / f"alpha-{alpha}" / row.name / _slug(setting)


def tuned(
    row: Row,
    rows: dict[str, Row],
    alpha: float,
    base: list[str],
    args: argparse.Namespace,
    budget: Budget,
) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """The row's tuned setting at ``alpha`` and how it was found (:func:`tuned_setting`),
    running its grid's units on the tuning seed, or None while a unit has not finished."""
    if row.tuned_from is not None:
        return tuned(rows[row.tuned_from], rows, alpha, base, args, budget)
    if not row.grid:
        return (), {}

    def unit(r: Row, setting: tuple[str, ...]) -> dict[str, Any] | None:
        where = _tune_where(r, alpha, setting)
        return run_unit(
            r,
            [*base, *r.fixed, *setting, f"seed={TUNE_SEED}"],
            Path(args.records) / f"{where}.json",
            Path(args.out) / where,
            {"row": r.name, "alpha": alpha, "seed": TUNE_SEED, "setting": list(setting)},
            budget,
        )

    return tuned_setting(row, unit)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or read) every requested unit; what it has, by row and α."""
    rows = all_rows()
    budget = Budget(args.max_minutes)
    done: dict[str, Any] = {}
    for name in args.rows:
        row = rows[name]
        for alpha in args.alphas:
            base = [*common(alpha, args.rounds, row.round_factor), *args.set]
            got = tuned(row, rows, alpha, base, args, budget)
            if got is None:
                continue
            setting, how = got
            for seed in args.seeds:
                where = Path("runs") / f"alpha-{alpha}" / row.name / f"seed-{seed}"
                meta = {"row": row.name, "alpha": alpha, "seed": seed, "setting": list(setting)}
                rec = run_unit(
                    row,
                    [*base, *row.fixed, *setting, f"seed={seed}"],
                    Path(args.records) / f"{where}.json",
                    Path(args.out) / where,
                    {**meta, "tuning": how},
                    budget,
                )
                if rec is not None:
                    done.setdefault(f"{row.name}@{alpha}", []).append(rec)
    return done


# ---- the docs section, from committed records ---------------------------------------------


def committed_records(records: Path, part: str = "runs") -> list[dict[str, Any]]:
    """The records under ``records/part`` (``runs``: the seeds; ``tune``: the tuning units)
    that git tracks (all of them when the directory is outside a git work tree)."""
    paths = sorted((records / part).rglob("*.json"))
    try:
        out = subprocess.run(
            ["git", "ls-files", "--", "."], cwd=records, capture_output=True, text=True, check=True
        ).stdout.split()
        tracked = {(records / p).resolve() for p in out}
        paths = [p for p in paths if p.resolve() in tracked]
    except (subprocess.CalledProcessError, FileNotFoundError, NotADirectoryError):
        pass
    return [json.loads(p.read_text()) for p in paths]


def picks(
    tune: list[dict[str, Any]], rows: dict[str, Row]
) -> dict[tuple[str, float], tuple[tuple[str, ...], dict[str, Any]]]:
    """Each (row, α)'s tuned setting as the tuning records ``tune`` decide it
    (:func:`tuned_setting`), for the rows and α whose tuning units are all there."""
    have = {(r["row"], r["alpha"], tuple(r["setting"])): r for r in tune}
    out = {}
    for row in rows.values():
        src = rows[row.tuned_from] if row.tuned_from is not None else row
        if not src.grid:
            continue
        for alpha in sorted({a for (_, a, _) in have}):

            def unit(r: Row, st: tuple[str, ...], a: float = alpha) -> dict[str, Any] | None:
                return have.get((r.name, a, st))

            got = tuned_setting(src, unit)
            if got is not None:
                out[(row.name, alpha)] = got
    return out


def bytes_to(curve: list[list[float]], target: float) -> float | None:
    """Cumulative uplink bytes at the first evaluated round with test accuracy >= ``target``."""
    return next((b for b, acc in curve if acc >= target), None)


def _mean_std(vals: list[float]) -> tuple[float, float]:
    return statistics.mean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def summarize(
    recs: list[dict[str, Any]],
    order: list[str],
    chosen: dict[tuple[str, float], tuple[tuple[str, ...], dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per (row, α) with records: means over its seeds. With ``chosen`` (:func:`picks`)
    a seed run at a setting other than the (row, α)'s tuned one is left out, and the entry says
    whether the pick sat at its widened grid's edge."""
    chosen = chosen or {}
    by: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in recs:
        pick = chosen.get((r["row"], r["alpha"]))
        if pick is None or tuple(r["setting"]) == pick[0]:
            by.setdefault((r["row"], r["alpha"]), []).append(r)
    rank = {n: i for i, n in enumerate(order)}
    out = []
    for (row, alpha), every in sorted(
        by.items(), key=lambda kv: (kv[0][1], rank.get(kv[0][0], 99))
    ):
        rs = [r for r in every if r.get("diverged_round") is None]
        diverged = sorted(r["diverged_round"] for r in every if r.get("diverged_round"))
        if not rs:
            out.append(
                {
                    "row": row,
                    "alpha": alpha,
                    "seeds": len(every),
                    "setting": every[0]["setting"],
                    "diverged": diverged,
                    "wall_min": 0.0,
                    "at_edge": chosen.get((row, alpha), ((), {}))[1].get("at_edge", False),
                }
            )
            continue
        acc, acc_std = _mean_std([r["final_test_accuracy"] for r in rs])
        target = TARGETS[alpha]
        hits = [b for b in (bytes_to(r["curve"], target) for r in rs) if b is not None]
        worst = [r["client_acc_worst10"] for r in rs if r.get("client_acc_worst10") is not None]
        out.append(
            {
                "row": row,
                "alpha": alpha,
                "seeds": len(rs),
                "setting": rs[0]["setting"],
                "diverged": diverged,
                "accuracy": acc,
                "accuracy_std": acc_std,
                "bytes_up": statistics.mean(r["total_bytes_up"] for r in rs),
                "bytes_to_target": statistics.mean(hits) if hits else None,
                "reached": len(hits),
                "worst10": _mean_std(worst) if worst else None,
                "wall_min": sum(r["wall_s"] for r in rs) / 60,
                "at_edge": chosen.get((row, alpha), ((), {}))[1].get("at_edge", False),
                "per_seed": {r["seed"]: r["final_test_accuracy"] for r in rs},
            }
        )
    return out


def _mb(b: float | None) -> str:
    """Bytes in MB to one decimal, or in kB below 0.1 MB (FeedSign's whole uplink is kilobytes).

    >>> _mb(53_400_000), _mb(9_120), _mb(None)
    ('53.4 MB', '9.1 kB', '—')
    """
    if b is None:
        return "—"
    return f"{b / 1e6:,.1f} MB" if b >= 1e5 else f"{b / 1e3:,.1f} kB"


def _setting(e: dict[str, Any]) -> str:
    return (", ".join(e["setting"]) or "preset") + (" †" if e.get("at_edge") else "")


def table(entries: list[dict[str, Any]], labels: dict[str, str]) -> str:
    head = [
        "α",
        "row",
        "tuned setting",
        "final test acc. (mean ± std)",
        "uplink bytes, total",
        "uplink bytes to the target (seeds reaching it)",
        "worst-10% client acc.",
    ]
    cells = []
    for e in entries:
        if "accuracy" not in e:  # every seed diverged
            rounds = ", ".join(str(r) for r in e["diverged"])
            cells.append(
                [
                    f"{e['alpha']:g}",
                    labels.get(e["row"], e["row"]),
                    _setting(e),
                    f"diverged ({len(e['diverged'])} of {e['seeds']} seeds; rounds {rounds})",
                    "—",
                    "—",
                    "—",
                ]
            )
            continue
        w = e["worst10"]
        gone = f"; {len(e['diverged'])} more diverged" if e.get("diverged") else ""
        cells.append(
            [
                f"{e['alpha']:g}",
                labels.get(e["row"], e["row"]),
                _setting(e),
                f"{100 * e['accuracy']:.2f} ± {100 * e['accuracy_std']:.2f} (n={e['seeds']}{gone})",
                _mb(e["bytes_up"]),
                f"{_mb(e['bytes_to_target'])} ({e['reached']} of {e['seeds']})",
                "—" if w is None else f"{100 * w[0]:.2f} ± {100 * w[1]:.2f}",
            ]
        )
    return "\n".join(markdown_table(head, cells, left=3))


def against_reference(
    entries: list[dict[str, Any]], labels: dict[str, str], versus: dict[str, str]
) -> str:
    """Each row against its reference row at the same α (``versus``: FedAvg; for SCAFFOLD
    FedAvg without momentum, the same steps without control variates; for the forward-only rows
    FedAvg on their model), paired by seed (a seed
    draws the same partition, clients and initial model in both): the mean accuracy difference
    in points, its 95% t interval and what it resolves, and the uplink bytes as a fraction of the
    reference's."""
    head = [
        "α",
        "row",
        "reference",
        "Δ accuracy, points [95% interval]",
        "resolved",
        "uplink / reference's",
    ]
    at = {(e["row"], e["alpha"]): e for e in entries}
    cells = []
    for e in entries:
        ref_name = versus.get(e["row"], "fedavg")
        base = at.get((ref_name, e["alpha"]))
        if e["row"] == ref_name or base is None or "per_seed" not in e or "per_seed" not in base:
            continue
        common = sorted(e["per_seed"].keys() & base["per_seed"].keys())
        if len(common) < 2:
            continue
        diffs = [100 * (e["per_seed"][s] - base["per_seed"][s]) for s in common]
        lo, hi = t_interval(diffs)
        ref = labels.get(ref_name, ref_name)
        cells.append(
            [
                f"{e['alpha']:g}",
                labels.get(e["row"], e["row"]),
                ref,
                f"{statistics.mean(diffs):+.2f} [{lo:+.2f}, {hi:+.2f}] (n={len(common)})",
                comparison(lo, hi, (f"above {ref}", f"below {ref}")),
                f"{e['bytes_up'] / base['bytes_up']:.3g}",
            ]
        )
    return "\n".join(markdown_table(head, cells, left=3)) if cells else ""


def figure(entries: list[dict[str, Any]], labels: dict[str, str], path: Path) -> Path:
    """Final test accuracy against total uplink bytes, one panel per α, one point per row; a row
    keeps its colour and marker in both panels, named in one legend beside them (labels written
    at the points overlapped where rows sit close)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    alphas = sorted({e["alpha"] for e in entries})
    rows = list(dict.fromkeys(e["row"] for e in entries if "accuracy" in e))
    markers = "osD^vP*Xph<>"
    colors = [f"C{i}" for i in range(10)]
    style = {r: (colors[i % 10], markers[(i // 10 + i) % len(markers)]) for i, r in enumerate(rows)}
    fig = Figure(figsize=(5.6 * len(alphas) + 2.6, 4.4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    handles: dict[str, Any] = {}
    for i, alpha in enumerate(alphas):
        ax = fig.add_subplot(1, len(alphas), i + 1)
        for e in (e for e in entries if e["alpha"] == alpha and "accuracy" in e):
            color, marker = style[e["row"]]
            handles[e["row"]] = ax.errorbar(
                e["bytes_up"] / 1e6,
                100 * e["accuracy"],
                yerr=100 * e["accuracy_std"],
                fmt=marker,
                color=color,
                capsize=3,
            )
        ax.set_xscale("log")
        ax.set_title(f"Dirichlet α = {alpha:g}")
        ax.set_xlabel("total uplink bytes (MB, log scale)")
        ax.set_ylabel("final test accuracy (%)")
        ax.grid(True, alpha=0.3)
    order = [r for r in rows if r in handles]
    fig.legend(
        [handles[r] for r in order],
        [labels.get(r, r) for r in order],
        loc="outside right center",
        fontsize=8,
        frameon=False,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


FIGURE_REL = Path("figures") / "noniid-uplink" / "accuracy_vs_uplink.png"  # under docs/
COMMAND = "python benchmarks/noniid_uplink.py --docs docs/benchmarks.md"


def section(
    records: Path = RECORDS, command: str = COMMAND, figure_rel: Path = FIGURE_REL
) -> tuple[str, list[dict[str, Any]], dict[str, str]]:
    """The section's text from the committed records (its figure linked at ``figure_rel``,
    relative to the docs file), the table's entries and the rows' labels."""
    rows = all_rows()
    labels = {n: r.label for n, r in rows.items()}
    versus = {n: r.versus for n, r in rows.items()}
    chosen = picks(committed_records(records, "tune"), rows)
    entries = summarize(committed_records(records), list(rows), chosen)
    doc = (__doc__ or "").replace("``", "`").split("\n\n")
    body = [f"Command: `{command}`", *(" ".join(p.split()) for p in doc[1:4])]
    if entries:
        minutes = sum(e["wall_min"] for e in entries)
        body += [
            table(entries, labels),
            awaiting(entries, labels),
            *(
                [
                    "† the pick is still at the edge after widening its grid: the best rate may lie beyond."
                ]
                if any(e.get("at_edge") for e in entries)
                else []
            ),
            *(
                [
                    "Each row against its reference at the same α (FedAvg; for SCAFFOLD, FedAvg "
                    "without momentum: the same steps without control variates; for the "
                    "forward-only rows, FedAvg on their model, BAFFLE's LeNet), paired by seed "
                    "(the same partition, clients and initial model): a difference is resolved "
                    "when its 95% interval "
                    "excludes 0. With 3 seeds an interval is about ±2.5 standard deviations of the "
                    "per-seed differences wide.",
                    paired,
                ]
                if (paired := against_reference(entries, labels, versus))
                else []
            ),
            f"![Final accuracy against total uplink bytes]({figure_rel.as_posix()})",
            f"The runs took {minutes:,.0f} minutes of wall time in all.",
        ]
    else:
        body.append("No record has been committed yet: the table fills in as units finish.")
    return "\n\n".join(body), entries, labels


def awaiting(entries: list[dict[str, Any]], labels: dict[str, str]) -> str:
    """The line naming each row and α with fewer than all of SEEDS recorded ("none" else)."""
    have = {(e["row"], e["alpha"]): e["seeds"] for e in entries}
    short = [
        f"{label} at α = {alpha} ({have.get((row, alpha), 0)} of {len(SEEDS)} seeds)"
        for row, label in labels.items()
        for alpha in ALPHAS
        if have.get((row, alpha), 0) < len(SEEDS)
    ]
    return "Awaiting records: " + ("; ".join(short) if short else "none") + "."


def render(records: Path, docs: Path, figure_path: Path | None, command: str) -> str:
    """Rewrite the ``bench:noniid-uplink`` section of ``docs`` from the committed records (the
    figure at ``figure_path``, by default ``FIGURE_REL`` beside ``docs``)."""
    where = (figure_path or docs.resolve().parent / FIGURE_REL).resolve()
    text, entries, labels = section(records, command, where.relative_to(docs.resolve().parent))
    if entries:
        figure(entries, labels, where)
    # a section without records names no records directory (tests/test_docs_figures.py lists
    # it as awaiting them until the first ones are committed)
    machine = (
        records_line(records, root=REPO)
        if entries
        else "No run record has been committed yet: the runs are launched separately (about 10 "
        "CPU-hours; the launch commands are in the script's docstring)."
    )
    update_section(docs, SECTION, TITLE, text, machine=machine)
    return text


# ---- command line -------------------------------------------------------------------------


def _list(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=_list(str), default=None, help="comma-separated row names")
    ap.add_argument("--alphas", type=_list(float), default=list(ALPHAS))
    ap.add_argument("--seeds", type=_list(int), default=list(SEEDS))
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--max-minutes", type=float, default=None, help="start no unit after this")
    ap.add_argument("--out", default="runs/bench-noniid-uplink", help="the units' run directories")
    ap.add_argument("--records", default=str(RECORDS), help="where finished units are recorded")
    ap.add_argument(
        "--figure", default=None, help="where --docs draws its figure (default: beside the docs)"
    )
    ap.add_argument("--docs", default=None, help="render the section of this file from records")
    ap.add_argument("--list", action="store_true", help="print the rows available and exit")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more override for every unit (a smaller setting for a test)",
    )
    args = ap.parse_args(argv)
    rows = all_rows()
    if args.list:
        for r in rows.values():
            print(f"{r.name:16s} {r.kind:13s} {r.label}")
        return 0
    if args.docs is not None:
        command = "python benchmarks/noniid_uplink.py --docs " + str(args.docs)
        fig = Path(args.figure) if args.figure else None
        render(Path(args.records), Path(args.docs), fig, command)
        print(f"rendered {SECTION} into {args.docs}")
        return 0
    args.rows = args.rows or list(rows)
    unknown = [r for r in args.rows if r not in rows]
    if unknown:
        ap.error(f"unknown row(s) {', '.join(unknown)}; rows available now: {', '.join(rows)}")
    done = measure(args)
    for key, recs in done.items():
        accs = [r["final_test_accuracy"] for r in recs if r.get("diverged_round") is None]
        mean = f"final accuracy {statistics.mean(accs):.4f}" if accs else "no finished seed"
        print(f"{key}: {len(recs)} seed(s), {mean}, {len(recs) - len(accs)} diverged")
    wanted = len(args.rows) * len(args.alphas) * len(args.seeds)
    have = sum(len(v) for v in done.values())
    print(f"{have} of {wanted} units recorded under {args.records}")
    return 0 if have == wanted else 3


if __name__ == "__main__":
    raise SystemExit(main())
