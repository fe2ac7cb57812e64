"""Driving a built run's rounds into its run directory, for a new run and a resumed one alike:
each round's metrics line and checkpoint are written as the round ends (and a checkpoint at each
savepoint inside a round, e.g. after each of NTK-Ori's pruning rounds), the progress told,
divergence watched (:mod:`fedge.experiment.divergence`), the first warning of a kind shown and
its repeats counted, and at the end the summary and the final model written and the report
rendered; temporary files of a write cut short are removed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedge.core import rundir_schema as schema
from fedge.core.errors import DivergenceError
from fedge.core.protocols import Savepoint
from fedge.core.threads import torch_threads
from fedge.experiment.build import BuiltRun
from fedge.experiment.divergence import DivergenceWatch
from fedge.experiment.progress import Progress
from fedge.experiment.provenance import machine, segments
from fedge.experiment.rundir import RunDir
from fedge.experiment.summary import run_summary
from fedge.runtime.engine import Simulation
from fedge.runtime.spec import Runtime

__all__ = ["Renderer", "drive"]

#: Renders a finished run directory (the CLI passes ``fedge.report.render_report``: the report
#: layer sits above this one, so it is handed in, never imported); None or False: don't.
Renderer = Callable[[Path], Any] | bool | None


def drive(
    built: BuiltRun,
    rundir: RunDir,
    lines: list[dict[str, Any]],
    state: dict[str, Any] | None,
    progress: Progress,
    render: Renderer,
    runtime: Runtime,
) -> Path:
    """Run the rounds of ``built`` after those ``lines`` already written (from the checkpoint
    ``state``; None: from the start) on ``runtime``, into ``rundir``; its path once complete.
    ``config.threads`` holds while the rounds run, the caller's thread count after."""
    # a notebook's own thread count comes back after the run
    with torch_threads(built.config.threads):
        try:
            return _drive_rounds(built, rundir, lines, state, progress, render, runtime)
        except BaseException:
            for (
                tmp
            ) in rundir.temp_files():  # half-written checkpoint/model/metrics from this process
                tmp.unlink(missing_ok=True)
            raise


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
    watch = DivergenceWatch(built, rundir)
    # the round being written while on_round runs (its warnings belong to it)
    writing: list[int] = []

    def on_round(line: dict[str, Any], sim: Simulation) -> None:
        writing[:] = [line[schema.ROUND]]
        bad = watch.mark(line)
        rundir.append_metrics(line)
        rundir.save_checkpoint(sim.state_dict())
        lines.append(line)
        progress.round(line, cfg.rounds)
        if bad is not None:
            watch.after_write(line, bad)
        writing.clear()

    def on_savepoint(sim: Simulation, rnd: int, point: Savepoint) -> None:
        rundir.save_checkpoint(sim.state_dict())  # the part of round rnd done survives an interrupt
        progress.phase(rnd, point.phase, point.done, point.total)

    sim = built.simulation(on_round, runtime=runtime)
    sim.on_progress = progress.clients
    sim.on_savepoint = on_savepoint
    if state is not None:
        sim.load_state_dict(state)
    progress.start(cfg.rounds, len(lines))
    rundir.record_session(len(lines) + 1, machine())
    with _collapsed_warnings(lambda: writing[0] if writing else sim.record.round + 1):
        try:
            sim.run()
        except DivergenceError as exc:  # by type: the watch's own, or the engine's or a method's
            stop = watch.stop(exc, sim.record.round)
            if stop is exc:
                raise
            raise stop from None
    summary = run_summary(built, sim, lines)
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
