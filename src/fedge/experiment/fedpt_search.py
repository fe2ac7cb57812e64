"""FedPT's search for a partially trainable network (seed 002, Sec. 3.1, principles 1–4), one
resumable run directory per trial. Design notes: docs/decisions.md#experiment-and-reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ConfigError
from fedge.core.rundir_schema import (
    BYTES_DOWN,
    BYTES_UP,
    CLIENTS,
    CONFIG,
    FINAL_TEST_ACCURACY,
    METRICS,
    SUMMARY,
    loads,
)
from fedge.experiment.build import build_run, resolved_config
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from fedge.experiment.rundir import RunDir
from fedge.methods import METHODS
from fedge.methods.fedpt import FedPTConfig
from fedge.models.blocks import model_blocks, resolve_freeze

__all__ = ["Trial", "fedpt_search"]


@dataclass
class Trial:
    """One short FedPT run: what it froze and what it got."""

    freeze: list[str]
    trainable_fraction: float
    accuracy: float
    bytes_down: float  # per client per round (the last round's)
    bytes_up: float
    accepted: bool | None  # None for the baseline
    run_dir: str


def _trial_config(cfg: RunConfig, freeze: list[str], rounds: int) -> RunConfig:
    raw = cfg.to_dict()
    method = dict(raw["method"])
    base = METHODS[method["name"]] if method.get("name") in METHODS else None
    if base is None or not issubclass(FedPTConfig, base.config):  # FedPT's config extends FedAvg's
        raise ConfigError(
            f"fedpt-search trains FedPT, which generalizes FedAvg; the config's method is {method.get('name')!r}; "
            "give a config with method.name fedavg or fedpt"
        )
    method.update(name=FedPTConfig.model_fields["name"].default, freeze=list(freeze))
    return load_config({**raw, "method": method, "rounds": rounds, "eval_every": rounds})


def _run(cfg: RunConfig, out: Path, freeze: list[str], accepted: bool | None) -> Trial:
    rundir = RunDir(out)
    if (out / CONFIG).exists():
        same = json.loads(json.dumps(rundir.read_config())) == json.loads(
            json.dumps(resolved_config(cfg))
        )
        if not same:
            raise ConfigError(
                f"{str(out)!r} holds a trial of a different configuration (another config or --budget-rounds); "
                "give the search a fresh --out directory"
            )
    if not rundir.is_complete():
        if (out / CONFIG).exists():
            resume_experiment(out, render=False)
        else:
            run_experiment(cfg, out=out, render=False)
    summary = loads((out / SUMMARY).read_text())
    last = loads((out / METRICS).read_text().splitlines()[-1])
    n = last[CLIENTS]
    return Trial(
        list(freeze),
        summary.get("trainable_fraction", 1.0),
        summary[FINAL_TEST_ACCURACY],
        last[BYTES_DOWN] / n,
        last[BYTES_UP] / n,
        accepted,
        str(out),
    )


def fedpt_search(
    cfg: RunConfig,
    *,
    budget_rounds: int,
    tolerance: float,
    out: str | Path,
    max_trials: int | None = None,
    progress: Callable[[Trial], None] | None = None,
) -> dict[str, Any]:
    """Run the search (module docstring) and return (and write to ``out/search.json``) its report.

    Args:
        cfg: a FedAvg or FedPT config (its ``method.freeze`` and ``rounds`` are replaced).
        budget_rounds: rounds per trial.
        tolerance: the accuracy drop (absolute, 0–1) a frozen block may cost.
        out: directory for the trials' run directories and ``search.json``.
        max_trials: stop after this many trials besides the baseline (None: every block).
        progress: called with each finished trial.
    """
    if budget_rounds < 1:
        raise ConfigError(
            f"--budget-rounds {budget_rounds}: expected a whole number of rounds >= 1"
        )
    if not 0 <= tolerance < 1:
        raise ConfigError(
            f"--tolerance {tolerance}: expected an accuracy drop in [0, 1), e.g. 0.02"
        )
    root = Path(out)
    base_cfg = _trial_config(cfg, [], budget_rounds)
    model = build_run(base_cfg).model_fn()
    ranked = sorted((b for b in model_blocks(model) if b.freezable), key=lambda b: -b.freezable)

    def report(t: Trial) -> Trial:
        if progress is not None:
            progress(t)
        return t

    baseline = report(_run(base_cfg, root / "trial-00-full", [], None))
    trials: list[Trial] = []
    accepted: list[str] = []
    for block in ranked:
        if max_trials is not None and len(trials) >= max_trials:
            break
        candidate = [*accepted, block.name]
        try:
            resolve_freeze(model, candidate)
        except ConfigError:  # it would freeze everything: nothing left to train
            continue
        label = f"trial-{len(trials) + 1:02d}-" + "+".join(candidate).replace("/", "-")
        t = _run(_trial_config(cfg, candidate, budget_rounds), root / label[:200], candidate, None)
        t.accepted = t.accuracy >= baseline.accuracy - tolerance
        trials.append(report(t))
        if t.accepted:
            accepted = candidate
    chosen = next((t for t in reversed(trials) if t.accepted), baseline)
    result = {
        "budget_rounds": budget_rounds,
        "tolerance": tolerance,
        "blocks": [b._asdict() for b in model_blocks(model)],
        "baseline": asdict(baseline),
        "trials": [asdict(t) for t in trials],
        "chosen": asdict(chosen),
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "search.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
