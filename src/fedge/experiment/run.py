"""Run an experiment end to end: build, write the run directory round by round, resume.

This is what ``fedge run`` calls; tests and benchmarks call it too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ResumeError
from fedge.core.messages import Message
from fedge.methods.base import model_arrays
from fedge.experiment.build import BuiltRun, build_run, method_config, with_dataset_options
from fedge.runtime.engine import Simulation
from fedge.experiment.rundir import RunDir

__all__ = ["Progress", "resolved_config", "resume_experiment", "run_experiment"]

Progress = Callable[[dict[str, Any], int], None]  # (metrics line, total rounds)


def resolved_config(built: BuiltRun | RunConfig) -> dict[str, Any]:
    """The config with every default filled in (what ``config.yaml`` holds); from a built run, or
    from a config alone (validating its method section, without loading data)."""
    if isinstance(built, BuiltRun):
        cfg, method_cfg = built.config, built.method_config
    else:
        cfg, method_cfg = with_dataset_options(built), method_config(built)
    out = cfg.to_dict()
    out["method"] = method_cfg.model_dump(mode="json")
    return out


def _summary(built: BuiltRun, sim: Simulation, lines: list[dict[str, Any]]) -> dict[str, Any]:
    cfg, rec = built.config, sim.record
    model = sim.strategy.eval_model()
    out: dict[str, Any] = {
        "final_test_accuracy": rec.last_test_accuracy,
        "best_test_accuracy": rec.best_test_accuracy,
        **({"best_val_accuracy": rec.extra["best_val_accuracy"], "test_accuracy_at_best_val": rec.extra["test_at_best_val"],
            "best_val_round": rec.extra["best_val_round"]} if "best_val_accuracy" in rec.extra else {}),  # fmt: skip
        "total_bytes_down": rec.cum_bytes_down,
        "total_bytes_up": rec.cum_bytes_up,
        "total_client_flops": rec.cum_client_flops,
        "rounds": rec.round,
        "method": cfg.method.name,
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "seed": cfg.seed,
        "wall_s": sum(x.get("wall_s", 0.0) for x in lines),
        "model_params": sum(p.numel() for p in model.parameters()),
        "model_bytes": len(Message(model_arrays(model)).to_bytes()),
    }
    if "test_top5" in (lines[-1] if lines else {}):
        out["final_test_top5"] = lines[-1]["test_top5"]
    if lines and "trainable_fraction" in lines[-1]:  # FedPT: the strategy reports it each round
        out["trainable_fraction"] = lines[-1]["trainable_fraction"]
    if cfg.measure.memory:
        for key in ("client_peak_bytes", "client_tensor_peak_bytes"):
            vals = [x[key] for x in lines if x.get(key) is not None]
            out[key] = max(vals) if vals else None
    return out


def _drive(built: BuiltRun, rundir: RunDir, lines: list[dict[str, Any]], state: dict[str, Any] | None,
           progress: Progress | None, render: bool) -> Path:
    before = torch.get_num_threads()  # a notebook's own setting comes back after the run
    if built.config.threads is not None:
        torch.set_num_threads(built.config.threads)
    try:
        return _drive_rounds(built, rundir, lines, state, progress, render)
    finally:
        torch.set_num_threads(before)


def _drive_rounds(built: BuiltRun, rundir: RunDir, lines: list[dict[str, Any]], state: dict[str, Any] | None,
                  progress: Progress | None, render: bool) -> Path:
    def on_round(line: dict[str, Any], sim: Simulation) -> None:
        rundir.append_metrics(line)
        rundir.save_checkpoint(sim.state_dict())
        lines.append(line)
        if progress is not None:
            progress(line, built.config.rounds)

    sim = built.simulation(on_round)
    if state is not None:
        sim.load_state_dict(state)
    sim.run()
    rundir.finish(_summary(built, sim, lines), sim.strategy.eval_model())
    if render:
        try:
            from fedge.report import render_report

            render_report(rundir.path)
        except Exception as exc:  # a plotting problem must not lose a finished run
            warnings.warn(f"run finished but its report could not be rendered: {exc}", stacklevel=2)
    return rundir.path


def run_experiment(
    cfg: RunConfig, *, out: str | Path, progress: Progress | None = None, render: bool = True
) -> Path:
    """Build and run ``cfg``, writing the run directory ``out`` (which must not exist or be empty).

    Nothing is written until the config, data, model and method are all valid.
    """
    RunDir.check_new(out)
    built = build_run(cfg)
    rundir = RunDir(out)
    rundir.create(resolved_config(built), built.partition_summary)
    return _drive(built, rundir, [], None, progress, render)


def resume_experiment(
    run_dir: str | Path, *, rounds: int | None = None, progress: Progress | None = None, render: bool = True
) -> Path:
    """Continue an interrupted run from its last completed round, or extend a run to more rounds.

    The finished run's metrics equal those of an uninterrupted run with the same seed
    (wall times aside): every random draw derives from (seed, purpose, round, client).

    Args:
        rounds: a new, larger total number of rounds; a complete run is then reopened and
            continued from its last checkpoint. Nothing else of the config may change. The
            extended run equals a run configured with ``rounds`` from the start, except that
            the old last round was evaluated even if ``eval_every`` would have skipped it.
    """
    rundir = RunDir(run_dir)
    raw = rundir.read_config()
    if rounds is None and rundir.is_complete():
        raise ResumeError(
            f"run {str(rundir.path)!r} is already complete; nothing to resume "
            "(to train it further, give a larger total: --set rounds=N)"
        )
    if rounds is not None:
        old = int(raw.get("rounds", 0))
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds <= old:
            raise ResumeError(
                f"rounds={rounds!r} does not extend run {str(rundir.path)!r}, which has rounds={old}; "
                f"give a larger total (e.g. rounds={2 * old})"
            )
        raw = {**raw, "rounds": rounds}
    cfg = load_config(raw)
    built = build_run(cfg)
    if rounds is not None:
        if rundir.is_complete() and rundir.load_checkpoint() is None:
            raise ResumeError(f"run {str(rundir.path)!r} has no checkpoint.pt to continue from")
        rundir.reopen(raw)
    state = rundir.load_checkpoint()
    last = 0 if state is None else int(state["record"]["round"])
    lines = rundir.truncate_metrics(last)
    if len(lines) != last:
        raise ResumeError(
            f"run {str(rundir.path)!r}: checkpoint is at round {last} but metrics.jsonl has "
            f"{len(lines)} complete rounds; the directory was modified by hand"
        )
    return _drive(built, rundir, lines, state, progress, render)
