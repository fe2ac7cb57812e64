"""Starting a run: :func:`run_experiment` (what ``fedge run`` calls; tests and benchmarks call it
too) claims the output directory atomically (of two runs started with one ``--out`` exactly one
writes it), checks the config (non-finite numbers included), the dataset files and the build
before anything else is written (a bad value fails naming the fix, undoing the claim), then
writes the run directory round by round (:func:`fedge.experiment.drive.drive`); continuing a
run is :mod:`fedge.experiment.resume`'s, a diverging one :mod:`fedge.experiment.divergence`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedge.core.config import RunConfig, check_finite
from fedge.core.errors import ConfigError, DataNotFoundError
from fedge.data import get_dataset_spec
from fedge.experiment.build import build_run, resolved_config
from fedge.experiment.drive import Renderer, drive
from fedge.experiment.progress import ProgressLike, as_progress
from fedge.experiment.rundir import RunDir
from fedge.runtime.spec import Runtime

__all__ = ["check_dataset_root", "run_experiment"]


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
    invalid input the claim is undone, leaving no directory. A :class:`ConfigError` raised
    before round 1 completes (a config the rounds find cannot run) also removes what the run
    wrote; any other error, or an interrupt, leaves the directory for ``--resume``.
    """
    check_finite(cfg.to_dict())
    rt = Runtime.of(runtime, backend).ready()
    shown = as_progress(progress)
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
        try:
            return drive(built, rundir, [], None, shown, render, rt)
        except ConfigError:
            # a config that cannot run, found once the rounds began (e.g. at round 1's
            # sampling): with no round done nothing is worth resuming, and a directory left
            # behind would refuse the corrected run and offer a --resume that fails the same way
            if rundir.no_round_done():
                rundir.undo_create()
            raise
    finally:
        rundir.let_go()
