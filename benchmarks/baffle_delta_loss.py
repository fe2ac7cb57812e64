"""Batch-level BAFFLE (seed 000, Algorithm 1): the loss differences ΔL over one mini-batch
against ΔL over the client's whole local set D_c, as Algorithm 1 (line 12) states
(``method.delta_loss_on: batch | local_set``; issue 14).

Protocol (reduced from the paper's 10 IID clients on the full training set, to fit ~40
CPU-minutes, screen and probes included, on one thread of a shared 2-core machine; 3 seeds,
0, 1 and 2): batch-level
BAFFLE (FedSGD; each client uploads K = 100 loss differences, twice-FD, σ = 1e-4, EMA evaluation,
server Adam β = (0.9, 0.99), inf-norm clip 0.3, secure aggregation on, all as the method's
defaults), BAFFLE's LeNet, Fashion-MNIST, **4 IID clients, all of them every round, 64 training
samples each** (256 in all; 1,000 more held out for validation, 2,000 test samples). ``local_set``
evaluates ΔL over a client's 64 samples (in chunks of 16), ``batch`` over one mini-batch of 16
drawn each round: ``local_set`` costs 4x the forwards per round. So ``local_set`` runs 20 rounds
and ``batch`` 80 rounds (evaluated every 4th): the curves meet at equal rounds (round 20 of both:
the same uploads) and at equal forwards (local_set round t against batch round 4t).

Tuning: each variant's server Adam learning rate is picked from {0.003, 0.01, 0.03} (batch's
grid widened to 0.1 after its first screen picked 0.03, the edge) by its final **validation**
accuracy (seed 0) after a quarter of its main run (local_set 5 rounds, batch 20: the same
forwards), never the test set. Per variant rather than shared, because the two ΔL have
different noise (a mini-batch adds sampling noise to the zeroth-order noise), so one shared lr
could favour either; the difference measured is then between the two, each at its own best lr.

Cost: the runs switch the FLOP counter off; each variant's client FLOPs per round come from a
separate one-round probe with the counter on. Forwards are sample-forwards, (K + 1) × samples
evaluated per client per round.

Resumable: every finished run writes its row, with its full config, to
``benchmarks/results/baffle_delta_loss/`` (commit it); the same command reads them back.

    python benchmarks/baffle_delta_loss.py [--out runs/bench-baffle-dloss] [--docs docs/benchmarks.md]
    python benchmarks/baffle_delta_loss.py --table-only --docs docs/benchmarks.md   # tabulate what is recorded
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

from fedge.bench.docs import records_line, update_section
from fedge.bench.screened import (
    pick_by_validation,
    recorded_probes,
    recorded_screen,
    recorded_seeded,
    run_screened,
    when_picked,
)
from fedge.bench.stats import UNRESOLVED, comparison, paired_difference
from fedge.bench.tables import run_notes, screen_cell, seed_gaps
from fedge.bench.variants import run_variants

BASE = "baffle-fmnist-lenet"
RECORDS = Path(__file__).resolve().parent / "results" / "baffle_delta_loss"
SEEDS = (0, 1, 2)
K, CLIENTS, PER_CLIENT, BATCH = 100, 4, 64, 16
RATIO = PER_CLIENT // BATCH  # local_set's forwards per round over batch's
ROUNDS = 20  # local_set's rounds; batch runs RATIO x as many (the same forwards)
SCREEN_ROUNDS = 5  # local_set's screen; batch screens RATIO x as many
# Per variant; batch's grid was widened to 0.1 after its first screen picked 0.03, the grid's edge.
SCREEN_LRS = {"batch": (0.003, 0.01, 0.03, 0.1), "local_set": (0.003, 0.01, 0.03)}
VALIDATION, TEST = 1000, 2000
PROTOCOL = [
    "draws=torch",  # the committed records were drawn with torch's generators
    "threads=1",
    f"rounds={ROUNDS}",
    "method.mode=batch",
    f"method.k={K}",
    f"clients.num={CLIENTS}",
    f"clients.per_round={CLIENTS}",
    f"dataset.limit_train={CLIENTS * PER_CLIENT + VALIDATION}",
    f"dataset.validation={VALIDATION}",
    f"dataset.limit_test={TEST}",
    f"method.batch_size={BATCH}",
    "method.perturbation_threads=1",
    "measure.flops=false",
    # named in full: setting only server_optimizer.lr would build the default SGD, not batch mode's Adam
    "method.server_optimizer.name=adam",
    "method.server_optimizer.b1=0.9",
    "method.server_optimizer.b2=0.99",
]
VARIANTS = ("batch", "local_set")
FORWARDS = {
    "batch": (K + 1) * BATCH,
    "local_set": (K + 1) * PER_CLIENT,
}  # sample-forwards per client per round
LONGER = {"batch": [f"rounds={ROUNDS * RATIO}", f"eval_every={RATIO}"], "local_set": []}
PROBE = [
    *PROTOCOL,
    "seed=0",
    "rounds=1",
    "method.server_optimizer.lr=0.01",
    "measure.flops=true",
]  # one metered round (all clients)


def _on(variant: str) -> str:
    return f"method.delta_loss_on={variant}"


def screen_variants() -> dict[str, list[str]]:
    """Each variant at each lr, for a quarter of its main run (the same forwards for both)."""
    out = {}
    for lr in sorted({lr for grid in SCREEN_LRS.values() for lr in grid}):
        for v in (v for v in VARIANTS if lr in SCREEN_LRS[v]):
            rounds = SCREEN_ROUNDS * (RATIO if v == "batch" else 1)
            out[f"screen {v} lr={lr}"] = [
                _on(v),
                f"method.server_optimizer.lr={lr}",
                f"rounds={rounds}",
                *([f"eval_every={RATIO}"] if v == "batch" else []),
            ]
    return out


def screen_common() -> list[str]:
    return [*PROTOCOL, "seed=0"]


def picks(screen: dict[str, Any]) -> dict[str, float] | None:
    """Each variant's lr with the best final validation accuracy (ties: the smaller); None until all ran."""
    chosen = {}
    for v in VARIANTS:
        lr = pick_by_validation(
            screen["results"], {lr: f"screen {v} lr={lr}" for lr in SCREEN_LRS[v]}
        )
        if lr is None:
            return None
        chosen[v] = lr
    return chosen


