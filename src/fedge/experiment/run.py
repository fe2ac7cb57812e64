"""Run an experiment end to end: build, write the run directory round by round, resume.

This is what ``fedge run`` calls; tests and benchmarks call it too.

What a user can get wrong ends in one :class:`~fedge.core.errors.FedgeError` naming the value
and the fix, and never in a directory that looks complete:

- bad config values (non-finite numbers included) fail before anything is written;
- the output directory is claimed atomically (:meth:`RunDir.claim`), so of two runs started
  with one ``--out`` exactly one writes it;
- a full disk or read-only directory is a :class:`~fedge.experiment.rundir.StorageError`;
  temporary files are removed and the run resumes from its last checkpoint;
- a diverging run (non-finite values, or a loss above 100·ln(classes)) stops with
  :class:`DivergenceError` naming the round and the config keys to lower (``on_divergence``);
- ``--resume`` refuses a ``config.yaml`` edited since the run used it (naming the keys),
  unless ``allow_config_change``, which records the edit in ``config_changes.jsonl``; every
  check happens before the first write, so a refused resume leaves every byte as it was.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from pydantic_core import PydanticSerializationError

from fedge.core.config import RunConfig, check_finite, load_config
from fedge.core.errors import ConfigError, DataNotFoundError, FedgeError, MessageError, ResumeError
from fedge.core.messages import Message
from fedge.data import get_dataset_spec
from fedge.experiment.build import (
    BuiltRun,
    build_run,
    method_config,
    privacy_config,
    rebuild_run,
    with_dataset_options,
)
from fedge.experiment.provenance import machine, segments
from fedge.experiment.rundir import RunDir, config_diff
from fedge.methods import get_method
from fedge.methods.base import model_arrays
from fedge.privacy.secagg.errors import FixedPointRangeError
from fedge.runtime.engine import Simulation
from fedge.runtime.spec import Runtime

__all__ = [
    "DivergenceError",
    "DivergenceWarning",
    "Progress",
    "resolved_config",
    "resume_experiment",
    "run_experiment",
]


class DivergenceError(FedgeError, RuntimeError):
    """Training diverged (non-finite values or an exploding loss); the message names the round
    and the config keys that exist for this method to tame it. ``round``: the round that
    diverged (None where unknown)."""

    def __init__(self, message: str, *, round: int | None = None) -> None:  # noqa: A002 - the config's word
        super().__init__(message)
        self.round = round


class DivergenceWarning(UserWarning):
    """A round diverged and ``on_divergence: continue`` let the run go on."""


class Progress:
    """What a run reports while it goes; override the parts you show (all default to nothing).

    A plain function ``f(metrics_line, total_rounds)`` is accepted wherever a Progress is and
    is called after every round."""

    def start(self, total_rounds: int, done: int) -> None:
        """Before the first round runs (``done`` rounds already in the directory on resume)."""

    def clients(self, rnd: int, exchange: int, done: int, total: int) -> None:
        """Inside a round: ``done`` of the ``total`` clients of this exchange have replied."""

    def round(self, line: dict[str, Any], total_rounds: int) -> None:
        """After round ``line["round"]`` completed and was written."""


class _FunctionProgress(Progress):
    def __init__(self, fn: Callable[[dict[str, Any], int], None]) -> None:
        self.fn = fn

    def round(self, line: dict[str, Any], total_rounds: int) -> None:
        self.fn(line, total_rounds)


ProgressLike = Progress | Callable[[dict[str, Any], int], None] | None
#: Renders a finished run directory (the CLI passes ``fedge.report.render_report``: the report
#: layer sits above this one, so it is handed in, never imported); None or False: don't.
Renderer = Callable[[Path], Any] | bool | None


def _as_progress(p: ProgressLike) -> Progress:
    """``p`` as a Progress; anything neither a Progress, a function nor None is refused up front."""
    if p is None:
        return Progress()
    if isinstance(p, Progress):
        return p
    if not callable(p):
        raise ConfigError(
            f"progress={p!r} ({type(p).__name__}) is neither a fedge Progress nor a function "
            "f(metrics_line, total_rounds); pass one of those, or None to show nothing"
        )
    try:
        inspect.signature(p).bind(None, None)
    except TypeError:
        raise ConfigError(
            f"progress={p!r} cannot be called as f(metrics_line, total_rounds); give it those two parameters"
        ) from None
    except ValueError:  # no signature to read (a builtin): it will tell when called
        pass
    return _FunctionProgress(p)


def resolved_config(built: BuiltRun | RunConfig) -> dict[str, Any]:
    """The config with every default filled in (what ``config.yaml`` holds); from a built run, or
    from a config alone (validating its method section, without loading data)."""
    if isinstance(built, BuiltRun):
        cfg, method_cfg = built.config, built.method_config
    else:
        cfg, method_cfg = with_dataset_options(built), method_config(built)
    try:
        out = cfg.to_dict()
        out["method"] = method_cfg.model_dump(mode="json")
        out["privacy"] = privacy_config(cfg).model_dump(mode="json")
    except (
        PydanticSerializationError
    ) as exc:  # e.g. a registered function's default of a numpy type
        raise ConfigError(
            f"the run's config cannot be written to config.yaml ({exc}); give plain values (int, "
            "float, str, bool, lists and mappings of them), e.g. float(x) for a numpy number"
        ) from None
    return out


def _summary(built: BuiltRun, sim: Simulation, lines: list[dict[str, Any]]) -> dict[str, Any]:
    cfg, rec = built.config, sim.record
    model = sim.strategy.eval_model()
    out: dict[str, Any] = {
        "final_test_accuracy": rec.last_test_accuracy,
        "best_test_accuracy": rec.best_test_accuracy,
        **(
            {
                "best_val_accuracy": rec.extra["best_val_accuracy"],
                "test_accuracy_at_best_val": rec.extra["test_at_best_val"],
                "best_val_round": rec.extra["best_val_round"],
            }
            if "best_val_accuracy" in rec.extra
            else {}
        ),
        **({"stopped": rec.extra["stopped"]} if "stopped" in rec.extra else {}),
        **(
            {"skipped_rounds": rec.extra["skipped_rounds"]} if "skipped_rounds" in rec.extra else {}
        ),
        # client id -> the first round that aggregated it: whose samples the model trained on
        **(
            {"first_aggregated": rec.extra["first_aggregated"]}
            if "first_aggregated" in rec.extra
            else {}
        ),
        **(
            {"epsilon": lines[-1]["epsilon"], "delta": cfg.privacy.model_dump().get("delta", 1e-6)}
            if lines and "epsilon" in lines[-1]
            else {}
        ),
        "total_bytes_down": rec.cum_bytes_down,
        "total_bytes_up": rec.cum_bytes_up,
        "total_client_flops": rec.cum_client_flops,
        "rounds": rec.round,
        "method": cfg.method.name,
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "dataset_source": built.dataset.source,
        "seed": cfg.seed,
        "wall_s": sum(x.get("wall_s", 0.0) for x in lines),
        "model_params": sum(p.numel() for p in model.parameters()),
        "model_bytes": len(Message(model_arrays(model)).to_bytes()),
    }
    for name in sim.strategy.side_eval_models():  # e.g. "raw": the EMA wrapper's raw global model
        out.update(_side_summary(name, rec.extra, lines))
    if "test_top5" in (lines[-1] if lines else {}):
        out["final_test_top5"] = lines[-1]["test_top5"]
    for key in get_method(cfg.method.name).summary_keys:  # what the method reports each round
        if lines and key in lines[-1]:
            out[key] = lines[-1][key]
    if cfg.measure.memory:
        for key in ("client_peak_bytes", "client_tensor_peak_bytes"):
            vals = [x[key] for x in lines if x.get(key) is not None]
            out[key] = max(vals) if vals else None
    return out


def _side_summary(name: str, extra: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, Any]:
    """A side-evaluated model's summary figures (``<name>_final_test_accuracy``, ...), named as
    the main model's with the prefix."""
    accs = [x[f"{name}_test_accuracy"] for x in lines if x.get(f"{name}_test_accuracy") is not None]
    out: dict[str, Any] = {
        f"{name}_final_test_accuracy": lines[-1].get(f"{name}_test_accuracy") if lines else None,
        f"{name}_best_test_accuracy": max(accs) if accs else None,
    }
    if f"{name}_best_val_accuracy" in extra:
        out.update(
            {
                f"{name}_best_val_accuracy": extra[f"{name}_best_val_accuracy"],
                f"{name}_test_accuracy_at_best_val": extra[f"{name}_test_at_best_val"],
                f"{name}_best_val_round": extra[f"{name}_best_val_round"],
            }
        )
    return out


