"""Clients that fail to reply: FedAvg with and without secure aggregation under simulated
dropout (``clients.dropout``, with ``clients.min_replies`` letting a round go on), 3 seeds.

Preset ``fedavg-fmnist-lenet`` (LeNet-5, SGD lr 0.05 momentum 0.9, one local epoch of batches of
32) reduced to 6,000 Fashion-MNIST training samples over 20 IID clients, 10 sampled per round,
10 rounds, 2,000 test images, one torch thread. Each client an exchange addresses drops out with
probability p before replying (a seeded draw per round, exchange and client). Plain FedAvg has
one exchange a round, so a client's input is lost with probability p; secure aggregation has
four, and an input is in the sum only if its client answered the first three, 1 - (1 - p)^3 lost;
a secure round with fewer than its threshold t = 6 of the 10 (``secagg_threshold`` 0.6) inputs
or unmasking shares cannot be unmasked and is skipped (the model left as it was). A control row
samples 7 clients per round with no dropout (what p = 0.3 leaves plain FedAvg).

Per row: final test accuracy (mean ± std over seeds), rounds skipped, clients whose input is in
each round's mean (mean over rounds and seeds; 0 for a skipped round), clients failed per round,
bytes down/up per round, and server-side seconds per round
(the round's wall time minus its clients' and evaluation's: aggregation, and for secure
aggregation the unmasking, which reconstructs a dropped client's pair masks from shares).

    python benchmarks/client_failures.py [--out runs/bench-client-failures] [--seeds 3] [--docs docs/benchmarks.md]

Each run directory is reused when complete and resumed when interrupted, so the script resumes.
With ``--docs`` the table's figures are kept as the section's record
(benchmarks/results/measured/client-failures.json) and the section is rendered from it;
``--table-only`` re-renders it from the record without running anything.
"""

from __future__ import annotations

import statistics
from typing import Any

from fedge.bench import measured
from fedge.bench.docs import markdown_table
from fedge.bench.figures import few_seeds_note, read_run_logs
from fedge.bench.script import record_flags, report_and_document, runs_parser, table_only
from fedge.bench.variants import run_seeded_variants

PRESET = "fedavg-fmnist-lenet"
ROUNDS = 10
COMMON = [
    "threads=1",
    f"rounds={ROUNDS}",
    f"eval_every={ROUNDS}",
    "dataset.limit_train=6000",
    "dataset.limit_test=2000",
    "clients.num=20",
    "clients.per_round=10",
    "clients.min_replies=2",
]
DROPOUTS = (0.0, 0.1, 0.3)
ROWS: dict[str, list[str]] = {}
for _p in DROPOUTS:
    ROWS[f"FedAvg, dropout {_p:g}"] = [f"clients.dropout={_p}"]
    ROWS[f"FedAvg + secure aggregation, dropout {_p:g}"] = [
        f"clients.dropout={_p}",
        "method.secure_aggregation=true",
    ]
CONTROL = "FedAvg, 7 clients per round, no dropout"
ROWS[CONTROL] = ["clients.per_round=7", "clients.min_replies=null"]


def _figures(run_dir: str) -> dict[str, Any]:
    summary, lines = read_run_logs(run_dir)
    summed = [
        0
        if x.get("round_skipped")
        else x.get("secagg_survivors", x["clients"] - x.get("clients_failed", 0))
        for x in lines
    ]
    server = [
        x["wall_s"] - x["client_wall_s"] for x in lines if x.get("test_accuracy") is None
    ]  # rounds without evaluation
    return {
        "accuracy": summary["final_test_accuracy"],
        "skipped": sum(1 for x in lines if x.get("round_skipped")),
        "summed": statistics.mean(summed),
        "failed": statistics.mean(x.get("clients_failed", 0) for x in lines),
        "bytes_down": statistics.mean(x["bytes_down"] for x in lines),
        "bytes_up": statistics.mean(x["bytes_up"] for x in lines),
        "server_s": statistics.mean(server) if server else None,
    }


def _row(run_dirs: list[str]) -> dict[str, Any]:
    per = [_figures(d) for d in run_dirs]
    acc = [p["accuracy"] for p in per]
    out = {
        k: statistics.mean(p[k] for p in per)
        for k in ("skipped", "summed", "failed", "bytes_down", "bytes_up")
    }
    server = [p["server_s"] for p in per if p["server_s"] is not None]
    out.update(
        accuracy_mean=statistics.mean(acc),
        accuracy_std=statistics.stdev(acc) if len(acc) > 1 else 0.0,
        accuracies=acc,
        server_s=statistics.mean(server) if server else None,
        seeds=len(per),
        run_dirs=run_dirs,
    )
    return out


