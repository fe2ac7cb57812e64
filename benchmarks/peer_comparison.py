"""The peer comparison of issue 44: which forward-only method to run, and what it costs against
backprop, rendered from the records of the zeroth-order frontier (``benchmarks/zo_frontier.py``
runs every row, one protocol for all; this script runs nothing). Rows: BP FedAvg, BP FedAvg with
a top-k 1% uplink and error feedback, BP FedSGD, BAFFLE K = 100 (epoch and batch mode), FedZO,
FedKSeed, FedKSeed-Pro, DeComFL and FeedSign.

For each row: the learning rate the frontier's validation screen picked, the final test accuracy
(mean ± std over seeds 0, 1, 2), client FLOPs per client-round (the row's probe: one client's
round metered) and in total (all clients, the run), bytes up and down per client-round (mean over
the run) and in total (all clients, the run), client memory (the probe's tensor accounting), and
the rounds, total client FLOPs and total bytes (up + down, all clients) at the first evaluated
round whose test accuracy reaches ``TARGET``. A figure plots each row's test accuracy (mean over
its seeds, round by round) against cumulative total client FLOPs and against cumulative total
bytes; the plotted data travel in the PNG's text chunk ``DATA_KEY``, which the docs test checks
against the records. A row whose records are incomplete is listed with what it awaits.

    python benchmarks/peer_comparison.py --docs docs/benchmarks.md   # render the records

(``zo_frontier.py --table-only --docs docs/benchmarks.md`` renders this section too.)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zo_frontier as zf

from fedge.bench.docs import records_line, update_section

ROOT = zf.ROOT
FIGURE = ROOT / "docs" / "figures" / "peer-comparison" / "accuracy_vs_cost.png"
DATA_KEY = "fedge:peer-comparison"  # the PNG text chunk holding the plotted data
NAME = "peer-comparison"
TITLE = "Forward-only peers against BAFFLE and backprop on one protocol (issue 44)"
FEDZO = "FedZO (BAFFLE epoch, forward, K=20, SGD)"
ROWS = (
    "BP FedAvg",
    zf.BP_TOPK,
    "BP FedSGD",
    "BAFFLE K=100",
    "BAFFLE K=100 (batch mode)",
    FEDZO,
    "FedKSeed",
    "FedKSeed-Pro",
    "DeComFL",
    "FeedSign",
)
# The common target: the non-IID / slow-uplink table's (bench:noniid-uplink), so the two read
# together; fixed, not taken from the records (a target from the rows would move as rows land),
# and one that the peers below it show they miss.
TARGET = 0.70
COMMAND = "python benchmarks/peer_comparison.py --docs docs/benchmarks.md"
FRONTIER_ANCHOR = "#the-zeroth-order-frontier-forward-only-clients-against-backprop-issue-45"


def rounds_of(row: zf.Row) -> int:
    """The rounds a row runs (its own ``rounds=`` override, else the protocol's)."""
    given = [int(o.split("=")[1]) for o in row.overrides if o.startswith("rounds=")]
    return given[-1] if given else zf.ROUNDS


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.mean(xs) if xs else None


def to_target(result: dict[str, Any], flops: list[float] | None) -> dict[str, Any] | None:
    """One seed's cost at its first evaluated round whose test accuracy reaches ``TARGET``: the
    round, total bytes up + down (all clients) and total client FLOPs (None without the probe);
    None when no evaluated round reaches it."""
    for i, acc in enumerate(result["test_accuracy_by_round"]):
        if acc is not None and acc >= TARGET:
            up = result["cum_bytes_up_per_client_by_round"][i]
            down = result["cum_bytes_down_per_client_by_round"][i]
            return {
                "round": result["rounds"][i],
                "bytes": (up + down) * zf.CLIENTS,
                "flops": None if flops is None else flops[i],
            }
    return None


def row_figures(
    row: zf.Row, state: dict[str, Any], seeds: Sequence[int] = zf.SEEDS
) -> dict[str, Any]:
    """A row's figures from the records in ``state`` (:func:`zo_frontier.read_records`), with
    what it still awaits (``awaits``: the screen, seeds, the probe)."""
    screened = state["screens"].get(row.label, {})
    p = zf.picked(row, screened)
    runs = state["runs"].get(row.label, {})
    probe = state["probes"].get(row.label)
    awaits = [] if p is not None else ["screen"]
    missing = [s for s in seeds if s not in runs]
    if missing:
        awaits.append("seed" + ("s " if len(missing) > 1 else " ") + ", ".join(map(str, missing)))
    if probe is None:
        awaits.append("probe")
    done = {s: r for s, r in sorted(runs.items()) if "diverged_round" not in r}
    out: dict[str, Any] = {
        "lr": None if p is None else p[0],
        "rounds": rounds_of(row),
        "seeds": sorted(done),
        "diverged": sorted(set(runs) - set(done)),
        "awaits": awaits,
        "flops_round": None if probe is None else probe.get("client_flops_round1"),
        "memory": None if probe is None else probe.get("client_tensor_peak_bytes"),
    }
    if not done:
        return out
    finals = [r["test_accuracy_by_round"][-1] for r in done.values()]
    flops = {s: zf.flops_by_round(r, out["flops_round"]) for s, r in done.items()}
    hits = [h for s, r in done.items() if (h := to_target(r, flops[s])) is not None]
    ups = [r["cum_bytes_up_per_client_by_round"][-1] for r in done.values()]
    downs = [r["cum_bytes_down_per_client_by_round"][-1] for r in done.values()]
    last = [r["rounds"][-1] for r in done.values()]
    out.update(
        mean=statistics.mean(finals),
        std=statistics.stdev(finals) if len(finals) > 1 else None,
        up_round=statistics.mean(u / n for u, n in zip(ups, last, strict=True)),
        down_round=statistics.mean(d / n for d, n in zip(downs, last, strict=True)),
        up_total=statistics.mean(ups) * zf.CLIENTS,
        down_total=statistics.mean(downs) * zf.CLIENTS,
        flops_total=_mean([f[-1] for f in flops.values() if f is not None]),
        best=max(
            max(a for a in r["test_accuracy_by_round"] if a is not None) for r in done.values()
        ),
        reached=len(hits),
        round_to_target=_mean([h["round"] for h in hits]),
        bytes_to_target=_mean([h["bytes"] for h in hits]),
        flops_to_target=_mean([h["flops"] for h in hits if h["flops"] is not None]),
    )
    return out


def curves(state: dict[str, Any]) -> dict[str, Any]:
    """The figure's data: per row with recorded seeds, the evaluated rounds and, at each, the test
    accuracy, cumulative total client FLOPs (None without the probe) and cumulative total bytes
    up + down (all clients), each the mean over the row's seeds (which share their rounds)."""
    out: dict[str, Any] = {}
    for label in ROWS:
        row = state["rows"].get(label)
        runs = state["runs"].get(label, {})
        done = [r for _, r in sorted(runs.items()) if "diverged_round" not in r]
        if row is None or not done:
            continue
        rounds = done[0]["rounds"]
        if any(r["rounds"] != rounds for r in done):
            raise ValueError(f"{label}: its seeds were evaluated at different rounds")
        probe = state["probes"].get(label, {}).get("client_flops_round1")
        flops = [f for r in done if (f := zf.flops_by_round(r, probe)) is not None]
        by_seed_bytes = [
            [
                (u + d) * zf.CLIENTS
                for u, d in zip(
                    r["cum_bytes_up_per_client_by_round"],
                    r["cum_bytes_down_per_client_by_round"],
                    strict=True,
                )
            ]
            for r in done
        ]
        out[label] = {
            "seeds": len(done),
            "rounds": list(rounds),
            "accuracy": [
                statistics.mean(xs)
                for xs in zip(*(r["test_accuracy_by_round"] for r in done), strict=True)
            ],
            "flops": [statistics.mean(xs) for xs in zip(*flops, strict=True)]
            if len(flops) == len(done)
            else None,
            "bytes": [statistics.mean(xs) for xs in zip(*by_seed_bytes, strict=True)],
        }
    return {"target": TARGET, "curves": out}


def registered(methods: Sequence[str] | None) -> Sequence[str]:
    """``methods``, or the methods registered now (the peers a row needs) when None."""
    if methods is not None:
        return methods
    from fedge.methods import method_names

    return method_names()


def _lr(row: zf.Row, lr: float | None) -> str:
    return "awaiting screen" if lr is None else f"{lr:g} ({row.lr_key.removeprefix('method.')})"


def _seeds(f: dict[str, Any]) -> str:
    n = f"{len(f['seeds'])}/{len(zf.SEEDS)}"
    return n + (f", {len(f['diverged'])} diverged" if f["diverged"] else "")


def _acc(f: dict[str, Any]) -> str:
    if "mean" not in f:
        return "diverged" if f["diverged"] else "awaiting records"
    return f"{f['mean']:.4f}" + (" (one seed)" if f["std"] is None else f" ± {f['std']:.4f}")


def _rounds(x: float) -> str:
    return f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def _b(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def table(
    records: Path = zf.RECORDS, methods: Sequence[str] | None = None
) -> tuple[str, dict[str, dict[str, Any]]]:
    """The section's tables and notes from the records alone, and each row's figures."""
    state = zf.read_records(records, registered(methods))
    figs = {
        label: row_figures(state["rows"][label], state) for label in ROWS if label in state["rows"]
    }
    lines = [
        "| row | lr (key) | seeds | rounds | final test acc (mean ± std) | client FLOPs per "
        "client-round | total client FLOPs | B up / down per client-round | total MB up / down "
        "| client memory MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label in ROWS:
        if label not in figs:
            lines.append(f"| {label} | not registered | | | | | | | | |")
            continue
        f, row = figs[label], state["rows"][label]
        cells = [label, _lr(row, f["lr"]), _seeds(f), str(f["rounds"]), _acc(f)]
        flops_round = zf._e(f["flops_round"])
        if "mean" not in f:
            cells += [flops_round, "", "", "", zf._mb(f["memory"])]
        else:
            cells += [
                flops_round,
                zf._e(f["flops_total"]),
                f"{_b(f['up_round'])} / {_b(f['down_round'])}",
                f"{zf._mb(f['up_total'])} / {zf._mb(f['down_total'])}",
                zf._mb(f["memory"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"To the target, test accuracy {TARGET:.2f} (the first evaluated round that reaches it; "
        "mean over the seeds that do):",
        "",
        "| row | seeds reaching it | rounds | total client FLOPs | total MB up + down |",
        "|---|---|---|---|---|",
    ]
    for label in ROWS:
        if label not in figs or "mean" not in figs[label]:
            state_cell = (
                "diverged" if label in figs and figs[label]["diverged"] else "awaiting records"
            )
            lines.append(f"| {label} | {state_cell} | | | |")
            continue
        f = figs[label]
        if not f["reached"]:
            lines.append(
                f"| {label} | 0/{len(f['seeds'])}: not reached (best {f['best']:.4f}) | | | |"
            )
            continue
        lines.append(
            f"| {label} | {f['reached']}/{len(f['seeds'])} | {_rounds(f['round_to_target'])} "
            f"| {zf._e(f['flops_to_target']) if f['flops_round'] is not None else 'awaiting the probe'} "
            f"| {zf._mb(f['bytes_to_target'])} |"
        )
    awaiting = [f"{label} ({', '.join(f['awaits'])})" for label, f in figs.items() if f["awaits"]]
    lines += [
        "",
        "Awaiting records: " + ("; ".join(awaiting) + "." if awaiting else "none."),
        "",
        verdict(figs),
    ]
    return "\n".join(lines), figs


def verdict(figs: dict[str, dict[str, Any]]) -> str:
    """Two sentences from the rows with every seed recorded: the best forward-only row against
    BP FedAvg (its gap in points, its total client FLOPs and total bytes as multiples of BP
    FedAvg's), and the row that reaches the target on every seed with the fewest total bytes."""
    bp = figs.get("BP FedAvg", {})
    complete = {k: f for k, f in figs.items() if "mean" in f and len(f["seeds"]) == len(zf.SEEDS)}
    forward = {k: f for k, f in complete.items() if not k.startswith("BP ")}
    if "mean" not in bp or not forward:
        return "Read: awaiting records (BP FedAvg and a forward-only row with every seed)."
    best = max(forward, key=lambda k: (forward[k]["mean"], k))
    f = forward[best]
    total = (f["up_total"] + f["down_total"]) / (bp["up_total"] + bp["down_total"])
    flops = (
        "its FLOPs await the probe"
        if f["flops_total"] is None or bp["flops_total"] is None
        else f"{f['flops_total'] / bp['flops_total']:.1f}x its total client FLOPs"
    )
    out = (
        f"Read: of the forward-only rows with every seed recorded, {best} ends highest, at "
        f"{f['mean']:.4f}, {100 * (bp['mean'] - f['mean']):.2f} points below BP FedAvg "
        f"({bp['mean']:.4f}), at {flops} and {total:#.3g}x its total bytes (up + down)."
    )
    reach = {k: f for k, f in complete.items() if f["reached"] == len(zf.SEEDS)}
    if reach:
        cheapest = min(reach, key=lambda k: (reach[k]["bytes_to_target"], k))
        c = reach[cheapest]
        out += (
            f" Fewest total bytes to the target on every seed: {cheapest}, "
            f"{zf._mb(c['bytes_to_target'])} MB in {_rounds(c['round_to_target'])} rounds"
            + (
                ""
                if cheapest == "BP FedAvg" or "mean" not in bp or not bp["reached"]
                else f" (BP FedAvg: {zf._mb(bp['bytes_to_target'])} MB in "
                f"{_rounds(bp['round_to_target'])})"
            )
            + "."
        )
    return out


def section(records: Path = zf.RECORDS, methods: Sequence[str] | None = None) -> str:
    """The docs section: the protocol and budget, the command, the tables and the figure."""
    methods = registered(methods)
    body, _ = table(records, methods)
    rel = FIGURE.relative_to(ROOT / "docs").as_posix()
    every = zf.rows({}, methods)
    steps = ", ".join(r for r in ROWS if r in every and rounds_of(every[r]) != zf.ROUNDS)
    return "\n".join(
        [
            "**Protocol**: the zeroth-order frontier's, the same for every row "
            f"([its protocol, tuning and FLOP accounting]({FRONTIER_ANCHOR})): Fashion-MNIST, "
            "an MLP 784-32-10 (n = 25,450), 10 IID clients of 1,000 training samples, all every "
            "round, 2,000 held out for validation, the 10,000-image test set, batches of 20, "
            "seeds 0, 1, 2; each row's learning rate picked on validation (runs of half the "
            "budget on seed 0), never on test. The rows run in the frontier's table; this section reads "
            "the same records, and the machines and CPU-minutes of every unit are listed there.",
            "",
            "**Budget, matched on client samples**: every client passes over its 1,000 samples 20 "
            f"times (1,000 local steps of 20 samples): 20 rounds of 50 local steps, or {zf.ROUNDS * 50:,} "
            f"rounds of one step for {steps} (evaluated every 50th round). Rounds, client FLOPs and "
            "bytes then differ by method; all three are given, per client-round (bytes: the mean "
            "over the run's rounds) and in total (all 10 clients, the whole run). Client FLOPs are "
            "the probe's one metered client-round (forwards only for the forward-only rows) times "
            "10 clients times the rounds; memory is the probe's peak of client tensors "
            "(`measure.memory`, tensor accounting).",
            "",
            f"**Target**: test accuracy {TARGET:.2f}, the non-IID / slow-uplink table's target "
            "(so the two read together), fixed rather than taken from these rows' results. "
            "'Not reached' gives the best accuracy any seed reached.",
            "",
            f"Render (runs nothing): `{COMMAND}`; run a row: `OMP_NUM_THREADS=1 python "
            'benchmarks/zo_frontier.py --rows "ROW" --seeds 0 1 2`.',
            "",
            body,
            "",
            f"![test accuracy against total client FLOPs and total bytes, one line per row]({rel})",
        ]
    )


def figure(data: dict[str, Any], path: Path = FIGURE) -> Path:
    """Two panels, test accuracy against cumulative total client FLOPs (log x) and against
    cumulative total bytes up + down (log x), one line per row (the mean over its seeds), the
    target dotted; ``data`` (:func:`curves`) is written into the PNG's text chunk ``DATA_KEY``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, 2, i + 1) for i in range(2)]
    for i, label in enumerate(ROWS):
        c = data["curves"].get(label)
        if c is None:
            continue
        style: dict[str, Any] = {
            "ls": "--" if label.startswith("BP ") else "-",
            "color": f"C{i % 10}",
            "lw": 1.4,
        }
        name = f"{label} ({c['seeds']} seed{'s' if c['seeds'] > 1 else ''})"
        if c["flops"] is not None:
            axes[0].plot(c["flops"], c["accuracy"], label=name, **style)
        axes[1].plot(c["bytes"], c["accuracy"], label=name, **style)
    for ax, xlabel in zip(
        axes,
        ("total client FLOPs (all clients, log)", "total bytes up + down (all clients, log)"),
        strict=True,
    ):
        ax.axhline(data["target"], color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (mean over seeds)")
        ax.grid(True, alpha=0.3)
    absent = [k for k, c in data["curves"].items() if c["flops"] is None]
    if absent:
        axes[0].set_title(f"left out, awaiting the probe: {', '.join(absent)}", fontsize=8)
    axes[1].legend(fontsize=7, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None, DATA_KEY: json.dumps(data)})
    return path


def figure_data(path: Path = FIGURE) -> dict[str, Any]:
    """The data a figure written by :func:`figure` plotted (its PNG text chunk)."""
    from PIL import Image, PngImagePlugin

    with Image.open(path) as im:
        if not isinstance(im, PngImagePlugin.PngImageFile):
            raise ValueError(f"{path}: not a PNG written by figure(); rerun the script with --docs")
        text: str = im.text[DATA_KEY]
    out: dict[str, Any] = json.loads(text)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", default=str(zf.RECORDS), help=argparse.SUPPRESS)
    ap.add_argument("--docs", default=None, help="rewrite the peer-comparison section of this file")
    args = ap.parse_args(argv)
    text = section(Path(args.records))
    print(text)
    if args.docs:
        render(Path(args.records), args.docs)
    return 0


def render(records: Path, docs: str | Path, methods: Sequence[str] | None = None) -> None:
    """Rewrite the section in ``docs`` and the figure from ``records`` (what ``--docs`` does;
    ``zo_frontier.py --docs`` calls it too, the two sections reading the same records)."""
    methods = registered(methods)
    figure(curves(zf.read_records(records, methods)))
    text = section(records, methods)
    update_section(docs, NAME, TITLE, text, machine=records_line(records, root=ROOT))


if __name__ == "__main__":
    raise SystemExit(main())
