"""Resuming a run: :func:`resume_experiment` continues an interrupted run from its last
completed round, or extends a finished one to more rounds, to the metrics an uninterrupted run
would have written. It refuses, before the first write (a refused resume leaves every byte as it
was), a ``config.yaml`` edited since the run used it (naming the keys) unless
``allow_config_change``, which records the edit in ``config_changes.jsonl``; a complete run
with no more rounds asked; a rounds total that does not extend it; and a checkpoint, metrics
or record of the applied config that are missing or do not fit one another or the model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fedge.core.config import load_config
from fedge.core.errors import ConfigError, MessageError, ResumeError
from fedge.core.rundir_schema import APPLIED_CONFIG, CHECKPOINT, CLAIM, CONFIG
from fedge.experiment.build import rebuild_run, resolved_config
from fedge.experiment.drive import Renderer, drive
from fedge.experiment.progress import Progress, ProgressLike, as_progress
from fedge.experiment.run import check_dataset_root
from fedge.experiment.rundir import RunDir, config_diff
from fedge.runtime.round import RoundRecord
from fedge.runtime.spec import Runtime

__all__ = ["resume_experiment"]


def _changed_keys(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())


def _refuse_a_bare_claim(rundir: RunDir) -> None:
    """A directory holding only a claim (a run stopped, e.g. killed, before it wrote anything):
    one line saying so and the way out, rather than "not a run directory"."""
    if not rundir.path.is_dir() or [p.name for p in rundir.path.iterdir()] != [CLAIM]:
        return
    who = rundir.dead_claimant()
    if who is not None:
        raise ResumeError(
            f"{str(rundir.path)!r} holds only the claim of a run that stopped before it wrote anything ({who}): "
            f"there is nothing to resume; start the run again with --out {rundir.path} (it takes the claim over), "
            "or remove the directory"
        )
    raise ResumeError(
        f"{str(rundir.path)!r} holds only a run's claim (a run being set up now, or one that stopped before it "
        "wrote anything): there is nothing to resume; if no fedge process is setting it up, remove the directory "
        "and start the run again"
    )


#: what a checkpoint this fedge can continue holds (the record: its round counters)
_CHECKPOINT_KEYS = ("strategy", "client_states", "record")


def _check_checkpoint(rundir: RunDir, state: Any) -> None:
    """A checkpoint that lacks what this fedge's engine reads (one written by another version,
    or edited): one :class:`ResumeError` line naming what is missing and the way out."""
    path = str(rundir.path / CHECKPOINT)
    fields = {f.name for f in dataclasses.fields(RoundRecord)}
    problem = None
    if not isinstance(state, dict):
        problem = f"it holds a {type(state).__name__}, not a checkpoint"
    elif missing := [k for k in _CHECKPOINT_KEYS if k not in state]:
        problem = f"it lacks {', '.join(map(repr, missing))}"
    elif not isinstance(state["record"], dict) or not isinstance(state["record"].get("round"), int):
        problem = "its record has no round number"
    elif extra := sorted(set(state["record"]) - fields):
        problem = f"its record holds {', '.join(map(repr, extra))}, which this fedge does not know"
    if problem is not None:
        raise ResumeError(
            f"{path!r} cannot be continued by this fedge ({problem}; another fedge version wrote it, or it "
            "was edited): resume with the fedge that wrote it, or start the run anew into another --out or "
            f"after removing {str(rundir.path)!r} (nothing was changed)"
        )


def resume_experiment(
    run_dir: str | Path,
    *,
    rounds: int | None = None,
    progress: ProgressLike = None,
    render: Renderer = None,
    allow_config_change: bool = False,
    runtime: Runtime | str | Any = "engine",
    backend: str | None = None,
) -> Path:
    """Continue an interrupted run from its last completed round, or extend a run to more rounds.

    The finished run's metrics equal those of an uninterrupted run with the same seed
    (wall times aside): every random draw derives from (seed, purpose, round, client).

    Args:
        rounds: a new, larger total number of rounds; a complete run is then reopened and
            continued from its last checkpoint. Nothing else of the config may change. The
            extended run equals a run configured with ``rounds`` from the start, except that
            the old last round was evaluated even if ``eval_every`` would have skipped it.
            Raising ``rounds`` in ``config.yaml`` by hand does the same.
        runtime, backend: what runs the remaining rounds (as :func:`run_experiment`); any of
            them continues any run, to the same metrics.
        allow_config_change: accept other edits of ``config.yaml`` since the run used it; they
            apply from the next round and are recorded in ``config_changes.jsonl``. Without it
            such edits are refused, naming the changed keys.

    Every check runs before the first write: a refused resume changes nothing on disk. A run
    another process is driving now is refused (:class:`~fedge.experiment.rundir.RunDirBusyError`).
    """
    rt = Runtime.of(runtime, backend).ready()
    shown = as_progress(progress)
    rundir = RunDir(run_dir)
    rundir.hold(wait=True)  # another process driving it now: RunDirBusyError, nothing written
    try:
        return _resume(rundir, rounds, shown, render, allow_config_change, rt)
    finally:
        rundir.let_go()


def _resume(
    rundir: RunDir,
    rounds: int | None,
    progress: Progress,
    render: Renderer,
    allow_config_change: bool,
    runtime: Runtime,
) -> Path:
    """:func:`resume_experiment` once ``rundir`` is held."""
    _refuse_a_bare_claim(rundir)
    raw = rundir.read_config()
    applied = rundir.applied_config()
    changes: dict[str, tuple[Any, Any]] = {}
    lost_record = (
        applied is None and rundir.has_sessions()
    )  # written since runs keep sessions.jsonl: deleted
    if lost_record and not allow_config_change:
        raise ResumeError(
            f"{str(rundir.path / APPLIED_CONFIG)!r}, the record of the config this run used, is missing, so "
            "edits of config.yaml cannot be checked; restore it, or resume with --allow-config-change to take "
            "config.yaml as it is (nothing was changed)"
        )
    if applied is not None:
        changes = config_diff(applied, raw)
        grown = changes.pop("rounds", None)
        if grown is not None:
            old_r, new_r = grown
            if isinstance(new_r, int) and isinstance(old_r, int) and new_r > old_r:
                rounds = max(rounds or 0, new_r)
                raw = {**raw, "rounds": old_r}
            else:
                changes["rounds"] = grown
        if changes and not allow_config_change:
            raise ResumeError(
                f"{str(rundir.path / CONFIG)!r} was edited since the run used it ({_changed_keys(changes)}); "
                "resuming would mix two configs in one run: restore those values (only rounds may grow), or "
                "resume with --allow-config-change to record the change in config_changes.jsonl"
            )
    if rounds is None and rundir.is_complete():
        raise ResumeError(
            f"run {str(rundir.path)!r} is already complete; nothing to resume "
            "(to train it further, give a larger total: --set rounds=N)"
        )
    if rounds is not None:
        old = int(raw.get("rounds", 0))
        if isinstance(rounds, bool) or not isinstance(rounds, int):
            raise ConfigError(
                f"rounds={rounds!r} ({type(rounds).__name__}): expected a whole number of rounds (an int)"
            )
        if rounds <= old:
            raise ResumeError(
                f"rounds={rounds!r} does not extend run {str(rundir.path)!r}, which has rounds={old}; "
                f"give a larger total (e.g. rounds={2 * old})"
            )
        raw = {**raw, "rounds": rounds}
    try:
        cfg = load_config(raw)
    except ConfigError as exc:  # e.g. a key an older fedge wrote that this one does not know
        raise ResumeError(
            f"run {str(rundir.path)!r}: its {CONFIG} does not validate with this fedge ({exc}); edit "
            f"{str(rundir.path / CONFIG)!r} to fix it and resume again (with --allow-config-change if it says the "
            "config was edited), or start the run anew into another --out (nothing was changed)"
        ) from None
    check_dataset_root(cfg)
    built = rebuild_run(cfg)
    state = rundir.load_checkpoint()
    if state is not None:
        _check_checkpoint(rundir, state)
    if rounds is not None and rundir.is_complete() and state is None:
        raise ResumeError(f"run {str(rundir.path)!r} has no checkpoint.pt to continue from")
    last = 0 if state is None else int(state["record"]["round"])
    if cfg.rounds < last:  # only --allow-config-change lets rounds shrink this far
        raise ResumeError(
            f"run {str(rundir.path)!r} has run {last} rounds, but its config.yaml now says rounds={cfg.rounds}; "
            f"rounds cannot go below the rounds already run: set rounds to {last} or more (nothing was changed)"
        )
    if (
        state is None and len(recorded := rundir.read_metrics(2**31)) > 1
    ):  # a kill before round 1's checkpoint leaves one line
        raise ResumeError(
            f"run {str(rundir.path)!r} has no checkpoint.pt, but metrics.jsonl records {len(recorded)} rounds: the "
            "state after them is gone, so the run cannot continue where it stopped; restore checkpoint.pt, or "
            "start the run anew into another --out (nothing was changed)"
        )
    lines = rundir.read_metrics(last)
    if len(lines) != last:
        raise ResumeError(
            f"run {str(rundir.path)!r}: checkpoint is at round {last} but metrics.jsonl has "
            f"{len(lines)} complete rounds; the directory was modified by hand"
        )
    if state is not None:
        built.method.strategy.check_resume(state["strategy"], cfg.rounds)
        try:  # the same load the rounds start with: a checkpoint that no longer fits fails here, before any write
            built.method.strategy.load_state_dict(state["strategy"])
        except (MessageError, ValueError, KeyError, RuntimeError) as exc:
            raise ResumeError(
                f"run {str(rundir.path)!r}: its checkpoint does not fit the model built from its config now ({exc}); "
                "did a registered dataset or model change since the run? Restore it as it was, or start the run "
                "anew into another --out (nothing was changed)"
            ) from None
    # -- every check passed: from here on the directory is written
    resolved = resolved_config(built)
    if changes:
        rundir.record_config_change(last, changes, resolved)
    elif lost_record:
        rundir.record_config_change(
            last,
            {},
            resolved,
            note=f"{APPLIED_CONFIG} was missing: any edits of {CONFIG} "
            f"before this resume are unknown; {CONFIG} taken as it was",
        )
    if rounds is not None or changes:
        rundir.reopen(resolved)
    rundir.write_metrics(lines)
    return drive(built, rundir, lines, state, progress, render, runtime)
