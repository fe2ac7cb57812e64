"""Reading a run directory written by the engine, finished or in progress (:func:`load_run`),
with the file and key names of :mod:`fedge.core.rundir_schema`.

Example:
    >>> import fedge
    >>> _ = fedge.run("quickstart", overrides={"rounds": 2}, out="runs/quick")
    >>> run = load_run("runs/quick")
    >>> rounds, acc = run.series("test_accuracy")   # nulls skipped
    >>> rounds
    [1, 2]
    >>> run.status
    'complete'
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from fedge.core import rundir_schema as schema
from fedge.core.errors import FedgeError
from fedge.core.rng import recorded_draws

__all__ = [
    "CUM_BYTES",
    "SIM_TIME_TOTAL_S",
    "NotARunDirError",
    "RunDirError",
    "RunLog",
    "RunLogWarning",
    "load_run",
]

#: Virtual metric: cumulative bytes on the wire both ways (``cum_bytes_down + cum_bytes_up``).
CUM_BYTES = "cum_bytes"
#: Cumulative client FLOPs counting only non-zero weights (sparse models log it); a run that does
#: not log it ran dense, and its executed FLOPs (``cum_client_flops``) stand in.
CUM_EFFECTIVE_FLOPS = schema.CUM_CLIENT_FLOPS_EFFECTIVE
#: Cumulative simulated seconds on the device fleet (runs with the time model only).
SIM_TIME_TOTAL_S = schema.SIM_TIME_TOTAL_S


class RunDirError(FedgeError, ValueError):
    """A file in a run directory is malformed (bad JSON/YAML, wrong shape)."""


class NotARunDirError(FedgeError, FileNotFoundError):
    """The path does not exist or holds no ``metrics.jsonl``: it is not a fedge run directory."""


class RunLogWarning(UserWarning):
    """A run directory is readable but not pristine (truncated last line, repeated rounds)."""


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _finite(v: Any) -> TypeGuard[float]:
    return _is_number(v) and math.isfinite(v)


@dataclass
class RunLog:
    """Everything a run directory says about one run.

    Attributes:
        path: the run directory.
        config: the resolved config (nested mapping; ``{}`` if ``config.yaml`` is missing).
        metrics: one dict per completed round, sorted by ``round`` (1-based).
        summary: ``summary.json`` if present, else ``None``.
        partition: ``partition.json`` if present, else ``None``.
        name: a display name overriding :attr:`label` (e.g. to tell apart runs whose
            directories share a name).
    """

    path: Path
    config: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    partition: dict[str, Any] | None = None
    name: str | None = None

    # ---- identity -------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """Short name for tables and legends: :attr:`name`, else the directory name."""
        if self.name:
            return self.name
        return self.path.name or self.path.resolve().name or f"{self.method}-{self.model}"

    def _name(self, key: str) -> str:
        """``method``/``model``/``dataset``: summary first, then ``config[key].name``."""
        if self.summary and isinstance(self.summary.get(key), str):
            return self.summary[key]
        v = self.config.get(key)
        if isinstance(v, dict):
            v = v.get("name")
        return str(v) if v is not None else "?"

    @property
    def method(self) -> str:
        return self._name("method")

    @property
    def model(self) -> str:
        return self._name("model")

    @property
    def dataset(self) -> str:
        return self._name("dataset")

    @property
    def seed(self) -> int | None:
        s = (self.summary or {}).get("seed", self.config.get("seed"))
        return s if isinstance(s, int) else None

    # ---- progress -------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """True iff ``summary.json`` exists and says ``"status": "complete"``."""
        return self.summary is not None and self.summary.get(schema.STATUS) == schema.COMPLETE

    @property
    def rounds_done(self) -> int:
        """The last completed round (0 before the first one finishes)."""
        return int(self.metrics[-1][schema.ROUND]) if self.metrics else 0

    @property
    def rounds_planned(self) -> int | None:
        """``config.rounds`` if the config says it."""
        r = self.config.get("rounds")
        return r if isinstance(r, int) else None

    @property
    def status(self) -> str:
        """``"complete"`` or ``"incomplete (N rounds so far)"``."""
        if self.complete:
            return schema.COMPLETE
        text = f"incomplete ({self.rounds_done} rounds so far)"
        if self.summary and self.summary.get(schema.STATUS) is not None:
            text += f"; summary status {self.summary['status']!r}"
        return text

    # ---- series ---------------------------------------------------------------------------

    def value(self, row: dict[str, Any], key: str) -> float | None:
        """``row[key]`` as a finite number, else ``None``; understands :data:`CUM_BYTES`."""
        if key == CUM_BYTES:
            down, up = row.get(schema.CUM_BYTES_DOWN), row.get(schema.CUM_BYTES_UP)
            return down + up if _finite(down) and _finite(up) else None
        if key == CUM_EFFECTIVE_FLOPS and key not in row:
            key = schema.CUM_CLIENT_FLOPS
        v = row.get(key)
        return v if _finite(v) else None

    def series(self, key: str, *, x: str = schema.ROUND) -> tuple[list[float], list[float]]:
        """``(xs, ys)`` over rounds where both ``x`` and ``key`` are finite numbers.

        Nulls (e.g. accuracy on rounds that were not evaluated), missing keys and non-finite
        values are skipped, so the lists are ready to plot. ``x`` may be any metric or
        :data:`CUM_BYTES`, e.g. ``run.series("test_accuracy", x=CUM_BYTES)``.
        """
        xs, ys = [], []
        for row in self.metrics:
            xv, yv = self.value(row, x), self.value(row, key)
            if xv is not None and yv is not None:
                xs.append(xv)
                ys.append(yv)
        return xs, ys

    def numeric_keys(self) -> list[str]:
        """Every key holding a number in at least one round, in first-seen order.

        Method-specific extras (anything the engine logs beyond the standard keys) show up
        here, so reports and plots need not know them in advance.
        """
        seen: dict[str, None] = {}
        for row in self.metrics:
            for k, v in row.items():
                if _is_number(v):
                    seen.setdefault(k, None)
        return list(seen)

    @property
    def simulated_time(self) -> bool:
        """Whether the run simulated time on a device fleet (logged ``sim_time_total_s``)."""
        return any(_finite(row.get(SIM_TIME_TOTAL_S)) for row in self.metrics)

    # ---- headline numbers (summary when complete, else from the metrics so far) -----------

    def _summary_number(self, key: str) -> float | None:
        value = self.summary.get(key) if self.summary is not None and self.complete else None
        return value if _finite(value) else None

    def _last(self, key: str) -> float | None:
        for row in reversed(self.metrics):
            v = self.value(row, key)
            if v is not None:
                return v
        return None

    @property
    def final_accuracy(self) -> float | None:
        s = self._summary_number(schema.FINAL_TEST_ACCURACY)
        return s if s is not None else self._last(schema.TEST_ACCURACY)

    @property
    def best_accuracy(self) -> float | None:
        s = self._summary_number(schema.BEST_TEST_ACCURACY)
        if s is not None:
            return s
        _, acc = self.series(schema.TEST_ACCURACY)
        return max(acc) if acc else None

    @property
    def best_round(self) -> int | None:
        """The first round that reached :attr:`best_accuracy` (from the metrics)."""
        rounds, acc = self.series(schema.TEST_ACCURACY)
        if not acc:
            return None
        return int(rounds[acc.index(max(acc))])

    def _total(self, summary_key: str, cum_key: str, per_round_key: str) -> int | None:
        s = self._summary_number(summary_key)
        if s is not None:
            return int(s)
        c = self._last(cum_key)
        if c is not None:
            return int(c)
        _, per_round = self.series(per_round_key)
        return int(sum(per_round)) if per_round else None

    @property
    def total_bytes_down(self) -> int | None:
        return self._total(schema.TOTAL_BYTES_DOWN, schema.CUM_BYTES_DOWN, schema.BYTES_DOWN)

    @property
    def total_bytes_up(self) -> int | None:
        return self._total(schema.TOTAL_BYTES_UP, schema.CUM_BYTES_UP, schema.BYTES_UP)

    @property
    def total_client_flops(self) -> int | None:
        return self._total(schema.TOTAL_CLIENT_FLOPS, schema.CUM_CLIENT_FLOPS, schema.CLIENT_FLOPS)

    @property
    def wall_s(self) -> float | None:
        s = self._summary_number(schema.WALL_S)
        if s is not None:
            return float(s)
        _, w = self.series(schema.WALL_S)
        return float(sum(w)) if w else None

    @property
    def sim_time_s(self) -> float | None:
        """Simulated seconds on the device fleet so far (None: the run simulated no time)."""
        return self._last(SIM_TIME_TOTAL_S)

    @property
    def peak_memory(self) -> int | None:
        """Client peak memory in bytes (max over rounds), if measured."""
        s = (self.summary or {}).get(schema.CLIENT_PEAK_BYTES)
        if _finite(s):
            return int(s)
        _, p = self.series(schema.CLIENT_PEAK_BYTES)
        return int(max(p)) if p else None

    @property
    def model_params(self) -> int | None:
        v = (self.summary or {}).get(schema.MODEL_PARAMS)
        return int(v) if _finite(v) else None

    @property
    def model_bytes(self) -> int | None:
        v = (self.summary or {}).get(schema.MODEL_BYTES)
        return int(v) if _finite(v) else None

    @property
    def fairness(self) -> dict[str, Any] | None:
        """The last per-client evaluation (``partition.local_test``): ``{"round", the four
        :data:`~fedge.core.rundir_schema.FAIRNESS_KEYS`, "client_accuracy": [per client, None
        for a client without a split]}``; None when the run evaluated no local test split."""
        for row in reversed(self.metrics):
            per = row.get(schema.CLIENT_ACCURACY)
            if isinstance(per, list) and all(_finite(row.get(k)) for k in schema.FAIRNESS_KEYS):
                return {
                    schema.ROUND: row[schema.ROUND],
                    **{k: float(row[k]) for k in schema.FAIRNESS_KEYS},
                    schema.CLIENT_ACCURACY: [float(a) if _finite(a) else None for a in per],
                }
        return None

    def bytes_to_accuracy(self, target: float) -> int | None:
        """Cumulative bytes (down + up) when test accuracy first reached ``target``; else None."""
        for row in self.metrics:
            acc = self.value(row, schema.TEST_ACCURACY)
            if acc is not None and acc >= target:
                b = self.value(row, CUM_BYTES)
                return int(b) if b is not None else None
        return None


# ---- loading --------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = schema.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"{path} is not valid JSON ({e}); delete or restore it") from e
    if not isinstance(obj, dict):
        raise RunDirError(
            f"{path} should hold a JSON object, got {type(obj).__name__}; delete or restore it"
        )
    return obj


def _recorded(config: dict[str, Any]) -> dict[str, Any]:
    """A run's config as it ran: without ``draws``, written before the key, torch's draws."""
    return recorded_draws(config) if config else config


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        warnings.warn(f"{path} is missing; reporting without the config", RunLogWarning, 3)
        return {}
    try:
        obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise RunDirError(f"{path} is not valid YAML ({e}); delete or restore it") from e
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise RunDirError(
            f"{path} should hold a mapping, got {type(obj).__name__}; delete or restore it"
        )
    return obj


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """Parse ``metrics.jsonl``; a truncated *last* line (a crash mid-write) is dropped, warning.

    Rows come back sorted by round; a round logged twice keeps its last row, with a warning.
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    by_round: dict[int, dict[str, Any]] = {}
    for pos, (lineno, line) in enumerate(numbered):
        try:
            row = schema.loads(line)
        except json.JSONDecodeError as e:
            if pos == len(numbered) - 1:
                warnings.warn(
                    f"{path} line {lineno} is truncated (the run probably stopped mid-write); ignoring that round",
                    RunLogWarning,
                    3,
                )
                break
            raise RunDirError(
                f"{path} line {lineno} is not valid JSON ({e}); only the last line may be "
                "truncated, so the file is corrupt: restore it or delete that line"
            ) from e
        rnd = row.get(schema.ROUND) if isinstance(row, dict) else None
        if not isinstance(rnd, int) or isinstance(rnd, bool):
            raise RunDirError(
                f"{path} line {lineno}: expected a JSON object with an integer 'round', "
                f"got {line[:80]!r}; restore the file or delete that line"
            )
        if rnd in by_round:
            warnings.warn(
                f"{path} logs round {rnd} more than once (a resumed run?); keeping the last",
                RunLogWarning,
                3,
            )
        by_round[rnd] = row
    return [by_round[r] for r in sorted(by_round)]