# ---- divergence -------------------------------------------------------------------------------


def _advice(built: BuiltRun) -> str:
    """The keys that exist for this method and would tame a diverging run, with their values."""
    m = resolved_config(built)["method"]
    keys = []
    if isinstance(m.get("client_optimizer"), dict) and m.get("mode") != "batch":
        keys.append(f"method.client_optimizer.lr (now {m['client_optimizer'].get('lr')})")
    if isinstance(m.get("server_optimizer"), dict):
        keys.append(f"method.server_optimizer.lr (now {m['server_optimizer'].get('lr')})")
    advice = "lower " + " or ".join(keys) if keys else "lower the learning rate"
    for more in get_method(built.config.method.name).advice(built.method_config):
        advice += f", or {more}"
    return advice


def _loss_limit(built: BuiltRun) -> float:
    return 100.0 * math.log(max(2, built.dataset.num_classes))


def _diverged(line: dict[str, Any], limit: float) -> tuple[str, float] | None:
    for key in ("test_loss", "train_loss"):
        v = line.get(key)
        if (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and (not math.isfinite(v) or v > limit)
        ):
            return key, float(v)
    return None


def _divergence_message(
    built: BuiltRun, rnd: int, what: str, rundir: RunDir, kept: int, *, hard: bool = False
) -> str:
    go_on = "" if hard else " (or set on_divergence: continue to go on regardless)"
    return (
        f"training diverged in round {rnd}: {what}; likely cause: a step size too large for this model: "
        f"{_advice(built)}. The run directory {str(rundir.path)!r} keeps {'no round' if not kept else 'round 1' if kept == 1 else f'rounds 1-{kept}'} "
        "and is not complete: start a new run, or edit its config.yaml and continue with "
        f"fedge run --resume {rundir.path} --allow-config-change{go_on}"
    )


