"""Run one base config under several named sets of overrides (a table of a paper, an
ablation) and tabulate accuracy, bytes and client FLOPs side by side."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fedge.bench.docs import command_section, markdown_table
from fedge.bench.figures import read_run_logs
from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ConfigError
from fedge.experiment.run import DivergenceError, resolved_config, resume_experiment, run_experiment
from fedge.experiment.rundir import RunDir, RunDirBusyError

__all__ = [
    "paired_difference",
    "t_interval",
    "validation_score",
    "per_client_costs",
    "pick_by_validation",
    "recorded",
    "run_screened",
    "run_seeded_variants",
    "diverged_note",
    "not_run_cell",
    "screen_cell",
    "run_variants",
    "grid_step",
    "recorded_grown",
    "seeded_markdown",
    "seed_gaps",
    "side_row",
    "widened_grid",
    "variants_markdown",
]

T = TypeVar("T")


def run_variants(
    base: str,
    variants: dict[str, list[str]],
    *,
    out_root: str | Path,
    common: list[str] | None = None,
    run: bool = True,
    records: str | Path | None = None,
    record_divergence: bool = False,
) -> dict[str, Any]:
    """Run ``base`` with ``common + overrides`` for each variant into ``out_root/<label>``.

    A variant whose run directory is already complete is read, not rerun (or trained further
    when the variant now asks for more rounds); an interrupted one is resumed. So a long
    benchmark can be stopped, continued and lengthened. A directory holding a different
    config is an error. With ``run=False`` only the
    complete variants are tabulated (the rest are listed under ``"missing"``).

    ``records``: a folder (meant to be committed) where each finished variant's row is written as
    ``<label>.json`` together with its full resolved config. A variant with a record for the same
    config is read from it, even when its run directory is gone — so a reproduction that takes
    longer than one machine's lifetime continues where the last machine stopped. A record of a
    different config is an error, as a run directory of one is.

    ``record_divergence``: a variant whose training diverges (:class:`DivergenceError`) is a
    result, not a failure — its row holds ``diverged_round`` (and ``final_val_accuracy`` None)
    and is recorded like any other, so a learning-rate screen counts a step size too large as
    the worst of its grid (:func:`pick_by_validation`) and a table lists the seed as diverged
    (:func:`run_seeded_variants`) instead of the worker stopping. Without it the error propagates.
    """
    root = Path(out_root)
    results = []
    missing = []
    for label, overrides in variants.items():
        out = root / label.replace("/", "-")  # a label is one directory name
        wanted = load_config(base, overrides=[*(common or []), *overrides])
        record = Path(records) / f"{label.replace('/', '-')}.json" if records is not None else None
        if record is not None and record.exists():
            results.append(_read_record(record, wanted))
            continue
        if not run and not RunDir(out).is_complete():
            missing.append(label)
            continue
        try:
            if not RunDir(out).is_complete():
                if (out / "config.yaml").exists():
                    _check_same_run(out, wanted, allow_more_rounds=False)
                    resume_experiment(out, render=False)
                else:
                    run_experiment(wanted, out=out, render=False)
            elif _check_same_run(out, wanted, allow_more_rounds=True) < wanted.rounds:
                resume_experiment(out, rounds=wanted.rounds, render=False)  # train it further
        except DivergenceError as exc:
            if not record_divergence:
                raise
            results.append(_diverged_row(label, overrides, exc))
        else:
            summary, lines = read_run_logs(out)
            results.append(_row(label, overrides, out, summary, lines))
        if record is not None:
            record.parent.mkdir(parents=True, exist_ok=True)
            row = {k: v for k, v in results[-1].items() if k != "run_dir"}
            tmp = record.with_suffix(
                ".json.tmp"
            )  # written whole, then renamed: never a half record
            tmp.write_text(
                json.dumps(
                    {"config": resolved_config(wanted), "result": row}, indent=1, sort_keys=True
                )
                + "\n"
            )
            tmp.replace(record)
    return {
        "benchmark": "variants",
        "base": base,
        "common": common or [],
        "results": results,
        "missing": missing,
    }


def _diverged_row(label: str, overrides: list[str], exc: DivergenceError) -> dict[str, Any]:
    """The row of a variant whose training diverged: no accuracy, the round and the reason."""
    return {
        "label": label,
        "overrides": overrides,
        "run_dir": None,
        "diverged_round": exc.round,
        "diverged": str(exc).split("; likely cause")[0],
        "final_val_accuracy": None,
        "final_test_accuracy": None,
    }


def _row(
    label: str,
    overrides: list[str],
    out: Path,
    summary: dict[str, Any],
    lines: list[dict[str, Any]],
) -> dict[str, Any]:
    """The row of a finished variant, read from its run's summary and metrics."""
    return {
        "label": label,
        "overrides": overrides,
        "run_dir": str(out),
        "final_test_accuracy": summary["final_test_accuracy"],
        "test_accuracy_at_best_val": summary.get("test_accuracy_at_best_val"),
        "best_test_accuracy": summary["best_test_accuracy"],
        **per_client_costs(lines),
        "client_flops_per_round": summary["total_client_flops"] / summary["rounds"],
        "client_flops_effective_per_round": _mean_per_round(lines, "client_flops_effective"),
        "client_tensor_peak_bytes": _max_over_rounds(lines, "client_tensor_peak_bytes"),
        "wall_s": summary["wall_s"],
        # which machine ran which rounds (absent from runs made before it was recorded)
        **({"machines": summary["machines"]} if "machines" in summary else {}),
        "accuracy_by_round": [x["test_accuracy"] for x in lines],
        **(
            {
                "val_accuracy_by_round": [x.get("val_accuracy") for x in lines],
                "final_val_accuracy": lines[-1].get("val_accuracy"),
            }
            if "val_accuracy" in lines[-1]
            else {}
        ),
        **_side_figures(summary, lines),
    }


