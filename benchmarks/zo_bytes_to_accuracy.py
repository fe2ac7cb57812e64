"""Bytes to accuracy with BAFFLE's two downlinks (zeroth-order issue, part 4): the whole model
every round (``method.downlink=model``) against the round's seed and K aggregated loss
differences for each round a client missed (``method.downlink=seeds``, FedKSeed-style; the
full model only when that is smaller or the client is new).

Protocol: the forwards-to-accuracy benchmark's (``zo_forwards_to_accuracy.py``: batch-level
BAFFLE, LeNet, 10 IID clients, 5 sampled a round, 2000 training samples, K = 100, Gaussian
directions, server Adam at the learning rate that benchmark's screen picked on its validation
split), with and without secure aggregation, 3 seeds. The target: the lowest test accuracy the
model-downlink runs (no secure aggregation) reach after ``TARGET_ROUND`` rounds over the seeds, so
every seed reaches it by then (the forwards-to-accuracy table uses seed 0's, on its own data split). Bytes are the engine's
counts of the serialized messages (every client, both directions, key exchange included), summed
over the rounds up to and including the first round at or above the target.

Both downlinks must train the same model bit for bit (the seeds downlink rebuilds it exactly), so
their accuracy curves are compared and the table says whether they are identical. Run records:
`benchmarks/results/zo_bytes/` (every figure below is derived from them).

    python benchmarks/zo_bytes_to_accuracy.py [--out runs/bench-zo-bytes] [--docs docs/benchmarks.md]

Resumable: finished runs are recorded under ``benchmarks/results/zo_bytes/`` (commit them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zo_forwards_to_accuracy import BASE, COMMON, SEEDS, TARGET_ROUND

from fedge.bench.docs import update_section
from fedge.bench.script import script_command
from fedge.bench.variants import run_variants

RECORDS = Path(__file__).resolve().parent / "results" / "zo_bytes"
TUNED_ADAM_LR = 0.01  # picked on validation by zo_forwards_to_accuracy.py (its table states it)


def variants(lr: float) -> dict[str, list[str]]:
    out = {}
    for secure in (False, True):
        for downlink in ("model", "seeds"):
            for seed in SEEDS:
                out[f"{downlink} secure={secure} seed {seed}"] = [
                    "method.server_optimizer.name=adam",
                    "method.server_optimizer.b2=0.99",
                    f"method.server_optimizer.lr={lr}",
                    f"method.downlink={downlink}",
                    f"method.secure_aggregation={str(secure).lower()}",
                    f"seed={seed}",
                ]
    return out


def to_target(
    curve: list[float], up: list[int], down: list[int], target: float
) -> tuple[int | None, int | None, int | None]:
    """(rounds, bytes up, bytes down) summed until the first round at or above ``target``."""
    for r, acc in enumerate(curve, start=1):
        if acc >= target:
            return r, sum(up[:r]), sum(down[:r])
    return None, None, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="runs/bench-zo-bytes")
    ap.add_argument("--docs", default=None)
    ap.add_argument("--lr", type=float, default=TUNED_ADAM_LR, help="server Adam learning rate")
    args = ap.parse_args(argv)
    common = [*COMMON, "measure.flops=false"]
    vs = variants(args.lr)
    report = run_variants(BASE, vs, out_root=args.out, common=common, records=RECORDS)
    rows = {r["label"]: r for r in report["results"]}
    per_round = {}
    for label, r in rows.items():
        if r.get(
            "run_dir"
        ):  # per-round bytes come from the run; the record keeps them for the next machine
            lines = [
                json.loads(x) for x in Path(r["run_dir"], "metrics.jsonl").read_text().splitlines()
            ]
            per_round[label] = (
                [x["bytes_up"] for x in lines],
                [x["bytes_down"] for x in lines],
                [x["clients"] for x in lines],
            )
            _remember(label, per_round[label])
        else:
            per_round[label] = _recall(label)
    target = min(
        rows[f"model secure=False seed {s}"]["accuracy_by_round"][TARGET_ROUND - 1] for s in SEEDS
    )
    out = [
        f"Target: test accuracy **{target:.3f}** (model downlink, no secure aggregation, lowest over seeds after {TARGET_ROUND} "
        f"rounds). Server Adam lr {args.lr:g}. Bytes summed over all sampled clients until the first round at or above "
        "the target; per client per round: averaged over the rounds to the target.",
        "",
        "| downlink | secure aggregation | rounds to target (seeds 0, 1, 2) | total bytes to target (mean) | "
        "down B/client/round | up B/client/round | curve identical to model downlink |",
        "|---|---|---|---|---|---|---|",
    ]
    totals: dict[tuple[str, bool], float] = {}
    for secure in (False, True):
        for downlink in ("model", "seeds"):
            rounds, total, down_pc, up_pc, same = [], [], [], [], []
            for seed in SEEDS:
                label = f"{downlink} secure={secure} seed {seed}"
                up, down, clients = per_round[label]
                curve = rows[label]["accuracy_by_round"]
                r, bu, bd = to_target(curve, up, down, target)
                rounds.append(r)
                if r is not None and bu is not None and bd is not None:
                    total.append(bu + bd)
                    n = sum(clients[:r])
                    down_pc.append(bd / n)
                    up_pc.append(bu / n)
                same.append(
                    curve == rows[f"model secure={secure} seed {seed}"]["accuracy_by_round"]
                )
            mean = sum(total) / len(total) if total else None
            if mean is not None:
                totals[(downlink, secure)] = mean
            cells = [
                downlink,
                "on" if secure else "off",
                ", ".join("—" if r is None else str(r) for r in rounds),
                "—" if mean is None else f"{mean:,.0f}",
                "—" if not down_pc else f"{sum(down_pc) / len(down_pc):,.0f}",
                "—" if not up_pc else f"{sum(up_pc) / len(up_pc):,.0f}",
                "yes, every seed" if all(same) else f"NO ({sum(same)} of {len(same)} seeds)",
            ]
            out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for secure in (False, True):
        m, s = totals.get(("model", secure)), totals.get(("seeds", secure))
        if m and s:
            out.append(
                f"- Secure aggregation {'on' if secure else 'off'}: to reach the target the seeds downlink moves "
                f"{s / m:.2f}x the bytes of the model downlink ({s:,.0f} vs {m:,.0f} B)."
            )
    out += [
        "",
        "Where the bytes go: the seeds downlink sends a client it has never served the model **and the server "
        "optimizer's state** (Adam: two more model-sized tensors) once, then only the (seed, K values) of the rounds "
        "it missed. With 5 of 10 clients a round, first contacts dominate the first rounds; afterwards a round costs "
        "about a kilobyte per client, a few with secure aggregation's keys and masks (its figure is below). "
        "Cumulative bytes (both directions, all sampled clients), secure aggregation "
        "on, mean over seeds:",
        "",
        "| after round | "
        + " | ".join(str(r) for r in range(1, len(per_round["model secure=True seed 0"][0]) + 1))
        + " |",
        "|---|" + "---|" * len(per_round["model secure=True seed 0"][0]),
    ]
    cum: dict[str, list[float]] = {}
    for downlink in ("model", "seeds"):
        series = []
        for seed in SEEDS:
            up, down, _ = per_round[f"{downlink} secure=True seed {seed}"]
            series.append([sum(up[:r]) + sum(down[:r]) for r in range(1, len(up) + 1)])
        cum[downlink] = [sum(col) / len(col) for col in zip(*series)]
        out.append(
            f"| {downlink} downlink | "
            + " | ".join(f"{v / 1e6:.2f} MB" for v in cum[downlink])
            + " |"
        )
    even = next(
        (r for r, (m, s) in enumerate(zip(cum["model"], cum["seeds"]), start=1) if s < m), None
    )
    last = len(cum["model"])
    out += [
        "",
        f"- The seeds downlink is cheaper in total from round {even} on"
        if even
        else f"- The seeds downlink is not cheaper in total within {last} rounds",
        f"; per round after the first contacts it costs {(cum['seeds'][-1] - cum['seeds'][-2]) / 5:,.0f} B per client "
        f"against {(cum['model'][-1] - cum['model'][-2]) / 5:,.0f} B for the model downlink (round {last}). "
        "With a stateless server optimizer (SGD) a first contact costs one model, as the model downlink's round does.",
    ]
    out[-2:] = ["".join(out[-2:])]
    body = "\n".join(out)
    print(body)
    if args.docs:
        command = script_command(__file__, argv)
        intro = "\n\n".join((__doc__ or "").split("\n\n")[:3]).strip()
        update_section(
            args.docs,
            "zo-bytes-to-accuracy",
            "Zeroth-order bytes to accuracy: model vs seeds downlink",
            f"{intro}\n\nCommand: `{command.strip()}`\n\n{body}",
        )
    return 0


def _remember(label: str, data: Any) -> None:
    path = RECORDS / "per_round" / f"{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) + "\n")


def _recall(label: str) -> Any:
    return json.loads((RECORDS / "per_round" / f"{label}.json").read_text())


if __name__ == "__main__":
    raise SystemExit(main())