# ---- warnings: the first of a kind is shown, its repeats are counted ---------------------------


@contextmanager
def _collapsed_warnings(current_round: Callable[[], int]) -> Iterator[None]:
    seen: dict[tuple[Any, str, int], list[Any]] = {}
    shown = warnings.showwarning

    def show(
        message: Any,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: Any = None,
    ) -> None:
        key = (category, filename, lineno)
        rnd = current_round()
        entry = seen.get(key)
        if entry is None:
            seen[key] = [0, rnd, rnd]
            shown(message, category, filename, lineno, file, line)
        else:
            entry[0] += 1
            entry[2] = rnd

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
        for (category, filename, lineno), (more, first, last) in seen.items():
            if more:
                rounds = f"round {first}" if first == last else f"rounds {first}–{last}"
                shown(
                    f"{more} more {category.__name__}s like the one above ({rounds}); shown once",
                    category,
                    filename,
                    lineno,
                )


# ---- driving rounds -----------------------------------------------------------------------------


def _drive(
    built: BuiltRun,
    rundir: RunDir,
    lines: list[dict[str, Any]],
    state: dict[str, Any] | None,
    progress: Progress,
    render: Renderer,
    runtime: Runtime,
) -> Path:
    before = torch.get_num_threads()  # a notebook's own setting comes back after the run
    if built.config.threads is not None:
        torch.set_num_threads(built.config.threads)
    try:
        return _drive_rounds(built, rundir, lines, state, progress, render, runtime)
    except BaseException:
        for tmp in rundir.temp_files():  # half-written checkpoint/model/metrics from this process
            tmp.unlink(missing_ok=True)
        raise
    finally:
        torch.set_num_threads(before)