def _side_figures(summary: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"side": {name: figures}}`` for each model the run side-evaluated (``<name>_*`` in its
    summary and metrics; see :func:`side_row`), with the main model's keys; ``{}`` when none."""
    names = sorted(
        k.removesuffix("_final_test_accuracy")
        for k in summary
        if k.endswith("_final_test_accuracy")
    )
    side = {}
    for n in names:
        side[n] = {
            "final_test_accuracy": summary[f"{n}_final_test_accuracy"],
            "test_accuracy_at_best_val": summary.get(f"{n}_test_accuracy_at_best_val"),
            "best_test_accuracy": summary[f"{n}_best_test_accuracy"],
            "accuracy_by_round": [x.get(f"{n}_test_accuracy") for x in lines],
            **(
                {
                    "val_accuracy_by_round": [x.get(f"{n}_val_accuracy") for x in lines],
                    "final_val_accuracy": lines[-1].get(f"{n}_val_accuracy"),
                }
                if f"{n}_val_accuracy" in lines[-1]
                else {}
            ),
        }
    return {"side": side} if side else {}


# Config keys added after result records were first committed, each with the value that reproduces
# the behaviour from before it existed. A record that lacks one of them still matches a config
# holding exactly that value (any other value is a different run). Add a key here only when its
# default changes nothing; a new key whose default changes results must invalidate the records.
NEUTRAL_ADDITIONS: dict[tuple[str, ...], Any] = {
    ("method", "client_optimizer", "lr_decay"): 1.0,
    ("method", "prune_route"): "autograd",
    ("method", "client_optimizer", "state"): "fresh",
    ("method", "ema_also_raw"): False,
    # attached by the composer to every method with a global model / that can freeze
    ("method", "ema"): None,
    ("method", "ema_warmup"): True,
    ("method", "freeze"): [],
    ("clients", "dropout"): 0.0,
    ("clients", "min_replies"): None,
    ("clients", "reply_timeout"): None,
}


