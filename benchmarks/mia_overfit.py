"""Membership inference against models that actually fit their training data (issue 12).

The privacy-leakage table's MIA cells are at chance because its tiny runs barely train. Here
each method trains LeNet-5 on Fashion-MNIST with few samples per client and several local
epochs, so that the released model has something to give away; the loss-threshold,
shadow-model and offline-LiRA attacks (:func:`fedge.attacks.membership_run.membership_by_round`)
run against the global model after rounds 1, R/2 and R (every method broadcasts it, so an
honest-but-curious holder of the broadcasts sees each). Members: every training sample;
non-members: as many test samples; shadows: runs of the same config with another seed on
the attacker's data (test samples not used as non-members). One seed.

Each method's row is recorded, when measured, under ``benchmarks/results/mia_overfit/`` (its
settings, the machine and its figures); a recorded row is read, not measured again (resumable
per row), and ``--table-only`` renders the section from the records alone.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/mia_overfit.py --docs docs/benchmarks.md
    python benchmarks/mia_overfit.py --table-only --docs docs/benchmarks.md   # render the records
"""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from fedge.attacks.harness import attack_config
from fedge.attacks.membership import chance_auc_std
from fedge.attacks.membership_run import membership_by_round
from fedge.bench.docs import records_line, update_section
from fedge.bench.script import (
    load_measurement,
    measurement_parser,
    measurement_settings,
    save_measurement,
)
from fedge.bench.tables import machine_name
from fedge.core.errors import ConfigError
from fedge.experiment.build import build_run
from fedge.experiment.provenance import machine

RECORDS = Path(__file__).resolve().parent / "results" / "mia_overfit"

SETTINGS: dict[str, Any] = {
    "clients": 4,
    "per_client": 16,
    "rounds": 20,
    "local_epochs": 5,
    "batch": 8,
    "k": 100,
    "shadows": 2,
    "test": 1000,
    "model": "lenet5",
}


