"""Run one base config under several named sets of overrides (a table of a paper, an
ablation) and tabulate accuracy, bytes and client FLOPs side by side."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedge.bench.figures import read_run_logs
from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ConfigError, DivergenceError
from fedge.core.rundir_schema import CONFIG, FINAL_TEST_ACCURACY
from fedge.experiment.build import resolved_config
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from fedge.experiment.rundir import RunDir

__all__ = [
    "NEUTRAL_ADDITIONS",
    "with_neutral_additions",
    "per_client_costs",
    "recorded",
    "run_seeded_variants",
    "run_variants",
    "side_row",
]


def run_variants(
    base: str | dict[str, Any],
    variants: dict[str, list[str]],
    *,
    out_root: str | Path,
    common: list[str] | None = None,
    run: bool = True,
    records: str | Path | None = None,
    record_divergence: bool = False,
) -> dict[str, Any]:
    """Run ``base`` (a preset name, a YAML path or a config mapping) with ``common + overrides``
    for each variant into ``out_root/<label>``.

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
    the worst of its grid (:func:`fedge.bench.screened.pick_by_validation`) and a table lists
    the seed as diverged (:func:`run_seeded_variants`) instead of the worker stopping. Without
    it the error propagates.
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
                if (out / CONFIG).exists():
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
        "final_test_accuracy": summary[FINAL_TEST_ACCURACY],
        "test_accuracy_at_best_val": summary.get("test_accuracy_at_best_val"),
        "best_test_accuracy": summary["best_test_accuracy"],
        **per_client_costs(lines),
        "client_flops_per_round": (
            None
            if summary.get("total_client_flops") is None
            else summary["total_client_flops"] / summary["rounds"]
        ),
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
    # BAFFLE's levers toward backprop (docs/methods/baffle.md), each off by default
    ("method", "prefix_once"): False,
    ("method", "train_mask"): None,
    ("method", "k_final"): None,
    ("method", "sigma_decay"): 1.0,
    ("method", "guided_rank"): 0,
    ("method", "guided_share"): 0.5,
    ("method", "sigma_scale"): "global",
    ("method", "local_heads"): [],
    ("method", "head_pool"): 1,
    ("method", "head_groups"): 1,
    ("method", "head_patches"): 1,
    # attached by the composer to every method with a global model / that can freeze
    ("method", "ema"): None,
    ("method", "ema_warmup"): True,
    ("method", "freeze"): [],
    ("clients", "dropout"): 0.0,
    ("clients", "min_replies"): None,
    ("clients", "reply_timeout"): None,
    ("clients", "deadline_s"): None,
    ("clients", "over_select"): 1.0,
    # every record made before the key drew with torch's and numpy's generators
    ("draws",): "torch",
    # every record made before the key ran on the CPU, uncompressed
    ("device",): "cpu",
    ("method", "compress"): None,
    # no client held out a local test split before these keys (fairness across devices)
    ("partition", "local_test"): None,
    ("local_eval_every",): None,
}


def with_neutral_additions(have: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """``have`` (a recorded resolved config) with the :data:`NEUTRAL_ADDITIONS` it lacks filled in
    where ``want`` holds exactly their neutral value: a record made before a key existed still
    matches a config that leaves the key at its neutral value."""
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
            and path[-1] in w
            and w[path[-1]] == neutral
        ):
            h[path[-1]] = neutral
    return have


def _read_record(path: Path, wanted: RunConfig) -> dict[str, Any]:
    """The row stored in ``path``, after checking it was made by the config ``wanted``."""
    stored = json.loads(path.read_text())
    want = json.loads(json.dumps(resolved_config(wanted)))
    have = with_neutral_additions(stored["config"], want)
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
    counted = all("client_flops" in x for x in lines)  # absent: not measured
    out["client_flops_per_client_round"] = (
        sum(per_client("client_flops", x) for x in lines) / len(lines) if counted else None
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
    (:func:`fedge.bench.tables.not_run_cell`) rather than showing a mean of what was left."""
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
        "wall_s",
    ):
        agg[key] = statistics.mean(r[key] for r in runs)
    for key in (
        "client_flops_per_round",  # None: not measured (measure.flops=false)
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