def _with_neutral_additions(have: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """``have`` with the :data:`NEUTRAL_ADDITIONS` it lacks filled in where ``want`` holds exactly
    their neutral value."""
    have = json.loads(json.dumps(have))
    for path, neutral in NEUTRAL_ADDITIONS.items():
        h: Any = have
        w: Any = want
        for part in path[:-1]:
            h, w = (
                h.get(part) if isinstance(h, dict) else None,
                w.get(part) if isinstance(w, dict) else None,
            )
        if (
            isinstance(h, dict)
            and isinstance(w, dict)
            and path[-1] not in h
            and w.get(path[-1]) == neutral
        ):
            h[path[-1]] = neutral
    return have


def _read_record(path: Path, wanted: RunConfig) -> dict[str, Any]:
    """The row stored in ``path``, after checking it was made by the config ``wanted``."""
    stored = json.loads(path.read_text())
    want = json.loads(json.dumps(resolved_config(wanted)))
    have = _with_neutral_additions(stored["config"], want)
    if have != want:
        diff = sorted(k for k in have.keys() | want.keys() if have.get(k) != want.get(k))
        raise ConfigError(
            f"result record {str(path)!r} was made by a different config than this variant asks for "
            f"(sections {diff}); delete the record to rerun the variant, or restore the variant's overrides"
        )
    return {**stored["result"], "run_dir": None}


def _check_same_run(out: Path, wanted: RunConfig, *, allow_more_rounds: bool) -> int:
    """The rounds of the run in ``out``, after checking that it is ``wanted`` (rounds aside when
    ``allow_more_rounds``; a run may be extended, never shortened). A variant whose overrides
    changed since its run directory was written is an error, not a silently stale row."""
    have = load_config(RunDir(out).read_config())
    a, b = resolved_config(have), resolved_config(wanted)
    if allow_more_rounds and have.rounds <= wanted.rounds:
        a["rounds"] = b["rounds"]
    if a != b:
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        raise ConfigError(
            f"run directory {str(out)!r} holds a different config than this variant asks for "
            f"(sections {diff}); move it away or choose another --out"
        )
    return have.rounds


def per_client_costs(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Bytes and client FLOPs **per client per round, averaged over all rounds** of a run's
    ``metrics.jsonl`` lines (each round's total divided by that round's clients).

    Pre-training phases are reported apart: a method that runs exchanges before training inside
    round 1 (NTK-Ori: its ``prune_rounds`` client-data pruning phases) logs more ``phases`` in
    round 1 than in round 2. Its training rounds move the same bytes every round (the sparse model
    down, K scalars or the kept delta up), so round 1's training part is taken to be the mean of
    rounds 2..T, and the rest of round 1 is ``pretraining_bytes_{up,down}_per_client`` (their total
    over all pruning phases, per client); the per-round means then cover training only. With one
    round of several phases the two cannot be told apart (``pretraining_bytes_*`` is None and the
    mean includes them).
    FLOPs are not split (a training round's FLOPs vary with the clients' data): the per-client
    FLOP mean includes the pruning phases' forwards.
    """
    first = lines[0].get("phases", 1)
    extra = first - lines[1].get("phases", 1) if len(lines) > 1 else 0
    rest = lines[1:]

    def per_client(key: str, line: dict[str, Any]) -> float:
        return line[key] / line["clients"]

    out: dict[str, Any] = {"pretraining_phases": extra if extra > 0 else 0}
    for key in ("bytes_up", "bytes_down"):
        values = [per_client(key, x) for x in lines]
        if extra > 0:
            training = sum(per_client(key, x) for x in rest) / len(rest)
            out[f"pretraining_{key}_per_client"] = values[0] - training
            values[0] = training
        else:
            out[f"pretraining_{key}_per_client"] = None if len(lines) == 1 and first > 1 else 0.0
        out[f"{key}_per_client_round"] = sum(values) / len(values)
    out["client_flops_per_client_round"] = sum(per_client("client_flops", x) for x in lines) / len(
        lines
    )
    eff = [
        x["client_flops_effective"] / x["clients"]
        for x in lines
        if x.get("client_flops_effective") is not None
    ]
    out["client_flops_effective_per_client_round"] = sum(eff) / len(lines) if eff else None
    return out


def _mean_per_round(lines: list[dict[str, Any]], key: str) -> float | None:
    """Sum of a per-round metric over the rounds that log it, divided by the rounds (None: never logged)."""
    values = [x[key] for x in lines if x.get(key) is not None]
    return sum(values) / len(lines) if values else None


def _max_over_rounds(lines: list[dict[str, Any]], key: str) -> int | None:
    values = [x[key] for x in lines if x.get(key) is not None]
    return max(values) if values else None


UP, DOWN = "up B/client/round (mean of all rounds)", "down B/client/round (mean of all rounds)"
PRUNING = "pruning phases B/client (up / down)"


def _flops_cell(r: dict[str, Any], key: str) -> str:
    """GFLOP per client per round (``key`` + ``_per_client_round``); a row recorded before that
    figure existed shows its sum over the round's clients, marked ``(sum)``."""
    per_client = r.get(f"{key}_per_client_round")
    if per_client is not None:
        return f"{per_client / 1e9:.2f}"
    summed = r.get(f"{key}_per_round")
    return "-" if summed is None else f"{summed / 1e9:.1f} (sum)"


def _pruning_cell(r: dict[str, Any]) -> str:
    if not r.get("pretraining_phases"):
        return "-"
    return (
        f"{r['pretraining_bytes_up_per_client']:.0f} / {r['pretraining_bytes_down_per_client']:.0f}"
    )


def variants_markdown(report: dict[str, Any], command: str, intro: str) -> str:
    """A markdown table of ``report``. Bytes and GFLOP are per client per round, averaged over
    all rounds (:func:`per_client_costs`); a column of NTK-Ori's pruning-phase bytes, and columns
    for effective FLOPs and client memory, appear when some variant logged them (``-`` where a
    variant did not)."""
    results = report["results"]
    effective = any(r.get("client_flops_effective_per_round") is not None for r in results)
    memory = any(r.get("client_tensor_peak_bytes") is not None for r in results)
    pruning = any(r.get("pretraining_phases") for r in results)
    flops = (
        "client GFLOP/client/round, executed (mean of all rounds)"
        if effective
        else "client GFLOP/client/round (mean of all rounds)"
    )
    head = (
        ["variant", "overrides", "final acc", "best acc", UP, DOWN] + [PRUNING] * pruning + [flops]
    )
    head += (
        ["effective GFLOP/client/round"] * effective
        + ["client peak MiB (tensors)"] * memory
        + ["wall s"]
    )
    rows = []
    for r in results:
        cells = [
            r["label"],
            f"`{' '.join(r['overrides']) or '-'}`",
            f"{r['final_test_accuracy']:.4f}",
            f"{r['best_test_accuracy']:.4f}",
            f"{r['bytes_up_per_client_round']:.0f}",
            f"{r['bytes_down_per_client_round']:.0f}",
        ]
        cells += [_pruning_cell(r)] * pruning + [_flops_cell(r, "client_flops")]
        if effective:
            cells.append(_flops_cell(r, "client_flops_effective"))
        if memory:
            peak = r.get("client_tensor_peak_bytes")
            cells.append("-" if peak is None else f"{peak / 2**20:.2f}")
        cells.append(f"{r['wall_s']:.0f}")
        rows.append(cells)
    common = " ".join(report["common"])
    base = f"Base: `{report['base']}`" + (f" with `{common}`" if common else "")
    return command_section(
        [intro], command, [base, "", *markdown_table(head, rows), *_missing_note(report)]
    )


def _missing_note(report: dict[str, Any]) -> list[str]:
    """The lines naming the variants not run yet (none when every one is)."""
    missing = report.get("missing") or []
    return ["", f"Not run yet (the command resumes them): {', '.join(missing)}"] if missing else []


def run_seeded_variants(
    base: str,
    variants: dict[str, list[str]],
    *,
    seeds: Sequence[int],
    out_root: str | Path,
    common: list[str] | None = None,
    run: bool = True,
    records: str | Path | None = None,
) -> dict[str, Any]:
    """:func:`run_variants` for every seed (``seed=S`` added to the overrides, one directory per
    variant and seed), aggregated per variant: mean ± sample std over the seeds of the final
    test accuracy, of the best test accuracy, and — when the base holds out a validation set —
    of the test accuracy at the round of best validation accuracy (the honest "best").

    A seed whose run diverged (a recorded :func:`_diverged_row`) is not averaged in: it is
    listed under the row's ``"diverged"`` (``[{"seed", "round"}]``; ``"runs"`` and ``"seeds"``
    count the finished seeds), and a variant whose every seed diverged is under the report's
    ``"diverged"`` ({label: [...]}) instead of its ``"results"``, so a table says so
    (:func:`not_run_cell`) rather than showing a mean of what was left."""
    if len(seeds) < 1:
        raise ConfigError("give at least one seed (a table a reviewer accepts has three or more)")
    per_seed = {
        s: run_variants(
            base,
            variants,
            out_root=Path(out_root) / f"seed-{s}",
            common=[*(common or []), f"seed={s}"],
            run=run,
            records=None if records is None else Path(records) / f"seed-{s}",
        )
        for s in seeds
    }
    results, missing = [], sorted({m for r in per_seed.values() for m in r["missing"]})
    diverged: dict[str, list[dict[str, Any]]] = {}
    for label, overrides in variants.items():
        every = [
            {**next(x for x in per_seed[s]["results"] if x["label"] == label), "seed": s}
            for s in seeds
            if any(x["label"] == label for x in per_seed[s]["results"])
        ]
        runs = [r for r in every if "diverged_round" not in r]
        gone = [
            {"seed": r["seed"], "round": r["diverged_round"]}
            for r in every
            if "diverged_round" in r
        ]
        if not runs:
            if gone:
                diverged[label] = gone
            continue
        results.append(_aggregate(label, overrides, runs, gone))
    return {
        "benchmark": "seeded-variants",
        "base": base,
        "common": common or [],
        "seeds": list(seeds),
        "results": results,
        "missing": missing,
        "diverged": diverged,
    }


def side_row(
    row: dict[str, Any], name: str, label: str, overrides: list[str]
) -> dict[str, Any] | None:
    """A :func:`run_seeded_variants` row for the model side-evaluated as ``name`` in ``row``'s
    runs (``Strategy.side_eval_models``; e.g. ``"raw"``, the raw global model of an EMA run):
    the same runs, so the same costs, seeds and divergences, with that model's accuracies,
    aggregated as any row. None when a run lacks them (made without the side evaluation)."""
    if any(name not in r.get("side", {}) for r in row["runs"]):
        return None
    runs = [{**r, **r["side"][name]} for r in row["runs"]]
    return _aggregate(label, overrides, runs, row.get("diverged", []))


def _aggregate(
    label: str, overrides: list[str], runs: list[dict[str, Any]], gone: list[dict[str, Any]]
) -> dict[str, Any]:
    """One variant's row over its finished seed ``runs`` (``gone``: the seeds that diverged)."""
    agg: dict[str, Any] = {
        "label": label,
        "overrides": overrides,
        "seeds": len(runs),
        "diverged": gone,
    }
    for key in ("final_test_accuracy", "best_test_accuracy", "test_accuracy_at_best_val"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            agg[key] = statistics.mean(vals)
            agg[key + "_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    for key in (
        "bytes_up_per_client_round",
        "bytes_down_per_client_round",
        "client_flops_per_round",
        "wall_s",
    ):
        agg[key] = statistics.mean(r[key] for r in runs)
    for key in (
        "client_flops_per_client_round",
        "client_flops_effective_per_client_round",
        "client_flops_effective_per_round",
        "pretraining_bytes_up_per_client",
        "pretraining_bytes_down_per_client",
    ):
        vals = [r.get(key) for r in runs]  # a record written before the key existed lacks it
        agg[key] = None if any(v is None for v in vals) else statistics.mean(vals)
    agg["pretraining_phases"] = max(r.get("pretraining_phases") or 0 for r in runs)
    agg["runs"] = runs
    return agg


def diverged_note(gone: Sequence[dict[str, Any]]) -> str:
    """``[{"seed": 2, "round": 40}]`` as a table says it: "seed 2 diverged (round 40)"."""
    return ", ".join(f"seed {d['seed']} diverged (round {d['round']})" for d in gone)


def not_run_cell(report: dict[str, Any], label: str) -> str:
    """The cell of a variant absent from a :func:`run_seeded_variants` report's results: every
    seed diverged (which seeds, which rounds), or it is not run yet."""
    gone = (report.get("diverged") or {}).get(label)
    return diverged_note(gone) if gone else "not run yet"


def seeded_markdown(report: dict[str, Any], command: str, intro: str) -> str:
    """Mean ± std over seeds per variant (the columns a reviewer asks for)."""
    has_val = any("test_accuracy_at_best_val" in r for r in report["results"])
    head = ["variant", "seeds", "final test acc", "best test acc"] + [
        "test acc at best val"
    ] * has_val
    pruning = any(r.get("pretraining_phases") for r in report["results"])
    head += (
        [UP] + [PRUNING] * pruning + ["client GFLOP/client/round (mean of all rounds)", "wall s"]
    )
    rows = []

    def ms(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:.4f} ± {r[key + '_std']:.4f}" if key in r else "-"

    for r in report["results"]:
        cells = [
            r["label"],
            str(r["seeds"]),
            ms(r, "final_test_accuracy"),
            ms(r, "best_test_accuracy"),
        ]
        cells += [ms(r, "test_accuracy_at_best_val")] * has_val
        cells += [
            f"{r['bytes_up_per_client_round']:.0f}",
            *[_pruning_cell(r)] * pruning,
            _flops_cell(r, "client_flops"),
            f"{r['wall_s']:.0f}",
        ]
        rows.append(cells)
    base = f"Base: `{report['base']}`, seeds {', '.join(map(str, report['seeds']))}; mean ± sample std."
    return command_section(
        [intro], command, [base, "", *markdown_table(head, rows), *_missing_note(report)]
    )


def validation_score(row: dict[str, Any], window: int = 1) -> float | None:
    """A screen run's score: its final **validation** accuracy, or with ``window`` > 1 the mean of
    its last ``window`` validation evaluations (a run whose accuracy still swings from one
    evaluation to the next — label skew, few local steps — is judged by where it sits, not by
    where its last evaluation happened to land); None for a diverged run or one without a
    validation set."""
    if "diverged_round" in row:
        return None
    if window <= 1:
        return row.get("final_val_accuracy")
    vals = [v for v in row.get("val_accuracy_by_round") or [] if v is not None][-window:]
    return statistics.mean(vals) if vals else None


def pick_by_validation(
    results: list[dict[str, Any]], labels: dict[float, str], *, window: int = 1
) -> float | None:
    """The value (a learning rate) whose run, ``labels[value]``, has the best
    :func:`validation_score` (final validation accuracy, or the mean of the last ``window``
    evaluations; ties: the smaller value); None while one of them is not recorded. A run that
    diverged (``diverged_round``) scores below every run that did not. The test set is never
    looked at."""
    rows = {r["label"]: r for r in results}
    if any(label not in rows for label in labels.values()):
        return None
    scored = []
    for value, label in labels.items():
        val = validation_score(rows[label], window)
        if "diverged_round" in rows[label]:
            val = -math.inf
        elif val is None:
            raise ConfigError(
                f"screen run {label!r} has no validation accuracy; give the protocol dataset.validation=N"
            )
        scored.append((val, -value, value))
    return max(scored)[2]


def screen_cell(row: dict[str, Any] | None, window: int = 1) -> str:
    """A screen table's cell: the run's :func:`validation_score`, "diverged (round N)", or
    "not run" (``row`` None)."""
    if row is None:
        return "not run"
    if "diverged_round" in row:
        return f"diverged (round {row['diverged_round']})"
    return f"{validation_score(row, window):.4f}"


def grid_step(x: float, *, up: bool) -> float:
    """The next learning rate past ``x`` on the 1-3-10 ladder (0.03 -> 0.1 up, 0.01 -> 0.003 down);
    off the ladder, a factor of sqrt(10)."""
    e = math.floor(math.log10(x) + 1e-9)
    m = round(x / 10**e, 6)
    nxt = {
        (1.0, True): 3 * 10**e,
        (3.0, True): 10 ** (e + 1),
        (1.0, False): 3 * 10 ** (e - 1),
        (3.0, False): 10**e,
    }.get((m, up), x * 10 ** (0.5 if up else -0.5))
    return float(f"{nxt:.3g}")


def widened_grid(
    grid: Sequence[float],
    label_of: Callable[[float], str],
    results: list[dict[str, Any]],
    *,
    steps: int = 2,
    window: int = 1,
) -> tuple[float, ...]:
    """``grid``, grown one :func:`grid_step` past an edge where the best **validation** run sits
    (:func:`pick_by_validation`), again while the new edge is best, at most ``steps`` times: a
    screen whose pick sits at the edge of its grid has not bracketed the optimum. A value added
    but not yet recorded is in the grid returned (the caller screens it; the pick waits for it).
    ``label_of(lr)``: the screen run's label; ``window``: as :func:`pick_by_validation`."""
    lrs = sorted(grid)
    for _ in range(steps):
        best = pick_by_validation(results, {lr: label_of(lr) for lr in lrs}, window=window)
        if best is None or (len(lrs) > 1 and lrs[0] < best < lrs[-1]):
            break
        if best == lrs[-1]:
            lrs.append(grid_step(best, up=True))
        else:
            lrs.insert(0, grid_step(best, up=False))
    return tuple(lrs)


# Two-sided 95% quantiles of Student's t by degrees of freedom (scipy.stats.t.ppf(0.975, df)).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t_interval(diffs: Sequence[float]) -> tuple[float, float]:
    """The 95% Student t interval of the mean of ``diffs`` (at least two values; normal
    quantile beyond 10). With 3 seeds the half-width is 4.303 · std / sqrt(3) ≈ 2.5 std."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {n}")
    mean, half = statistics.mean(diffs), T_975.get(n - 1, 1.96) * statistics.stdev(diffs) / n**0.5
    return mean - half, mean + half


def paired_difference(
    a: dict[str, Any], b: dict[str, Any], key: str = "final_test_accuracy"
) -> dict[str, Any] | None:
    """``a − b`` of two :func:`run_seeded_variants` rows over the seeds both have: the per-seed
    differences (the same seed draws the same data subset and initial model in both), their
    mean, sample std and 95% t interval of the mean (``lo``, ``hi``). None with fewer than two
    common seeds."""
    av = {r["seed"]: r[key] for r in a["runs"]}
    bv = {r["seed"]: r[key] for r in b["runs"]}
    common = sorted(av.keys() & bv.keys())
    if len(common) < 2:
        return None
    diffs = [av[s] - bv[s] for s in common]
    lo, hi = t_interval(diffs)
    return {
        "seeds": common,
        "diffs": diffs,
        "mean": statistics.mean(diffs),
        "std": statistics.stdev(diffs),
        "lo": lo,
        "hi": hi,
    }


def seed_gaps(d: dict[str, Any]) -> str:
    """A :func:`paired_difference`'s per-seed differences in points, ``"0: +0.7, 1: +0.5"``."""
    return ", ".join(f"{s}: {100 * x:+.1f}" for s, x in zip(d["seeds"], d["diffs"], strict=True))


def recorded(
    base: str, variants: dict[str, list[str]], *, common: list[str], records: str | Path
) -> dict[str, Any]:
    """:func:`run_variants` reading only ``records`` (nothing runs; the rest are ``"missing"``)."""
    return run_variants(
        base,
        variants,
        out_root=Path(records) / ".unused",
        common=common,
        run=False,
        records=records,
    )


Screen = dict[str, list[str]] | Callable[[list[dict[str, Any]]], dict[str, list[str]]]


def _grower(screen: Screen) -> Callable[[list[dict[str, Any]]], dict[str, list[str]]]:
    return screen if callable(screen) else (lambda _results: screen)


def recorded_grown(
    base: str, screen: Screen, *, common: list[str], records: str | Path
) -> dict[str, Any]:
    """:func:`recorded` of a screen that grows with its results (see :func:`run_screened`): the
    recorded runs of the screen as it stands, grown as far as its records take it."""
    grow = _grower(screen)
    current = grow([])
    while True:
        rep = recorded(base, current, common=common, records=records)
        bigger = grow(rep["results"])
        if bigger.keys() == current.keys():
            return rep
        current = bigger


def _work_share(
    items: Sequence[T],
    shard: int,
    shards: int,
    run_one: Callable[[T], None],
    *,
    steal: bool,
    own: bool = True,
) -> None:
    """Run worker ``shard``'s items (every ``shards``-th, with ``own``), then, with ``steal``, the
    others'; an item whose run another process is running now (RunDirBusyError) is left to it."""
    mine = [x for i, x in enumerate(items) if i % shards == shard]
    theirs = [x for i, x in enumerate(items) if i % shards != shard]
    for item in (mine if own else []) + (theirs if steal else []):
        try:
            run_one(item)
        except RunDirBusyError:
            continue


def main_tasks(
    variants: Sequence[str], seeds: Sequence[int], only: Sequence[tuple[str, int | None]] = ()
) -> list[tuple[str, int]]:
    """The main runs of a table, (label, seed), **seed-major**: every variant's first seed before
    any second seed, so a table that is stopped part-way has one seed of every row (a complete,
    if unreplicated, table) rather than three seeds of its first rows and nothing of the rest.
    ``only`` as in :func:`run_screened`."""
    return [
        (label, seed)
        for seed in seeds
        for label in variants
        if not only or any(label == o and s in (None, seed) for o, s in only)
    ]


def run_screened(
    base: str,
    screen: Screen,
    main: Callable[[dict[str, Any]], dict[str, list[str]] | None],
    *,
    screen_common: list[str],
    protocol: list[str],
    seeds: Sequence[int],
    records: str | Path,
    out: str | Path,
    shard: int = 0,
    shards: int = 1,
    probe_common: list[str] | None = None,
    poll_s: float = 30.0,
    only: Sequence[tuple[str, int | None]] = (),
    steal: bool = True,
) -> dict[str, list[str]]:
    """Run a paper table the way a reviewer accepts it, resumably and in parallel workers.

    1. The ``screen`` runs (``screen_common``; e.g. learning rates on a validation split). A
       callable ``screen(recorded results)`` grows the screen with what it has found (e.g.
       :func:`widened_grid`: one more learning rate past an edge that won); it is screened until
       it stops growing. A screen run that diverges is recorded as diverged (the worst of its
       grid), not an error; so is a main run (step 3), which the tables list as diverged.
    2. ``main(screen report)`` turns the recorded screen into the table's variants (None while a
       screen run is missing: a worker waits, polling every ``poll_s`` s, for the others).
    3. Every variant × seed with ``protocol + [seed=S]``, seed-major (:func:`main_tasks`); with
       ``probe_common``, each variant once more under it (e.g. one metered round) after its first seed
       (a probe that diverges is recorded as diverged too; :func:`fedge.bench.screened.recorded_probes`
       leaves it out).

    Worker ``shard`` of ``shards`` takes every ``shards``-th run of each list (start ``shards``
    processes with one torch thread each); with ``steal`` (the default) it then takes the other
    workers' runs that nobody is running now (:meth:`fedge.experiment.rundir.RunDir.busy`: not
    started, or left unfinished by a stopped worker), so no core idles while another has work,
    and a worker waiting for the screen screens meanwhile. Stealing sees only the runs under
    ``out``: workers on different machines pass ``steal=False`` (or split by ``only``).
    ``only``: (label, seed or None for every seed) pairs
    that restrict step 3 to those runs (before sharding), to send chosen runs to a machine; an
    unknown label is an error naming the table's labels. Finished runs are recorded under
    ``records`` (``screen/``, ``seed-S/``, ``probe/``) and read back instead of rerun, on any
    machine. Returns the main variants."""
    if not 0 <= shard < shards:
        raise ConfigError(
            f"shard {shard} of {shards}: expected 0 <= shard < shards, e.g. --shard 0/2"
        )
    root, out = Path(records), Path(out)

    grow = _grower(screen)
    current = grow([])

    def screen_one(label: str) -> None:
        run_variants(
            base,
            {label: current[label]},
            out_root=out / "screen",
            common=screen_common,
            records=root / "screen",
            record_divergence=True,
        )  # a step size that diverges loses the screen

    _work_share(list(current), shard, shards, screen_one, steal=steal)
    while True:
        rep = recorded(base, current, common=screen_common, records=root / "screen")
        if (
            bigger := grow(rep["results"])
        ).keys() != current.keys():  # the screen grew: screen the new runs
            current = bigger
            _work_share(list(current), shard, shards, screen_one, steal=steal)
            continue
        if (variants := main(rep)) is not None:
            break
        time.sleep(poll_s)  # another worker is still screening
        if steal:  # ... unless it stopped: then its screen runs are free to take
            _work_share(list(current), shard, shards, screen_one, steal=True, own=False)
    unknown = sorted({label for label, _ in only if label not in variants})
    if unknown:
        raise ConfigError(
            f"--only {unknown}: not a variant of this table; expected one of {list(variants)}"
        )
    tasks = main_tasks(list(variants), seeds, only)

    def main_one(task: tuple[str, int]) -> None:
        label, seed = task
        run_variants(
            base,
            {label: variants[label]},
            out_root=out / f"seed-{seed}",
            common=[*protocol, f"seed={seed}"],
            records=root / f"seed-{seed}",
            record_divergence=True,
        )  # a seed that diverges is a result
        if probe_common is not None and seed == seeds[0]:
            run_variants(
                base,
                {label: variants[label]},
                out_root=out / "probe",
                common=probe_common,
                records=root / "probe",
                record_divergence=True,
            )  # a probe that diverges is recorded; its table shows no figures

    _work_share(tasks, shard, shards, main_one, steal=steal)
    return variants