def load_run(run_dir: str | Path) -> RunLog:
    """Read a run directory.

    Args:
        run_dir: a directory written by ``fedge run`` (finished or still running).

    Returns:
        A :class:`RunLog`; ``summary`` is ``None`` for a run still in progress.

    Raises:
        NotARunDirError: ``run_dir`` does not exist or has no ``metrics.jsonl``.
        RunDirError: a file is malformed beyond a truncated last metrics line.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise NotARunDirError(
            f"run directory {str(path)!r} does not exist (or is not a directory); "
            "pass a directory written by `fedge run`"
        )
    metrics_path = path / schema.METRICS
    if not metrics_path.is_file():
        raise NotARunDirError(
            f"{str(path)!r} is not a fedge run directory: it has no {schema.METRICS}; "
            "pass a directory written by `fedge run`"
        )
    metrics = _read_metrics(metrics_path)
    summary = _read_json(path / schema.SUMMARY)
    _check_rounds_logged(path, metrics, summary)
    return RunLog(
        path=path,
        config=_recorded(_read_config(path / schema.CONFIG)),
        metrics=metrics,
        summary=summary,
        partition=_read_json(path / schema.PARTITION),
    )


def _check_rounds_logged(
    path: Path, metrics: list[dict[str, Any]], summary: dict[str, Any] | None
) -> None:
    """Warn when a complete run's ``metrics.jsonl`` does not hold rounds 1..N of its summary.

    A run writes one metrics line per round (a skipped round too) before its summary, so a gap
    means the file was truncated, replaced or edited afterwards; the report would then show
    fewer rounds than the headline numbers, which come from the summary.
    """
    if not summary or summary.get(schema.STATUS) != schema.COMPLETE:
        return
    planned = summary.get(schema.ROUNDS)
    if not isinstance(planned, int) or isinstance(planned, bool):
        return
    logged = [m[schema.ROUND] for m in metrics]
    if logged == list(range(1, planned + 1)):
        return
    missing = sorted(set(range(1, planned + 1)) - set(logged))
    held = f"rounds {logged[0]}-{logged[-1]} ({len(logged)} lines)" if logged else "no rounds"
    gap = f"; missing {_rounds_text(missing)}" if missing and logged else ""
    warnings.warn(
        f"{path / schema.SUMMARY} says the run completed {planned} rounds but "
        f"{path / schema.METRICS} holds {held}{gap}: the metrics file was truncated, replaced "
        "or edited after the run; restore it (per-round figures use what it holds)",
        RunLogWarning,
        3,
    )


def _rounds_text(rounds: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1-3, 7"`` (the first five stretches)."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans[:5])
    return text + (", ..." if len(spans) > 5 else "")