def main_variants(lrs: dict[str, float]) -> dict[str, list[str]]:
    return {v: [_on(v), f"method.server_optimizer.lr={lrs[v]}", *LONGER[v]] for v in VARIANTS}


def probe_variants() -> dict[str, list[str]]:
    return {f"probe {v}": [_on(v)] for v in VARIANTS}


def run_all(out: Path) -> None:
    main = when_picked(picks, main_variants)
    for seed in SEEDS:  # seed-major, so an interrupted run leaves pairs
        run_screened(
            BASE,
            screen_variants(),
            main,
            screen_common=screen_common(),
            protocol=PROTOCOL,
            seeds=(seed,),
            records=RECORDS,
            out=out,
        )
    run_variants(
        BASE, probe_variants(), out_root=out / "probe", common=PROBE, records=RECORDS / "probe"
    )


# ------------------------------------------------------------------ tables (pure: records in, Markdown out)


def accuracy_at(run: dict[str, Any], rnd: int) -> float:
    """Test accuracy after round ``rnd`` (1-based) of one recorded run."""
    acc = run["accuracy_by_round"][rnd - 1]
    if acc is None:
        raise ValueError(f"round {rnd} of seed {run.get('seed')} was not evaluated")
    return float(acc)


def paired_at(rows: dict[str, Any], rounds: dict[str, int]) -> dict[str, Any] | None:
    """local_set − batch of the test accuracy after ``rounds[variant]`` rounds, per seed
    (:func:`paired_difference`), with a 95% t interval of the mean difference."""
    a, b = (
        {"runs": [{"seed": r["seed"], "acc": accuracy_at(r, rounds[v])} for r in rows[v]["runs"]]}
        for v in VARIANTS[::-1]
    )
    return paired_difference(a, b, key="acc")


def verdict(d: dict[str, Any] | None) -> str:
    """The verdict on a paired local_set − batch difference (:func:`fedge.bench.stats.comparison`:
    the paper reports no such comparison): which is ahead when its 95% t interval excludes 0, else
    not resolved; an interval end within 0.01 points of 0 is shown to 0.001 and called so."""
    if d is None:
        return "fewer than two paired seeds: not resolved"
    near = min(abs(d["lo"]), abs(d["hi"]))
    p = 3 if near < 0.01 else 2  # an end near 0 shown to 0.001 points, so its sign can be read
    ci = f"95% t interval {100 * d['lo']:+.{p}f} to {100 * d['hi']:+.{p}f} points"
    who = comparison(100 * d["lo"], 100 * d["hi"], ("local_set ahead", "batch ahead"))
    just = f", only just (its near end is {100 * near:.3f} points from 0)" if near < 0.01 else ""
    return f"{ci} → {who}{just if who != UNRESOLVED else ''}"


