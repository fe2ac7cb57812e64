"""Time to accuracy on a phone-class fleet (issue 51): FedAvg, BAFFLE, FedPT, FedKSeed and
DeComFL with simulated device and link times (``clients.profiles``; :mod:`fedge.runtime.fleet`),
waiting for every sampled client against a round deadline with over-selection, 3 seeds.

Fleet: 20 clients, 20% ``phone-high`` (10 GFLOP/s, 24/8 Mbit/s down/up), 50% ``phone-mid``
(3 GFLOP/s, FedPT's 0.75/0.25 MB/s links) and 30% ``phone-low`` (1 GFLOP/s, 1.5/0.5 Mbit/s);
the figures and their sources are in docs/guide/scale.md (the compute figures are
assumptions). Each method runs its own preset (``fedavg-fmnist-lenet``: LeNet-5, one local
epoch; ``baffle-fmnist-lenet``: epoch-level BAFFLE, K = 100, forwards only; ``fedpt-fmnist-cnn``:
FedPT's CNN with its dense layer frozen; ``fedkseed-fmnist-lenet`` and ``decomfl-fmnist-lenet``:
the forward-only peers, scalars up and down; FeedSign, one step a round, is left out: its
rounds are not comparable at this round count) on Fashion-MNIST reduced to 2,000 training and
1,000 test images over the 20 IID clients, 5 clients a round, evaluated every round. A client's
simulated time is its download, its measured FLOPs over its device's speed, and its upload;
a round lasts until its last awaited reply.

Rows per method: *wait* (5 sampled, every reply awaited: the round lasts as long as its
slowest device) and *deadline* (``clients.over_select`` 1.4: 7 sampled, the 5 first to finish
aggregated, and a round deadline of twice the median client time of the method's *wait* runs'
first rounds; ``clients.min_replies`` 3, a round with fewer replies is skipped). The target of
each method: the lowest final accuracy its *wait* runs reach over the seeds; time to target is
the simulated time until the first round at or above it (mean over seeds, counting only the
seeds that reach it).

    python benchmarks/fleet_time.py [--out runs/bench-fleet-time] [--seeds 3] [--rounds 20] [--docs docs/benchmarks.md]
    python benchmarks/fleet_time.py --table-only --docs docs/benchmarks.md   # render the records

Resumable: finished runs are recorded under ``benchmarks/results/fleet_time/`` (commit them);
every figure of the table is derived from those records.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from fedge.bench.docs import markdown_table, records_line, update_section
from fedge.bench.figures import few_seeds_note
from fedge.bench.script import runs_parser
from fedge.bench.variants import run_seeded_variants

RECORDS = Path(__file__).resolve().parent / "results" / "fleet_time"
METHODS = {  # label -> preset
    "FedAvg": "fedavg-fmnist-lenet",
    "BAFFLE": "baffle-fmnist-lenet",
    "FedPT": "fedpt-fmnist-cnn",
    "FedKSeed": "fedkseed-fmnist-lenet",
    "DeComFL": "decomfl-fmnist-lenet",
}
FLEET = (
    "clients.profiles=[{device: phone-high, fraction: 0.2}, {device: phone-mid, fraction: 0.5}, "
    "{device: phone-low, fraction: 0.3}]"
)
PER_ROUND = 5
OVER_SELECT = 1.4
MIN_REPLIES = 3
DEADLINE_FACTOR = 2.0  # the deadline: this times the median client time of the waiting runs


def common(rounds: int, extra: list[str]) -> list[str]:
    """The overrides every row shares (``extra``: more, e.g. to shrink it for a test)."""
    return [
        "threads=1",
        f"rounds={rounds}",
        "eval_every=1",
        "dataset.limit_train=2000",
        "dataset.limit_test=1000",
        "clients.num=20",
        f"clients.per_round={PER_ROUND}",
        FLEET,
        *extra,
    ]


def deadline_rows(deadline_s: float) -> list[str]:
    return [
        f"clients.over_select={OVER_SELECT}",
        f"clients.deadline_s={deadline_s}",
        f"clients.min_replies={MIN_REPLIES}",
    ]


def median_client_time(runs: list[dict[str, Any]]) -> float:
    """The median over the runs' first-round clients of their simulated time (s)."""
    times = [
        sum(t[k] for k in ("down_s", "compute_s", "up_s"))
        for r in runs
        for t in r["sim_clients_round1"].values()
    ]
    return statistics.median(times)