def rows(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    sgd = {"name": "sgd", "lr": 0.05, "momentum": 0.9}
    common = {"local_epochs": s["local_epochs"], "batch_size": s["batch"]}
    return {
        "fedavg (backprop)": {"name": "fedavg", **common, "client_optimizer": sgd},
        "fedpt, largest layer frozen (backprop)": {
            "name": "fedpt",
            "freeze": "largest",
            **common,
            "client_optimizer": sgd,
        },
        f"baffle epoch, K={s['k']} (forward only)": {
            "name": "baffle",
            "mode": "epoch",
            "k": s["k"],
            "ema": None,
            **common,
            "client_optimizer": {"name": "adam", "lr": 0.01},
        },
    }


def measure(label: str, method: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    cfg = attack_config(
        method,
        clients=s["clients"],
        per_client=s["per_client"],
        model=s["model"],
        test=s["test"],
        rounds=s["rounds"],
    )
    keep = sorted({1, max(1, s["rounds"] // 2), s["rounds"]})
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = membership_by_round(
            build_run(cfg), keep, samples=s["clients"] * s["per_client"], shadows=s["shadows"]
        )
    return {"row": label, **r, "seconds": time.perf_counter() - t}


def slug(label: str) -> str:
    """A row's record name: its label in lower-case words joined by dashes."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def recorded_row(
    label: str, method: dict[str, Any], s: dict[str, Any], records: Path, *, run: bool
) -> dict[str, Any] | None:
    """Row ``label``'s figures from its record in ``records`` (made with the same settings and
    method), else measured and recorded when ``run``, else None."""
    path = records / f"{slug(label)}.json"
    want = {"settings": s, "method": method}
    if path.exists():
        rec = json.loads(path.read_text())
        have = {"settings": rec["settings"], "method": rec["method"]}
        if have != json.loads(json.dumps(want)):
            raise ConfigError(
                f"record {str(path)!r} was made with other settings or another method config than "
                f"this row asks for ({have} against {want}); delete it to measure the row again"
            )
        return dict(rec["result"])
    if not run:
        return None
    result = measure(label, method, s)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")  # written whole, then renamed: never a half record
    tmp.write_text(
        json.dumps({**want, "machine": machine(), "result": result}, indent=1, default=str) + "\n"
    )
    tmp.replace(path)
    return result


def ran_on(records: Path, results: list[dict[str, Any]]) -> str:
    """Where the recorded rows ran (from their records' ``machine``)."""
    where: dict[str, list[str]] = {}
    for r in results:
        rec = json.loads((records / f"{slug(r['row'])}.json").read_text())
        where.setdefault(machine_name(rec["machine"]), []).append(r["row"].split(" (")[0])
    return "; ".join(f"{m}: {', '.join(rows)}" for m, rows in where.items())


def _cell(m: dict[str, Any], key: str) -> str:
    return " / ".join(
        format(m[k][key], ".2f") if k in m else "—" for k in ("loss", "shadow", "lira")
    )


def render(
    results: list[dict[str, Any]], s: dict[str, Any], seconds: float, where: str = ""
) -> str:
    head = [
        "method",
        "round",
        "test acc.",
        "train acc.",
        "AUC loss / shadow / LiRA",
        "TPR@1%FPR",
        "precision",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        for rnd, m in r["rounds"].items():
            lines.append(
                f"| {r['row']} | {rnd} | {m['test_accuracy']:.2f} | {m['train_accuracy']:.2f} | "
                f"{_cell(m, 'auc')} | {_cell(m, 'tpr_at_1pct_fpr')} | {_cell(m, 'precision')} |"
            )
    n = s["clients"] * s["per_client"]
    shown = ",".join(results[0]["rounds"]) if results else ""
    last = str(s["rounds"])
    verdict = "; ".join(
        f"{r['row'].split(' (')[0]}: train − test accuracy {r['rounds'][last]['train_accuracy'] - r['rounds'][last]['test_accuracy']:.2f}, "
        f"best AUC {max(r['rounds'][last][k]['auc'] for k in ('loss', 'shadow', 'lira') if k in r['rounds'][last]):.2f}"
        for r in results
    )
    return f"""The leakage table's MIA cells sit at chance because its runs barely train. Here each
method trains `{s["model"]}` on Fashion-MNIST (IID) with few samples per client and
{s["local_epochs"]} local epochs (batch {s["batch"]}) for {s["rounds"]} rounds on {s["clients"]} clients x
{s["per_client"]} samples, one seed (0); BAFFLE at the same rounds, epochs and batches (epoch
mode, K = {s["k"]}, forward passes only, Adam 0.01; FedAvg/FedPT SGD 0.05, momentum 0.9). The
attacks run against the global model after the rounds shown — every method broadcasts it to the
next round's clients, so this is what an honest-but-curious holder of the broadcasts can
attack (`fedge attack RUN --attack mia-shadow --rounds {shown}`). Members: all {n} training
samples; non-members: {n} test samples; {s["shadows"]} shadow runs per method (same config,
another seed, on {n} of the attacker's test samples; the shadow's own round-r model for
round r); LiRA offline with one global variance. Precision at the threshold of best balanced
accuracy; chance is AUC 0.5, TPR@1%FPR 0.01, precision 0.5. With {n} non-members, TPR@1%FPR
is the TPR above the top {max(1, n // 100)} non-member score(s) (noisy), and an AUC at chance has a standard deviation of {chance_auc_std(n, n):.2f}.

After round {last}: {verdict}.

{chr(10).join(lines)}

Total {seconds / 60:.1f} min wall-clock on one thread of a shared machine (several other jobs running){f"; ran on {where}" if where else ""}.

Run (records under `benchmarks/results/mia_overfit/`, one per method):
`OMP_NUM_THREADS=1 nice -n 10 python benchmarks/mia_overfit.py --docs docs/benchmarks.md`;
render them: `python benchmarks/mia_overfit.py --table-only --docs docs/benchmarks.md`
"""


def measured(
    settings: dict[str, Any], records: Path, *, run: bool
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every row's figures (:func:`recorded_row`, in table order) and the labels of the rows
    neither recorded nor measured (``run=False``)."""
    results, awaiting = [], []
    for label, method in rows(settings).items():
        r = recorded_row(label, method, settings, records, run=run)
        if r is None:
            awaiting.append(label)
            continue
        results.append(r)
        last = r["rounds"][str(settings["rounds"])]
        print(
            f"{label}: {r['seconds']:.0f} s  acc {last['test_accuracy']:.2f}  AUC {_cell(last, 'auc')}",
            flush=True,
        )
    return results, awaiting


def section(records: Path = RECORDS, settings: dict[str, Any] | None = None) -> str:
    """The docs section from the records alone (``settings``: the default ones)."""
    s = dict(SETTINGS if settings is None else settings)
    results, awaiting = measured(s, records, run=False)
    if awaiting:
        raise FileNotFoundError(f"no records of {awaiting} in {records}")
    return render(results, s, sum(r["seconds"] for r in results), ran_on(records, results))


def main(argv: list[str] | None = None) -> int:
    ap = measurement_parser(__doc__, section="mia-overfit", example="rounds=4")
    ap.add_argument(
        "--records", default=str(RECORDS), help="where each row is recorded (commit them)"
    )
    ap.add_argument("--table-only", action="store_true", help="render the records, run nothing")
    args = ap.parse_args(argv)
    records = Path(args.records)
    if args.from_json:
        saved = load_measurement(args.from_json)
        text = render(saved["results"], saved["settings"], saved["seconds"])
    else:
        settings = measurement_settings(ap, args.set, SETTINGS)
        torch.set_num_threads(1)
        results, awaiting = measured(settings, records, run=not args.table_only)
        if awaiting:
            print(
                f"awaiting records of {awaiting}: run `OMP_NUM_THREADS=1 nice -n 10 python "
                "benchmarks/mia_overfit.py --docs docs/benchmarks.md`"
            )
            return 1
        seconds = sum(r["seconds"] for r in results)
        if args.json:
            save_measurement(
                args.json, {"settings": settings, "seconds": seconds, "results": results}
            )
        text = section(records, settings)
    if args.docs:
        update_section(
            args.docs,
            "mia-overfit",
            "Membership inference against models that fit (per round)",
            text,
            machine=None
            if args.from_json
            else records_line(records, root=Path(__file__).resolve().parents[1]),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
