"""The public Python API, for notebooks and scripts: ``import fedge`` and go. Everything here
turns Python arguments into a config and calls the experiment layer (:mod:`fedge.experiment`).
Design notes: docs/decisions.md#command-line-and-python-api.

>>> import fedge, torch
>>> run = fedge.run("quickstart", overrides={"rounds": 3}, out="runs/nb1")
>>> len(run.metrics), run.summary["final_test_accuracy"] > 0.9
(3, True)
>>> run.model(torch.zeros(2, 1, 8, 8)).shape               # the trained torch model
torch.Size([2, 10])

Your own arrays need no Python beyond writing them (``x_train``, ``y_train``, ``x_test``,
``y_test`` in a ``.npz`` file; see :mod:`fedge.data.user`):

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> np.savez("mine.npz", x_train=rng.normal(size=(200, 5)), y_train=rng.integers(0, 2, 200),
...          x_test=rng.normal(size=(50, 5)), y_test=rng.integers(0, 2, 50))
>>> run = fedge.run({"dataset": {"name": "npz", "path": "mine.npz"}, "model": {"name": "mlp"}},
...                 overrides={"rounds": 2})
>>> len(run.metrics), run.path.parent.name
(2, 'runs')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedge.core.config import RunConfig, load_config
from fedge.core.validation import path_argument
from fedge.data.registry import register_dataset as _register_spec
from fedge.data.registry import register_function
from fedge.data.spec import DatasetSpec
from fedge.experiment.export import ExportResult, TrainedModel, export_model, load_trained_model
from fedge.experiment.progress import ProgressLike
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from fedge.experiment.rundir import default_run_path
from fedge.report.runlog import RunLog
from fedge.report.runlog import load_run as _load_log

__all__ = ["RunResult", "load_run", "register_dataset", "resume", "run"]


@dataclass
class RunResult:
    """A run directory as Python objects: what ``fedge.run`` returns and ``fedge.load_run`` reads.

    Attributes:
        path: the run directory.
        log: the :class:`~fedge.report.RunLog` (metrics per round, summary, config, partition).
    """

    path: Path
    log: RunLog
    _trained: TrainedModel | None = field(default=None, repr=False)

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """One dict per completed round (``round``, ``test_accuracy``, ``bytes_up``, ...)."""
        return self.log.metrics

    @property
    def summary(self) -> dict[str, Any] | None:
        """``summary.json`` (None while the run is incomplete)."""
        return self.log.summary

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config (every default filled in)."""
        return self.log.config

    @property
    def trained(self) -> TrainedModel:
        """The final model with its input metadata (loaded on first use)."""
        if self._trained is None:
            self._trained = load_trained_model(self.path)
        return self._trained

    @property
    def model(self) -> torch.nn.Module:
        """The trained model in eval mode (a pruned model's masks applied)."""
        return self.trained.model

    def export(self, *, format: str = "torchscript", out: str | Path | None = None) -> ExportResult:
        """Write the model for on-device inference (see :func:`fedge.experiment.export.export_model`)."""
        return export_model(self.path, format=format, out=out)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        acc = (self.summary or {}).get("final_test_accuracy")
        return (
            f"RunResult({str(self.path)!r}, rounds={len(self.metrics)}, final_test_accuracy={acc})"
        )


def _default_out(config: Any) -> Path:
    return default_run_path(Path(config).stem if isinstance(config, (str, Path)) else "run")


def run(
    config: str | Path | Mapping[str, Any] | RunConfig,
    *,
    out: str | Path | None = None,
    overrides: Mapping[str, Any] | list[str] | None = None,
    progress: ProgressLike = None,
    render: bool = False,
) -> RunResult:
    """Train a federation and write its run directory; the same as ``fedge run``.

    Args:
        config: a preset name (``"quickstart"``), a YAML path, a config dict (missing keys
            take their defaults), or a :class:`RunConfig`.
        out: the run directory (must not exist or be empty); default ``runs/<name>-<time>``.
        overrides: ``{"rounds": 5, "method.client_optimizer.lr": 0.05}`` or
            ``["rounds=5", ...]``, as ``--set``.
        progress: a function ``f(metrics_line, total_rounds)`` called after every round, or a
            :class:`fedge.experiment.progress.Progress` (start, clients inside a round, round).
        render: also write plots and ``report.md``/``report.html`` (as the CLI does).

    Raises:
        ConfigError (and its subclasses): bad config, unknown name, missing data; nothing is
        written then.
    """
    if isinstance(config, RunConfig):
        cfg = load_config(config.to_dict(), overrides=overrides)
    elif isinstance(config, Mapping):
        cfg = load_config(dict(config), overrides=overrides)
    else:
        cfg = load_config(
            path_argument("config", config) if not isinstance(config, str) else config,
            overrides=overrides,
        )
    target = path_argument("out", out) if out is not None else _default_out(config)
    path = run_experiment(cfg, out=target, progress=progress, render=_renderer(render))
    return load_run(path)


def resume(
    run_dir: str | Path,
    *,
    rounds: int | None = None,
    progress: ProgressLike = None,
    render: bool = False,
) -> RunResult:
    """Continue an interrupted run, or extend a finished one to ``rounds`` (``fedge run --resume``)."""
    path = resume_experiment(
        path_argument("run_dir", run_dir),
        rounds=rounds,
        progress=progress,
        render=_renderer(render),
    )
    return load_run(path)


def load_run(run_dir: str | Path) -> RunResult:
    """Read a run directory (finished or in progress): metrics, summary, config; ``.model``
    loads the trained model."""
    path = path_argument("run_dir", run_dir)
    log = _load_log(path)
    return RunResult(path, log)


def register_dataset(
    name: str | DatasetSpec,
    fn: Callable[..., Any] | None = None,
    *,
    description: str = "",
    replace: bool = False,
) -> DatasetSpec:
    """Register a dataset: ``register_dataset("mine", fn)`` with ``fn(**options)`` returning
    ``(x_train, y_train, x_test, y_test)`` (see :func:`fedge.data.registry.register_function`),
    or a full :class:`~fedge.data.DatasetSpec`. Use it as ``dataset: {name: mine}``.

    A module-level ``fn`` is recorded in the run's config as ``dataset.target``, so
    ``fedge run --resume`` works in a fresh process too.
    """
    if isinstance(name, DatasetSpec):
        return _register_spec(name)
    if fn is None or not callable(fn):
        from fedge.core.errors import ConfigError

        raise ConfigError(
            f"register_dataset({name!r}, fn): fn must be a function returning "
            f"(x_train, y_train, x_test, y_test), got {fn!r}"
        )
    return register_function(name, fn, description=description, replace=replace)


def _renderer(render: bool) -> Any:
    if not render:
        return None
    from fedge.report import render_report

    return render_report