def _drive_rounds(
    built: BuiltRun,
    rundir: RunDir,
    lines: list[dict[str, Any]],
    state: dict[str, Any] | None,
    progress: Progress,
    render: Renderer,
    runtime: Runtime,
) -> Path:
    cfg = built.config
    limit = _loss_limit(built)

    writing: list[
        int
    ] = []  # the round being written while on_round runs (its warnings belong to it)

    def on_round(line: dict[str, Any], sim: Simulation) -> None:
        writing[:] = [line["round"]]
        bad = _diverged(line, limit)
        if bad is not None:
            key, value = bad
            line["diverged"] = True
        rundir.append_metrics(line)
        rundir.save_checkpoint(sim.state_dict())
        lines.append(line)
        progress.round(line, cfg.rounds)
        if bad is not None:
            what = f"{key}={value:.4g} (limit 100·ln({built.dataset.num_classes}) = {limit:.4g})"
            if cfg.on_divergence == "stop":
                raise DivergenceError(
                    _divergence_message(built, line["round"], what, rundir, line["round"]),
                    round=line["round"],
                )
            warnings.warn(
                f"training diverged in round {line['round']}: {what}; {_advice(built)}",
                DivergenceWarning,
                stacklevel=2,
            )
        writing.clear()

    sim = built.simulation(on_round, runtime=runtime)
    sim.on_progress = progress.clients
    if state is not None:
        sim.load_state_dict(state)
    progress.start(cfg.rounds, len(lines))
    rundir.record_session(len(lines) + 1, machine())
    with _collapsed_warnings(lambda: writing[0] if writing else sim.record.round + 1):
        try:
            sim.run()
        except (MessageError, FixedPointRangeError) as exc:
            text = str(exc)
            blown = (
                isinstance(exc, FixedPointRangeError) and "exceeds the fixed-point range" in text
            )
            if (
                not blown
                and "non-finite" not in text
                and " is nan" not in text
                and " is inf" not in text
            ):
                raise
            who, _, what = text.split(";")[0].rpartition(": ")
            rnd = sim.record.round + 1
            what = f"{what} ({who})" if who else what
            raise DivergenceError(
                _divergence_message(built, rnd, what, rundir, rnd - 1, hard=True), round=rnd
            ) from None
    summary = _summary(built, sim, lines)
    summary["machines"] = segments(rundir.read_sessions(), sim.record.round)
    if runtime.name != "engine":
        summary["runtime"] = runtime.name
    if runtime.name == "flower-sim":
        summary["flower_backend"] = runtime.backend
    rundir.finish(summary, sim.strategy.eval_model())
    if callable(render):  # the caller's renderer (the report layer sits above this one)
        try:
            render(rundir.path)
        except Exception as exc:  # a plotting problem must not lose a finished run
            warnings.warn(f"run finished but its report could not be rendered: {exc}", stacklevel=2)
    return rundir.path


# ---- dataset.root -------------------------------------------------------------------------------


