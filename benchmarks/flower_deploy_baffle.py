"""BAFFLE on a real Flower deployment over loopback (Flower issue's second benchmark): one SuperLink
and 4 SuperNodes as separate processes on 127.0.0.1 run ``baffle-fmnist-lenet`` (batch mode, so
the uplink is K loss differences; secure aggregation on, its default there), and the same config
on fedge's built-in engine. Per round: test accuracy, fedge's own byte counts (the serialized
messages) and Flower's message bytes on the wire (its records, with metadata), and wall time.

    python benchmarks/flower_deploy_baffle.py [--rounds 2] [--docs docs/benchmarks.md]

With ``--docs`` the per-round lines are kept as the section's record
(benchmarks/results/measured/flower-deploy-baffle.json) and the section is rendered from it;
``--table-only`` re-renders it from the record without deploying anything.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fedge.bench import measured
from fedge.bench.script import record_flags, script_command, table_only
from fedge.core.config import load_config
from fedge.experiment.flower import loopback, submit
from fedge.experiment.run import run_experiment

NODES = 4


def lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def measure(rounds: int) -> dict:
    """Run the config on the engine and on a loopback deployment: each one's metrics lines."""
    overrides = [
        f"rounds={rounds}",
        f"clients.num={NODES}",
        f"clients.per_round={NODES}",
        "method.mode=batch",
        "threads=1",
    ]
    cfg = load_config("baffle-fmnist-lenet", overrides=overrides)
    with tempfile.TemporaryDirectory(prefix="fedge-deploy-") as tmp:
        t = Path(tmp)
        engine = lines(run_experiment(cfg, out=t / "engine", render=False))
        with loopback(NODES, workdir=t / "flwr") as superlink:
            deployed = lines(
                submit(
                    cfg,
                    out=t / "deployed",
                    superlink=superlink,
                    insecure=True,
                    workdir=t / "app",
                    timeout=1200,
                )
            )
    return {"nodes": NODES, "rounds": rounds, "engine": engine, "deployed": deployed}


def same(report: dict) -> bool:
    """Whether the deployment's accuracy and fedge byte counts equal the engine's every round."""
    return all(
        a["test_accuracy"] == b["test_accuracy"]
        and a["bytes_up"] == b["bytes_up"]
        and a["bytes_down"] == b["bytes_down"]
        for a, b in zip(report["engine"], report["deployed"], strict=True)
    )


def markdown(report: dict, command: str) -> str:
    nodes, rounds = report["nodes"], report["rounds"]
    rows = [
        "| runtime | round | test accuracy | fedge bytes down / up (all clients) | Flower message bytes down / up | "
        "Flower / fedge (down, up) | round wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, run in (("engine", report["engine"]), ("Flower deployment", report["deployed"])):
        for x in run:
            fl = (x.get("flower_bytes_down"), x.get("flower_bytes_up"))
            wire = "—" if fl[0] is None else f"{fl[0]:,} / {fl[1]:,}"
            ratio = (
                "—"
                if fl[0] is None
                else f"{fl[0] / x['bytes_down']:.4f}, {fl[1] / x['bytes_up']:.3f}"
            )
            rows.append(
                f"| {name} | {x['round']} | {x['test_accuracy']:.4f} | {x['bytes_down']:,} / {x['bytes_up']:,} | "
                f"{wire} | {ratio} | {x['wall_s']:.1f} |"
            )
    return "\n".join(
        [
            f"One SuperLink and {nodes} SuperNodes as separate processes on 127.0.0.1 (`fedge.experiment.flower.loopback`), "
            f"`baffle-fmnist-lenet` in batch mode (K = 100 loss differences up, secure aggregation on: its four exchanges a "
            f"round travel as Flower messages) with {nodes} clients, all every round, {rounds} rounds; the same config "
            "on the built-in engine. Wall times are indicative (they depend on the machine's load, on the Machine line; "
            "Flower's deployment polls, so a round has a floor of seconds).",
            "",
            f"Command: `{command.strip()}`",
            "",
            *rows,
            "",
            f"Per-round accuracy and fedge's byte counts {'equal' if same(report) else 'DIFFER from'} the engine's in every round. "
            "Flower's bytes are its messages' record sizes (arrays, config and metadata) as the adapter sees them.",
        ]
    )


SECTION = measured.Section(
    "flower-deploy-baffle", "Flower loopback deployment: BAFFLE, 4 SuperNodes", markdown
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--docs", default=None)
    args = record_flags(ap).parse_args(argv)
    if args.table_only:
        return table_only(ap, SECTION, args)
    command = script_command(__file__, argv)
    report = measured.measure(
        SECTION,
        lambda: measure(args.rounds),
        command=command,
        docs=args.docs,
        records=args.records,
    )
    print(markdown(report, command))
    return 0 if same(report) else 1


if __name__ == "__main__":
    raise SystemExit(main())