def _ms(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {sd:.4f}"


def _diff_cell(d: dict[str, Any] | None) -> str:
    """Mean ± std of a paired difference in points, then each seed's (seed: difference)."""
    if d is None:
        return "-"
    per_seed = seed_gaps(d)
    return f"{100 * d['mean']:+.2f} ± {100 * d['std']:.2f} ({per_seed})"


def screen_lines(screen: dict[str, Any]) -> list[str]:
    rows = {r["label"]: r for r in screen["results"]}
    out = [
        f"**Learning-rate screen** (server Adam lr; seed 0; local_set {SCREEN_ROUNDS} rounds, batch "
        f"{SCREEN_ROUNDS * RATIO} rounds: the same forwards; picked by final **validation** accuracy):",
        "",
        "| lr | batch val acc | local_set val acc |",
        "|---|---|---|",
    ]
    for lr in sorted({lr for grid in SCREEN_LRS.values() for lr in grid}):
        cells = [
            screen_cell(rows.get(f"screen {v} lr={lr}")) if lr in SCREEN_LRS[v] else "-"
            for v in VARIANTS
        ]
        out.append(f"| {lr} | {' | '.join(cells)} |")
    chosen = picks(screen)
    if chosen is not None:
        edge = [v for v in VARIANTS if chosen[v] in (min(SCREEN_LRS[v]), max(SCREEN_LRS[v]))]
        out += [
            "",
            "Picked: "
            + ", ".join(f"{v} lr {chosen[v]}" for v in VARIANTS)
            + "."
            + (f" At the edge of the grid: {', '.join(edge)}." if edge else ""),
        ]
    return out


def result_lines(report: dict[str, Any], probes: dict[str, Any]) -> list[str]:
    """The equal-rounds table, the per-seed paired difference and the matched-forwards view."""
    rows = {r["label"]: r for r in report["results"]}
    if any(v not in rows for v in VARIANTS):
        return [
            "Main runs not recorded yet (the command resumes them): "
            + ", ".join(report.get("missing") or VARIANTS)
        ]
    eq = {v: ROUNDS for v in VARIANTS}
    out = [
        f"**Equal rounds** (round {ROUNDS} of both: the same {ROUNDS} uploads of K = {K} loss differences per client). "
        "Forwards are sample-forwards per client per round, (K + 1) × samples evaluated; GFLOP from a one-round "
        "probe with the FLOP counter on; bytes per client per round, averaged over all rounds of the run "
        "(secure aggregation's key exchange and masks included).",
        "",
        f"| ΔL over | seeds | test acc after round {ROUNDS} (mean ± std) | per seed | forwards/client/round | "
        "client GFLOP/client/round | up B/client/round | down B/client/round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        r = rows[v]
        accs = [accuracy_at(x, ROUNDS) for x in r["runs"]]
        probe = probes.get(f"probe {v}")
        gflop = "-" if probe is None else f"{probe['client_flops_per_client_round'] / 1e9:.1f}"
        out.append(
            f"| {v} | {r['seeds']} | {_ms(accs)} | {', '.join(f'{a:.4f}' for a in accs)} | {FORWARDS[v]:,} | "
            f"{gflop} | {r['bytes_up_per_client_round']:,.0f} | {r['bytes_down_per_client_round']:,.0f} |"
        )
    d_rounds = paired_at(rows, eq)
    out += [
        "",
        f"- Paired difference at equal rounds (local_set − batch; mean ± std (per seed)): "
        f"{_diff_cell(d_rounds)} points; {verdict(d_rounds)}.",
    ]
    out += [
        "",
        f"**Matched forwards** (batch runs {RATIO}x the rounds, so its round {RATIO}t has spent the forwards of "
        "local_set's round t). Test accuracy mean ± std over seeds; difference local_set − batch in points, "
        "mean ± std (per seed):",
        "",
        "| cumulative forwards/client | local_set round | local_set test acc | batch round | batch test acc | "
        "local_set − batch |",
        "|---|---|---|---|---|---|",
    ]
    points = sorted({*range(ROUNDS // 4, ROUNDS + 1, max(1, ROUNDS // 4)), ROUNDS})
    for t in points:
        at = {"local_set": t, "batch": RATIO * t}
        cells = [
            _ms([accuracy_at(x, at[v]) for x in rows[v]["runs"]]) for v in ("local_set", "batch")
        ]
        out.append(
            f"| {t * FORWARDS['local_set']:,} | {t} | {cells[0]} | {RATIO * t} | {cells[1]} | "
            f"{_diff_cell(paired_at(rows, at))} |"
        )
    signs = {
        (x > 0)
        for t in points
        for x in (paired_at(rows, {"local_set": t, "batch": RATIO * t}) or {"diffs": []})["diffs"]
    }
    if len(signs) == 1:
        out += [
            "",
            f"At every matched point every seed has {'local_set' if signs == {True} else 'batch'} ahead.",
        ]
    d_fw = paired_at(rows, {"local_set": ROUNDS, "batch": RATIO * ROUNDS})
    val = {v: rows[v].get("test_accuracy_at_best_val") for v in VARIANTS}
    out += [
        "",
        f"- Paired difference at equal forwards (local_set round {ROUNDS} vs batch round {RATIO * ROUNDS}): "
        f"{_diff_cell(d_fw)} points; {verdict(d_fw)}.",
    ]
    if all(x is not None for x in val.values()) and (
        d_val := paired_difference(
            rows["local_set"], rows["batch"], key="test_accuracy_at_best_val"
        )
    ):
        out.append(
            f"- Test accuracy at the round of best validation accuracy (each run's 20 evaluations; equal forwards): "
            f"local_set {val['local_set']:.4f} ± {rows['local_set']['test_accuracy_at_best_val_std']:.4f}, "
            f"batch {val['batch']:.4f} ± {rows['batch']['test_accuracy_at_best_val_std']:.4f}; "
            f"paired {_diff_cell(d_val)} points; {verdict(d_val)}."
        )
    per_round = {
        v: rows[v]["bytes_up_per_client_round"] + rows[v]["bytes_down_per_client_round"]
        for v in VARIANTS
    }
    out += [
        f"- Bytes: the same messages every round for both (K float32 loss differences up, the model down); at "
        f"equal forwards batch has run {RATIO}x the rounds, so it has moved {RATIO}x the bytes "
        f"({RATIO * ROUNDS} × {per_round['batch']:,.0f} B against {ROUNDS} × {per_round['local_set']:,.0f} B per "
        "client). Equal rounds is the comparison at equal communication, equal forwards at equal client compute.",
        "- Scale: 256 training samples and at most 80 rounds leave every model under-trained (test accuracy "
        "0.3-0.5); this measures the ΔL choice in a small setting, not an accuracy of the paper.",
    ]
    return out


def table(command: str) -> str:
    screen = recorded_screen(BASE, screen_variants(), common=screen_common(), records=RECORDS)
    lines = [
        f"Command: `{command}` (runs what `benchmarks/results/baffle_delta_loss/` does not hold yet, then "
        "tabulates; with `--table-only` it tabulates the records without running)",
        "",
        *screen_lines(screen),
        "",
    ]
    chosen = picks(screen)
    if chosen is None:
        return "\n".join([*lines, "The screen is not finished; no main runs yet."])
    report = recorded_seeded(
        BASE, main_variants(chosen), seeds=SEEDS, common=PROTOCOL, records=RECORDS
    )
    probes = recorded_probes(BASE, probe_variants(), common=PROBE, records=RECORDS / "probe")
    return "\n".join([*lines, *result_lines(report, probes), *run_notes(report["results"])])


INTRO = "\n\n".join((__doc__ or "").split("\n\n")[:4]).strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="runs/bench-baffle-dloss")
    ap.add_argument("--docs", default=None)
    ap.add_argument(
        "--table-only", action="store_true", help="tabulate the recorded runs; run nothing"
    )
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # the shared machine's busy warnings would flood the log
    if not args.table_only:
        run_all(Path(args.out))
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--table-only"]
    command = " ".join(["python benchmarks/baffle_delta_loss.py", *given])
    body = table(command)
    print(body)
    if args.docs:
        update_section(
            args.docs,
            "baffle-delta-loss",
            "BAFFLE batch-level: ΔL over a mini-batch vs over the local set D_c",
            f"{INTRO}\n\n{body}",
            machine=records_line(RECORDS, root=Path(__file__).resolve().parents[1]),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