def check_dataset_root(cfg: RunConfig) -> None:
    """An explicit ``dataset.root`` must hold the dataset's files: fedge's other search places
    (``$FEDGE_DATA``, the cache, ``/usr/share/datasets``) do not stand in for it silently."""
    root = cfg.dataset.root
    if root is None:
        return
    spec = get_dataset_spec(cfg.dataset.name)
    found = spec.locate(root=root)
    if found is None:
        return  # loading raises DataNotFoundError listing every place searched
    where, mine = Path(found).expanduser(), Path(root).expanduser()
    if not where.is_dir():
        raise ConfigError(
            f"dataset.root={root!r} is set, but dataset {cfg.dataset.name!r} reads no files (it comes from "
            f"{found}); remove dataset.root"
        )
    if where.resolve().is_relative_to(mine.resolve()):
        return
    if not mine.is_dir():
        state = "no such directory"
    else:
        state = "missing: " + ", ".join(
            sorted(p.name for p in where.iterdir() if p.is_file() and not (mine / p.name).exists())
        )
    raise DataNotFoundError(
        f"dataset.root={root!r} does not hold the {cfg.dataset.name!r} files ({state}; names as found in {found}); "
        f"put them there, or remove dataset.root to read the copy in {found}"
    )


# ---- entry points -------------------------------------------------------------------------------


def run_experiment(
    cfg: RunConfig,
    *,
    out: str | Path,
    progress: ProgressLike = None,
    render: Renderer = None,
    runtime: Runtime | str | Any = "engine",
    backend: str | None = None,
) -> Path:
    """Build and run ``cfg``, writing the run directory ``out`` (which must not exist or be empty).

    ``runtime`` (a :class:`~fedge.runtime.spec.Runtime`, or what ``Runtime.of`` reads):
    ``"engine"`` (the built-in engine), ``"flower-sim"`` (the same rounds through
    Flower's ServerApp/ClientApp on simulated nodes; needs ``flwr``), or a Flower ``Grid``
    (inside a deployed ServerApp: :mod:`fedge.experiment.flower`). ``backend`` (with
    ``"flower-sim"``): ``"local"`` (an in-process grid, sequential) or ``"ray"`` (Flower's
    simulation engine; needs Ray: ``pip install 'fedge[flower-sim]'``).

    The directory is claimed first (exclusively: a second run aimed at it fails at once);
    nothing else is written until the config, data, model and method are all valid, and on
    invalid input the claim is undone, leaving no directory.
    """
    check_finite(cfg.to_dict())
    rt = Runtime.of(runtime, backend).ready()
    shown = _as_progress(progress)
    rundir = RunDir(out)
    rundir.claim()  # and holds it
    try:
        check_dataset_root(cfg)
        built = build_run(cfg)
        resolved = resolved_config(built)
    except BaseException:
        rundir.release()
        raise
    try:
        source = built.dataset.source if Path(built.dataset.source).is_dir() else None
        rundir.create(resolved, built.partition_summary, data_source=source)
        return _drive(built, rundir, [], None, shown, render, rt)
    finally:
        rundir.let_go()


def _changed_keys(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())


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
    shown = _as_progress(progress)
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
    raw = rundir.read_config()
    applied = rundir.applied_config()
    changes: dict[str, tuple[Any, Any]] = {}
    lost_record = (
        applied is None and rundir.has_sessions()
    )  # written since runs keep sessions.jsonl: deleted
    if lost_record and not allow_config_change:
        raise ResumeError(
            f"{str(rundir.path / '.fedge-config.json')!r}, the record of the config this run used, is missing, so "
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
                f"{str(rundir.path / 'config.yaml')!r} was edited since the run used it ({_changed_keys(changes)}); "
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
    cfg = load_config(raw)
    check_dataset_root(cfg)
    built = rebuild_run(cfg)
    state = rundir.load_checkpoint()
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
            note=".fedge-config.json was missing: any edits of config.yaml "
            "before this resume are unknown; config.yaml taken as it was",
        )
    if rounds is not None or changes:
        rundir.reopen(resolved)
    rundir.write_metrics(lines)
    return _drive(built, rundir, lines, state, progress, render, runtime)