def table(report: dict[str, Any]) -> str:
    head = [
        "row",
        "final accuracy (mean ± std)",
        f"rounds skipped (of {ROUNDS})",
        "inputs in the mean / round",
        "clients failed / round",
        "bytes down / round",
        "bytes up / round",
        "server s / round",
    ]
    cells = [
        [
            label,
            f"{100 * r['accuracy_mean']:.2f} ± {100 * r['accuracy_std']:.2f} (n={r['seeds']})",
            f"{r['skipped']:.1f}",
            f"{r['summed']:.2f}",
            f"{r['failed']:.2f}",
            f"{r['bytes_down']:,.0f}",
            f"{r['bytes_up']:,.0f}",
            "n/a" if r["server_s"] is None else f"{r['server_s']:.3f}",
        ]
        for label, r in report["rows"].items()
    ]
    return "\n".join(markdown_table(head, cells, left=1))


def _notes(report: dict[str, Any]) -> str:
    rows = report["rows"]
    plain0, plain1, plain3 = (rows[f"FedAvg, dropout {p:g}"] for p in DROPOUTS)
    sec0, sec1, sec3 = (rows[f"FedAvg + secure aggregation, dropout {p:g}"] for p in DROPOUTS)
    few = rows[CONTROL]
    text = (
        f"\n\nAt p = 0.3, plain FedAvg averages {plain3['summed']:.2f} inputs a round (expected 7) and reaches "
        f"{100 * plain3['accuracy_mean']:.2f}% (no dropout: {100 * plain0['accuracy_mean']:.2f}%; the control row, 7 "
        f"clients sampled with no dropout: {100 * few['accuracy_mean']:.2f}%). Secure aggregation fares far worse under "
        f"the same dropout: an input must survive three exchanges (expected {10 * 0.7**3:.2f} of 10 at p = 0.3, "
        f"{10 * 0.9**3:.2f} at p = 0.1) and a round needs t = 6 of them, so it skips {sec1['skipped']:.1f} of {ROUNDS} "
        f"rounds at p = 0.1 and {sec3['skipped']:.1f} at p = 0.3, ending at {100 * sec1['accuracy_mean']:.2f}% and "
        f"{100 * sec3['accuracy_mean']:.2f}% (no dropout: {100 * sec0['accuracy_mean']:.2f}%). Under heavy dropout, "
        "sample more clients per round or lower `method.secagg_threshold` (a security trade-off: fewer colluding "
        "clients suffice to unmask one). Bytes fall with the failures: a failed client's downlink is counted (it "
        "was sent), its uplink is not."
    )
    if sec0["server_s"] and sec1["server_s"]:
        text += (
            f" Secure aggregation's server time per round: {sec0['server_s']:.3f} s with no dropout, "
            f"{sec1['server_s']:.3f} s at p = 0.1, where fewer inputs to unmask weigh more than the dropped clients' "
            "pair masks it reconstructs (timings on a machine shared with other jobs: compare within the table)."
        )
    return text + few_seeds_note(rows)


def markdown(report: dict[str, Any], command: str) -> str:
    doc = (
        (__doc__ or "").replace("``", "`").split("\n\n")
    )  # the setting and the columns, as the docstring says them
    return (
        f"Command: `{command}`\n\n"
        + "\n\n".join(" ".join(p.split()) for p in doc[1:3])
        + "\n\n"
        + table(report)
        + _notes(report)
    )


SECTION = measured.Section("client-failures", "Clients that fail to reply", markdown)


def main(argv: list[str] | None = None) -> int:
    ap = runs_parser(__doc__, out="runs/bench-client-failures")
    ap.add_argument("--seeds", type=int, default=3)
    args = record_flags(ap).parse_args(argv)
    if args.table_only:
        return table_only(ap, SECTION, args)
    started = measured.start()
    runs = run_seeded_variants(
        PRESET, ROWS, seeds=range(args.seeds), out_root=args.out, common=COMMON
    )
    report = {
        "rows": {r["label"]: _row([x["run_dir"] for x in r["runs"]]) for r in runs["results"]}
    }
    return report_and_document(
        report,
        table(report),
        args.docs,
        section=SECTION,
        started=started,
        script=__file__,
        argv=argv,
        records=args.records,
    )


if __name__ == "__main__":
    raise SystemExit(main())