def _deadline(median_s: float) -> float:
    """``DEADLINE_FACTOR`` times ``median_s``, to 3 significant digits (a readable config)."""
    return float(f"{DEADLINE_FACTOR * median_s:.3g}")


def run_figures(run_dir: str) -> dict[str, Any]:
    """What the table needs of one run: its accuracy and simulated-time curves, its first
    round's client times, stragglers and skipped rounds."""
    d = Path(run_dir)
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {
        "accuracy_by_round": [x["test_accuracy"] for x in lines],
        "sim_time_total_by_round": [x["sim_time_total_s"] for x in lines],
        "sim_clients_round1": lines[0]["sim_clients"],
        "stragglers": sum(x.get("clients_straggled", 0) for x in lines),
        "skipped": sum(1 for x in lines if x.get("round_skipped")),
    }


def seed_runs(result: dict[str, Any], records: Path, label: str) -> list[dict[str, Any]]:
    """Each seed's :func:`run_figures`, from its run directory (then recorded beside the run's
    record, ``figures/seed-S/<label>.json``) or, when the row came from a record, from there."""
    runs = []
    for r in result["runs"]:
        rec = records / "figures" / f"seed-{r['seed']}" / f"{label}.json"
        if r.get("run_dir"):
            figs = run_figures(r["run_dir"])
            rec.parent.mkdir(parents=True, exist_ok=True)
            rec.write_text(json.dumps(figs, indent=1) + "\n")
        elif rec.exists():
            figs = json.loads(rec.read_text())
        else:
            raise FileNotFoundError(
                f"{label}, seed {r['seed']}: a run record but no figures record {rec}; "
                "delete the run record to rerun it"
            )
        runs.append({**figs, "seed": r["seed"], "final": r["final_test_accuracy"]})
    return runs


def time_to(runs: list[dict[str, Any]], target: float) -> tuple[float | None, int]:
    """Mean simulated seconds to the first round at or above ``target`` over the seeds that
    reach it, and how many do."""
    hits = []
    for r in runs:
        for acc, t in zip(r["accuracy_by_round"], r["sim_time_total_by_round"], strict=True):
            if acc is not None and acc >= target:
                hits.append(t)
                break
    return (statistics.mean(hits) if hits else None), len(hits)


