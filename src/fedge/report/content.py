"""What a run's report says: title, key numbers, plots, per-round table, partition, config."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fedge.report.document import Block, Code, Heading, Image, Para, Table
from fedge.report.format import (
    DASH,
    format_accuracy,
    format_bytes,
    format_duration,
    format_flops,
    format_number,
)
from fedge.report.plots import CLIENT_HISTOGRAM
from fedge.report.runlog import RunLog

__all__ = ["document", "title"]

_DASH = DASH
_num = format_number
_FULL_TABLE_ROWS = 20  # longer tables show their first and last _EDGE_ROWS rows
_EDGE_ROWS = 5
_MAX_EXTRA_COLUMNS = 6  # method-specific metrics shown in the per-round table


def _elide(rows: list[tuple[str, ...]], width: int, what: str) -> list[tuple[str, ...]]:
    """Keep all rows of a short table; of a long one, the first and last few and a gap row."""
    if len(rows) <= _FULL_TABLE_ROWS:
        return rows
    hidden = len(rows) - 2 * _EDGE_ROWS
    gap = (f"… {hidden} more {what} …",) + ("",) * (width - 1)
    return rows[:_EDGE_ROWS] + [gap] + rows[-_EDGE_ROWS:]


def title(run: RunLog) -> str:
    return f"{run.method} on {run.dataset} with {run.model}"


def _key_numbers(run: RunLog) -> Table:
    planned = run.rounds_planned
    rounds = f"{run.rounds_done}" + (f" of {planned}" if planned is not None else "")
    best = format_accuracy(run.best_accuracy)
    if run.best_round is not None and run.best_accuracy is not None:
        best += f" (round {run.best_round})"
    rows: list[tuple[str, str]] = [
        ("status", run.status),
        ("final test accuracy", format_accuracy(run.final_accuracy)),
        ("best test accuracy", best),
        ("rounds", rounds),
        ("total bytes down", format_bytes(run.total_bytes_down, exact=True)),
        ("total bytes up", format_bytes(run.total_bytes_up, exact=True)),
        ("client FLOPs (total)", format_flops(run.total_client_flops, exact=True)),
        ("wall time", format_duration(run.wall_s)),
    ]
    if run.sim_time_s is not None:
        rows.append(("simulated time on the device fleet", format_duration(run.sim_time_s)))
    warm = (run.summary or {}).get("warm_start")
    if isinstance(warm, dict):  # the server's pretraining on its public split, apart from clients
        rows.append(("server warm start: public samples", _num(warm.get("public"))))
        rows.append(
            (
                "server warm start: FLOPs (not client FLOPs)",
                format_flops(warm.get("server_flops"), exact=True),
            )
        )
    if run.model_params is not None:
        rows.append(("model parameters", f"{run.model_params:,}"))
    if run.model_bytes is not None:
        rows.append(("model size", format_bytes(run.model_bytes, exact=True)))
    if run.peak_memory is not None:
        rows.append(("client peak memory", format_bytes(run.peak_memory, exact=True)))
    if run.seed is not None:
        rows.append(("seed", str(run.seed)))
    return Table(("quantity", "value"), tuple(rows))


def _stats(values: Sequence[float]) -> str:
    if not values:
        return _DASH
    return f"{_num(min(values))} / {_num(statistics.median(values))} / {_num(max(values))}"


def _label_tv(hists: Sequence[Sequence[int]], n_classes: int) -> list[float]:
    """Per-client total-variation distance between its label distribution and the pooled one.

    Heterogeneity in one number: 0 when every client is IID, 1 for disjoint label sets.
    """
    pooled = [sum(h[k] for h in hists if k < len(h)) for k in range(n_classes)]
    total = sum(pooled)
    out = []
    for h in hists:
        n = sum(h[:n_classes])
        if n and total:
            p = [(h[k] if k < len(h) else 0) / n for k in range(n_classes)]
            out.append(0.5 * sum(abs(p[k] - pooled[k] / total) for k in range(n_classes)))
    return out


def _partition_blocks(part: dict[str, Any] | None) -> list[Block]:
    """From ``partition.json`` as :func:`fedge.data.partition.partition_summary` writes it: per
    client ``client`` (id), ``num_samples`` and ``label_counts`` (samples per class)."""
    blocks: list[Block] = [Heading(2, "Partition")]
    if not part:
        return blocks + [Para("No partition.json in this run directory.")]
    clients = [c for c in part.get("clients", []) if isinstance(c, dict)]
    sizes = [int(c.get("num_samples", 0)) for c in clients]
    hists = [[int(v) for v in c.get("label_counts", [])] for c in clients]
    n_classes = part.get("num_classes") or max((len(h) for h in hists), default=0)

    present = [sum(1 for v in h if v > 0) for h in hists]
    top_share = [max(h) / sum(h) for h in hists if sum(h) > 0]
    tv = _label_tv(hists, n_classes)

    params = part.get("params") or {}
    params_txt = ", ".join(f"{k}={v}" for k, v in params.items()) if params else "none"
    mean_tv = statistics.fmean(tv) if tv else None
    rows = [
        ("partitioner", f"{part.get('name', '?')} ({params_txt})"),
        ("clients", _num(part.get("num_clients", len(clients)))),
        ("classes", _num(n_classes)),
        ("samples in total", _num(sum(sizes))),
        ("samples per client (min / median / max)", _stats(sizes)),
        ("classes present per client (min / median / max)", _stats(present)),
        ("largest-class share per client (min / median / max)", _stats(top_share)),
        ("mean label TV distance to pooled (0 = IID)", _num(mean_tv, 3)),
    ]
    blocks.append(Table(("quantity", "value"), tuple(rows)))

    def hist_text(h: list[int]) -> str:  # the classes a client holds, largest first, top 5
        top = sorted(((v, k) for k, v in enumerate(h) if v > 0), reverse=True)
        text = ", ".join(f"{k}:{v}" for v, k in top[:5])
        return text + (f", +{len(top) - 5} more" if len(top) > 5 else "")

    per_client: list[tuple[str, ...]] = [
        (str(c.get("client", i)), _num(sizes[i]), str(present[i]), hist_text(hists[i]))
        for i, c in enumerate(clients)
    ]
    header = ("client", "samples", "classes", "label histogram (class:count, largest first)")
    blocks.append(Table(header, tuple(_elide(per_client, len(header), "clients"))))
    return blocks


_ROUND_COLUMNS: tuple[tuple[str, str], ...] = (
    ("test_accuracy", "test acc"),
    ("test_top5", "top-5"),
    ("test_loss", "test loss"),
    ("train_loss", "train loss"),
    ("bytes_down", "bytes down"),
    ("bytes_up", "bytes up"),
    ("payload_bytes_down", "payload down"),  # under secure aggregation: the method's own
    ("payload_bytes_up", "payload up"),
    ("client_flops", "client FLOPs"),
    ("clients", "clients"),
    ("client_peak_bytes", "peak mem"),
    ("wall_s", "wall s"),
)
_NOT_EXTRA = {"round", "cum_bytes_down", "cum_bytes_up", "cum_client_flops"} | {
    k for k, _ in _ROUND_COLUMNS
}


_BYTES = {
    "bytes_down",
    "bytes_up",
    "payload_bytes_down",
    "payload_bytes_up",
    "secagg_bytes_down",
    "secagg_bytes_up",
    "client_peak_bytes",
}


def _cell(key: str, v: Any) -> str:
    if v is None:
        return _DASH
    if key in ("test_accuracy", "test_top5"):
        return format_accuracy(v)
    if key in _BYTES:
        return format_bytes(v)
    if key == "client_flops":
        return format_flops(v)
    if key == "wall_s":
        return f"{v:.2f}"
    return _num(v)


def _rounds_blocks(run: RunLog) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Rounds")]
    if not run.metrics:
        return blocks + [Para("No round has completed yet.")]
    logged = set(run.numeric_keys())
    cols = [(k, name) for k, name in _ROUND_COLUMNS if k in logged]
    extras = [k for k in run.numeric_keys() if k not in _NOT_EXTRA]
    cols += [(k, k) for k in extras[:_MAX_EXTRA_COLUMNS]]
    header = ("round",) + tuple(name for _, name in cols)
    rows = [
        (str(row["round"]),) + tuple(_cell(k, row.get(k)) for k, _ in cols) for row in run.metrics
    ]
    blocks.append(Table(header, tuple(_elide(rows, len(header), "rounds"))))
    if len(extras) > _MAX_EXTRA_COLUMNS:
        more = ", ".join(extras[_MAX_EXTRA_COLUMNS:])
        blocks.append(Para(f"Also logged (see metrics.jsonl): {more}."))
    return blocks


def _read_attack(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _mia_cell(r: dict[str, Any]) -> str:
    """AUC, then whichever of TPR at 1% / 0.1% FPR and precision the result holds."""
    parts = [f"AUC {r['auc']:.3f}"]
    for key, name in (
        ("tpr_at_1pct_fpr", "TPR@1%FPR"),
        ("tpr_at_01pct_fpr", "TPR@0.1%FPR"),
        ("precision", "precision"),
        ("best_precision", "best precision"),
    ):
        if isinstance(r.get(key), (int, float)):
            parts.append(f"{name} {r[key]:.3f}")
    return ", ".join(parts)


def _privacy_blocks(run: RunLog) -> list[Block]:
    """The "Privacy" table from ``attacks/*.json`` (written by ``fedge attack``), when present."""
    folder = Path(run.path) / "attacks"
    rows: list[tuple[str, ...]] = []
    for kind in ("dlg", "ig"):
        dlg = _read_attack(folder / f"{kind}.json")
        if dlg is None:
            continue
        base = (
            f"mean image {dlg.get('baseline_mean_image_mse', float('nan')):.3g}, "
            f"mid-gray {dlg.get('baseline_mid_gray_mse', float('nan')):.3g}"
        )
        seen = (
            "activations at the edge server"
            if "eppfl-inversion" in dlg.get("attacks", {})
            else "masked uploads"
            if dlg.get("masked")
            else "uploads in the clear"
        )
        for name, a in dlg.get("attacks", {}).items():
            labels = (
                f", labels {a['label_accuracy']:.2f}"
                if isinstance(a.get("label_accuracy"), (int, float))
                else ""
            )
            rows.append(
                (
                    f"reconstruction ({name}), {seen}",
                    f"median MSE {a['median_mse']:.3g}{labels}",
                    base,
                )
            )
    mia = _read_attack(folder / "mia.json")
    if mia is not None:
        rows.append(("membership (loss threshold)", _mia_cell(mia), "AUC 0.5"))
    shadow = _read_attack(folder / "mia-shadow.json")
    for key, name in (
        ("loss", "loss threshold"),
        ("shadow", "shadow models"),
        ("lira", "offline LiRA"),
    ):
        if shadow is not None and isinstance(shadow.get(key), dict):
            extra = f", {shadow.get('shadows')} shadows" if key != "loss" else ""
            rows.append((f"membership ({name}{extra})", _mia_cell(shadow[key]), "AUC 0.5"))
    for kind in (
        "mia-rounds",
        "mia-shadow-rounds",
    ):  # fedge attack --rounds: the broadcast after each round
        per = _read_attack(folder / f"{kind}.json")
        for rnd, r in ((per or {}).get("rounds") or {}).items():
            for key, name in (
                ("loss", "loss threshold"),
                ("shadow", "shadow models"),
                ("lira", "offline LiRA"),
            ):
                if isinstance(r.get(key), dict):
                    rows.append(
                        (
                            f"membership ({name}), global model after round {rnd}",
                            _mia_cell(r[key]),
                            "AUC 0.5",
                        )
                    )
    pia = _read_attack(folder / "pia.json")
    if pia is not None:
        seen = "masked uploads" if pia.get("masked") else "uploads in the clear"
        rows.append(
            (
                f"property (class {pia.get('property_class')} in the batch), {seen}",
                f"AUC {pia['auc']:.3f} on {pia.get('uploads')} uploads",
                "AUC 0.5",
            )
        )
    if not rows:
        return []
    return [
        Heading(2, "Privacy"),
        Table(("attack", "result", "chance-level baseline"), tuple(rows)),
    ]


_CAPTIONS = {
    "accuracy.png": "Test accuracy per round",
    "accuracy_vs_bytes.png": "Test accuracy vs cumulative bytes (down + up)",
    "loss.png": "Loss per round",
    "bytes.png": "Bytes per round",
    "accuracy_vs_flops.png": "Test accuracy vs cumulative client FLOPs",
    "accuracy_vs_time.png": "Test accuracy vs simulated time on the device fleet",
    CLIENT_HISTOGRAM: "Clients' accuracy on their local test splits (global model)",
}


def _fairness_blocks(run: RunLog, plots: Sequence[Path]) -> list[Block]:
    """The "Fairness across devices" section: q-FFL's statistics of the global model's
    accuracy on each client's local test split, and their histogram (runs with
    ``partition.local_test`` only)."""
    fair = run.fairness
    if fair is None:
        return []
    per = fair["client_accuracy"]
    evaluated = [a for a in per if a is not None]
    k = math.ceil(0.1 * len(evaluated))
    rows = (
        ("round evaluated", str(fair["round"])),
        ("clients evaluated", f"{len(evaluated)} of {len(per)}"),
        ("mean client accuracy", format_accuracy(fair["client_acc_mean"])),
        (f"worst 10% (mean of the lowest {k})", format_accuracy(fair["client_acc_worst10"])),
        (f"best 10% (mean of the highest {k})", format_accuracy(fair["client_acc_best10"])),
        ("variance of client accuracy", f"{fair['client_acc_var']:.4g}"),
    )
    blocks: list[Block] = [
        Heading(2, "Fairness across devices"),
        Para(
            "The global model evaluated on each client's local test split (partition.local_test); "
            "per-client accuracies are in metrics.jsonl (client_accuracy). The variance is of "
            "accuracies as fractions."
        ),
        Table(("quantity", "value"), rows),
    ]
    blocks += [Image(p, _CAPTIONS[p.name]) for p in plots if p.name == CLIENT_HISTOGRAM]
    return blocks


def _caveat_blocks(run: RunLog) -> list[Block]:
    """A warning paragraph for a run whose config turns a protection into one without a
    guarantee: EPPFL with ``method.dp.sensitivity: paper`` (its noise scale is computed from the
    activations it noises)."""
    method = run.config.get("method") or {}
    dp = method.get("dp") if isinstance(method, dict) else None
    if not isinstance(dp, dict) or dp.get("sensitivity") != "paper":  # only EPPFL has the key
        return []
    return [
        Para(
            f"**No DP guarantee: the scale depends on the data it protects.** This run's Laplace noise "
            f"(method.dp.sensitivity: paper, ε = {dp.get('epsilon')}) is scaled by each sample's own "
            "per-channel max activation / ε, as the EPPFL paper and its code do; the released activations "
            "are not differentially private and no cumulative ε is logged. Use the rigorous mechanism "
            "(method.dp.sensitivity: rigorous, with a clip) to protect data."
        )
    ]


def document(run: RunLog, plots: Sequence[Path]) -> list[Block]:
    blocks: list[Block] = [Heading(1, title(run))]
    blocks.append(Para(f"Run directory `{run.path}` — {run.status}."))
    blocks += _caveat_blocks(run)
    blocks += [Heading(2, "Key numbers"), _key_numbers(run)]
    blocks.append(Heading(2, "Plots"))
    curves = [p for p in plots if p.name != CLIENT_HISTOGRAM]  # that one goes under Fairness
    if curves:
        blocks += [Image(p, _CAPTIONS.get(p.name, p.stem)) for p in curves]
    else:
        blocks.append(Para("No plots yet (no round has been evaluated)."))
    blocks += _fairness_blocks(run, plots)
    blocks += _rounds_blocks(run)
    blocks += _privacy_blocks(run)
    blocks += _partition_blocks(run.partition)
    blocks.append(Heading(2, "Config"))
    if run.config:
        blocks.append(Code(yaml.safe_dump(run.config, sort_keys=False).rstrip(), "yaml"))
    else:
        blocks.append(Para("No config.yaml in this run directory."))
    return blocks