def rows_of(
    method: str, deadline: float, wait_runs: list[dict[str, Any]], cut_runs: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """One method's entry and its two rows (*wait*, *deadline*) of the table, from its runs'
    figures (:func:`run_figures` with ``final`` and ``seed``)."""
    target = min(r["final"] for r in wait_runs)
    entry = {"preset": METHODS[method], "deadline_s": deadline, "target": target}
    out = {}
    for row, runs in (("wait", wait_runs), ("deadline", cut_runs)):
        finals = [r["final"] for r in runs]
        t, reached = time_to(runs, target)
        out[f"{method}, {row}"] = {
            "method": method,
            "row": row,
            "seeds": len(runs),
            "accuracy_mean": statistics.mean(finals),
            "accuracy_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "time_to_target_s": t,
            "reached": reached,
            "sim_time_total_s": statistics.mean(r["sim_time_total_by_round"][-1] for r in runs),
            "stragglers_per_round": statistics.mean(
                r["stragglers"] / len(r["accuracy_by_round"]) for r in runs
            ),
            "skipped": statistics.mean(r["skipped"] for r in runs),
            "cpu_minutes": sum(r.get("wall_s", 0.0) for r in runs) / 60,
            "curves": [
                {"time": r["sim_time_total_by_round"], "accuracy": r["accuracy_by_round"]}
                for r in runs
            ],
        }
    return entry, out


def measure(seeds: range, rounds: int, out: str, records: Path, extra: list[str]) -> dict[str, Any]:
    """Run (or read) every row and derive the table's figures."""
    report: dict[str, Any] = {"rows": {}, "methods": {}, "awaiting": []}
    for method, preset in METHODS.items():
        base = common(rounds, extra)
        slug = method.lower()
        wait = run_seeded_variants(
            preset,
            {f"{slug}-wait": []},
            seeds=seeds,
            out_root=Path(out),
            common=base,
            records=records / "runs",
        )["results"][0]
        wait_runs = seed_runs(wait, records, f"{slug}-wait")
        deadline = _deadline(median_client_time(wait_runs))
        cut = run_seeded_variants(
            preset,
            {f"{slug}-deadline": deadline_rows(deadline)},
            seeds=seeds,
            out_root=Path(out),
            common=base,
            records=records / "runs",
        )["results"][0]
        cut_runs = seed_runs(cut, records, f"{slug}-deadline")
        report["methods"][method], rows = rows_of(method, deadline, wait_runs, cut_runs)
        report["rows"].update(rows)
    return report


def recorded_runs(records: Path, label: str, seeds: range) -> list[dict[str, Any]] | None:
    """Each seed's figures of the row ``label`` from its committed records (the run record and
    its figures record), or None while any seed's is missing."""
    runs = []
    for seed in seeds:
        run = records / "runs" / f"seed-{seed}" / f"{label}.json"
        figs = records / "figures" / f"seed-{seed}" / f"{label}.json"
        if not (run.exists() and figs.exists()):
            return None
        result = json.loads(run.read_text())["result"]
        runs.append(
            {
                **json.loads(figs.read_text()),
                "seed": seed,
                "final": result["final_test_accuracy"],
                "wall_s": result["wall_s"],
            }
        )
    return runs


def read_report(records: Path = RECORDS, seeds: range = range(3)) -> dict[str, Any]:
    """The table's figures from the committed records alone (``--table-only``); a method whose
    runs are not all recorded is listed under ``awaiting``. Each recorded *deadline* run must have
    run with the deadline its *wait* runs give (else the records are stale: an error)."""
    report: dict[str, Any] = {"rows": {}, "methods": {}, "awaiting": []}
    for method in METHODS:
        slug = method.lower()
        wait_runs = recorded_runs(records, f"{slug}-wait", seeds)
        cut_runs = recorded_runs(records, f"{slug}-deadline", seeds)
        if wait_runs is None or cut_runs is None:
            report["awaiting"].append(method)
            continue
        deadline = _deadline(median_client_time(wait_runs))
        for seed in seeds:
            rec = records / "runs" / f"seed-{seed}" / f"{slug}-deadline.json"
            ran = json.loads(rec.read_text())["config"]["clients"]["deadline_s"]
            if ran != deadline:
                raise ValueError(
                    f"{rec} ran with clients.deadline_s={ran}, but its wait runs give {deadline}: "
                    "the records disagree; delete the deadline records to rerun them"
                )
        report["methods"][method], rows = rows_of(method, deadline, wait_runs, cut_runs)
        report["rows"].update(rows)
    return report


def _duration(s: float | None) -> str:
    if s is None:
        return "not reached"
    return f"{s:,.1f} s" if s < 600 else f"{s / 60:,.1f} min"


def table(report: dict[str, Any]) -> str:
    head = [
        "method, rows",
        "target (lowest final acc. of *wait*)",
        "deadline",
        "final accuracy (mean ± std)",
        "simulated time to target (seeds reaching it)",
        "simulated time, all rounds",
        "stragglers dropped / round",
        "rounds skipped",
    ]
    cells = []
    for label, r in report["rows"].items():
        m = report["methods"][r["method"]]
        cells.append(
            [
                label,
                f"{100 * m['target']:.2f}%",
                "none"
                if r["row"] == "wait"
                else f"{m['deadline_s']:g} s, over-select {OVER_SELECT:g}",
                f"{100 * r['accuracy_mean']:.2f} ± {100 * r['accuracy_std']:.2f} (n={r['seeds']})",
                f"{_duration(r['time_to_target_s'])} ({r['reached']} of {r['seeds']})",
                _duration(r["sim_time_total_s"]),
                f"{r['stragglers_per_round']:.2f}",
                f"{r['skipped']:.1f}",
            ]
        )
    return "\n".join(markdown_table(head, cells, left=1))


FIGURE = (
    Path(__file__).resolve().parents[1] / "docs" / "figures" / "fleet-time" / "accuracy-vs-time.png"
)
COMMAND = "python benchmarks/fleet_time.py --table-only --docs docs/benchmarks.md"


def figure(report: dict[str, Any], path: Path = FIGURE) -> None:
    """Test accuracy against cumulative simulated time (log x), one colour per method, *wait*
    solid and *deadline* dashed; each line the mean over seeds, round by round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for label, r in report["rows"].items():
        curves = r["curves"]
        n = min(len(c["time"]) for c in curves)
        t = [statistics.mean(c["time"][i] for c in curves) for i in range(n)]
        a = [statistics.mean(c["accuracy"][i] for c in curves) for i in range(n)]
        style = "-" if r["row"] == "wait" else "--"
        ax.plot(t, a, style, color=colours[r["method"]], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("simulated time (s, log; mean over seeds)")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def reading(report: dict[str, Any]) -> str:
    """What the deadline with over-selection buys each method against waiting, from the table:
    its time to target (and how many seeds reach it), its final accuracy, its skipped rounds."""
    parts = []
    for method in report["methods"]:
        wait, cut = report["rows"][f"{method}, wait"], report["rows"][f"{method}, deadline"]
        tw, tc = wait["time_to_target_s"], cut["time_to_target_s"]
        sooner = f", {tw / tc:.1f}x sooner" if tw and tc else ""
        delta = 100 * (cut["accuracy_mean"] - wait["accuracy_mean"])
        parts.append(
            f"{method} reaches its target in {_duration(tc)} against {_duration(tw)}{sooner} "
            f"({cut['reached']} of {cut['seeds']} seeds), ends {delta:+.2f} points and skips "
            f"{cut['skipped']:.1f} of its rounds"
        )
    return "What the deadline with over-selection buys against waiting: " + "; ".join(parts) + "."


def section(report: dict[str, Any]) -> str:
    """The docs section: the protocol, the commands, the table (from the records alone), the
    runs' CPU-minutes and the figure."""
    doc = (__doc__ or "").replace("``", "`").split("\n\n")
    rel = FIGURE.relative_to(FIGURE.parents[2]).as_posix()
    parts = [
        "\n\n".join(" ".join(p.split()) for p in doc[1:3]),
        "Run (resumable, records under `benchmarks/results/fleet_time/`): "
        "`python benchmarks/fleet_time.py --seeds 3 --rounds 20`; render: "
        f"`{COMMAND}`",
    ]
    if report["rows"]:
        minutes = "; ".join(
            f"{label} {r['cpu_minutes']:.1f}" for label, r in report["rows"].items()
        )
        parts += [
            table(report) + few_seeds_note(report["rows"]),
            reading(report),
            "CPU-minutes of each row's runs (one core each, all seeds; each run record names "
            f"the machine it ran on): {minutes}.",
            f"![test accuracy against simulated time]({rel})",
        ]
    if report["awaiting"]:
        parts.append(
            "Awaiting records (runs to come, same command): " + ", ".join(report["awaiting"]) + "."
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = runs_parser(__doc__, out="runs/bench-fleet-time")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument(
        "--records", default=str(RECORDS), help="where finished runs are recorded (commit them)"
    )
    ap.add_argument("--table-only", action="store_true", help="render the records, run nothing")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more override for every row (a smaller setting for a test)",
    )
    args = ap.parse_args(argv)
    records = Path(args.records)
    if not args.table_only:
        measure(range(args.seeds), args.rounds, args.out, records, args.set)
    report = read_report(records, range(args.seeds))
    text = section(report)
    print(text)
    if args.docs:
        if report["rows"]:  # beside the docs file it renders (docs/figures/fleet-time/)
            figure(report, Path(args.docs).parent / FIGURE.relative_to(FIGURE.parents[2]))
        update_section(
            args.docs,
            "fleet-time",
            "Time to accuracy on a phone-class fleet",
            text,
            machine=records_line(records, root=Path(__file__).resolve().parents[1]),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
