"""The run directory: what a run leaves on disk, written so that a crash, a full disk or a second
run aimed at the same place never leaves something that looks complete. Design notes: docs/decisions.md#experiment-and-reports.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from fedge.core.errors import ConfigError, ResumeError
from fedge.core.presets import describe_yaml_error, read_yaml
from fedge.core.rng import recorded_draws
from fedge.core.rundir_schema import (
    APPLIED_CONFIG,
    CHECKPOINT,
    CLAIM,
    COMPLETE,
    CONFIG,
    CONFIG_CHANGES,
    METRICS,
    MODEL,
    PARTITION,
    SESSIONS,
    STATUS,
    SUMMARY,
    dumps,
    loads,
)
from fedge.experiment import storage
from fedge.experiment.claim import Claim, RunDirBusyError

__all__ = ["RunDir", "config_diff", "default_run_path"]


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def default_run_path(stem: str) -> Path:
    """``runs/<stem>-<YYYYmmdd-HHMMSS>`` (local time), with ``-1``, ``-2``, ... appended while
    that path exists: where a run goes when no ``out`` is given (CLI and Python API)."""
    base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for every key whose value differs (missing: None)."""
    a, b = _flatten(old), _flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


class RunDir:
    """A run directory being written (or resumed)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._claim = Claim(self.path)

    def _fix(self) -> str:
        return (
            f"free space or fix the permissions, then continue with: fedge run --resume {self.path}"
        )

    # -- creation -------------------------------------------------------------------
    @staticmethod
    def check_new(path: str | Path) -> None:
        """Raise :class:`ConfigError` if ``path`` exists and is not an empty directory
        (:class:`RunDirBusyError` if another run is setting it up or running it now). A
        directory holding only the claim of a run of this host that died before writing
        anything (SIGKILL, out of memory while loading data) passes: :meth:`claim` takes it over."""
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            if p.is_dir() and [x.name for x in p.iterdir()] == [CLAIM]:
                if (
                    RunDir(p).dead_claimant() is not None
                ):  # killed before it wrote anything: claim() takes it over
                    return
                raise RunDirBusyError(
                    f"output directory {str(p)!r} is being set up by another fedge run; choose another --out"
                )
            if p.is_dir() and RunDir(p).busy():
                raise RunDirBusyError(
                    f"output directory {str(p)!r} is being run by another fedge process; choose another --out"
                )
            if not p.is_dir():
                raise ConfigError(
                    f"output directory {str(p)!r} is a file, not a directory; choose another --out"
                )
            if not (p / CONFIG).is_file():
                raise ConfigError(
                    f"output directory {str(p)!r} already holds files and is not a fedge run; choose another --out"
                )
            if RunDir(p).is_complete():
                raise ConfigError(
                    f"output directory {str(p)!r} holds a complete run; choose another --out, or train that run further "
                    f"with: fedge run --resume {p} --set rounds=N"
                )
            raise ConfigError(
                f"output directory {str(p)!r} holds an unfinished run; choose another --out, or continue that run with: "
                f"fedge run --resume {p}"
            )

    # -- ownership (fedge.experiment.claim) ------------------------------------------
    def claim(self) -> None:
        """Own the directory after checking it may be a new run's (:meth:`check_new`): create it
        (if needed) and ``.fedge-claim`` exclusively (:meth:`Claim.take`). On return the
        directory is also held: call :meth:`let_go` when the run ends, or :meth:`release` if it
        fails before :meth:`create`, to leave no directory behind."""
        self.check_new(self.path)
        self._claim.take()

    def hold(self, *, wait: bool = False) -> None:
        """Hold the directory while this process runs it (:meth:`Claim.hold`)."""
        self._claim.hold(wait=wait)

    def let_go(self) -> None:
        """Release :meth:`hold`."""
        self._claim.let_go()

    def busy(self) -> bool:
        """Whether another process (or another :class:`RunDir` here) holds the directory now."""
        return self._claim.busy()

    def dead_claimant(self) -> str | None:
        """``"pid N on HOST, claimed at T"`` when the run that claimed the directory has died,
        else None (:meth:`Claim.dead_claimant`)."""
        return self._claim.dead_claimant()

    def release(self) -> None:
        """Undo :meth:`claim` (the run failed before writing anything)."""
        self._claim.release()

    def create(
        self, config: dict[str, Any], partition: dict[str, Any], *, data_source: str | None = None
    ) -> None:
        """Write config.yaml (headed by a comment naming where the data was read, when given),
        partition.json and an empty metrics.jsonl, claiming (and so holding, see :meth:`claim`)
        the directory first if needed.
        If a write fails, everything written here is removed again (and the claim released)."""
        if not self._claim.claimed:
            self.claim()
        try:
            self._create(config, partition, data_source)
        except BaseException:
            for name in (PARTITION, APPLIED_CONFIG, CONFIG, METRICS):
                (self.path / name).unlink(missing_ok=True)
            for tmp in self.temp_files():
                tmp.unlink(missing_ok=True)
            self.release()
            raise

    def no_round_done(self) -> bool:
        """Whether no round has completed here yet: no metrics line (a checkpoint without one
        was taken at a savepoint inside round 1, e.g. after an NTK-Ori pruning round)."""
        metrics = self.path / METRICS
        return not metrics.exists() or metrics.stat().st_size == 0

    def undo_create(self) -> None:
        """Remove what :meth:`create` and the rounds' set-up wrote (no round has completed) and
        undo the claim: the directory is left as it was before the run (gone, if the run created
        it), so the same ``--out`` takes a corrected run."""
        for name in (PARTITION, APPLIED_CONFIG, CONFIG, METRICS, SESSIONS, CHECKPOINT):
            (self.path / name).unlink(missing_ok=True)
        for tmp in self.temp_files():
            tmp.unlink(missing_ok=True)
        self.release()

    def _create(
        self, config: dict[str, Any], partition: dict[str, Any], data_source: str | None
    ) -> None:
        fix = "choose a writable --out with free space"
        storage.atomic_write(self.path / PARTITION, dumps(partition).encode(), fix)
        storage.atomic_write(self.path / APPLIED_CONFIG, dumps(config).encode(), fix)
        header = f"# dataset files read from: {data_source}\n" if data_source else ""
        storage.atomic_write(
            self.path / CONFIG, (header + yaml.safe_dump(config, sort_keys=False)).encode(), fix
        )
        with storage.failing_as(self.path / METRICS, "write", fix):
            storage.write_file(self.path / METRICS, b"")

    # -- per round ------------------------------------------------------------------
    def append_metrics(self, line: dict[str, Any]) -> None:
        with storage.failing_as(self.path / METRICS, "append to", self._fix()):
            storage.append_file(self.path / METRICS, (dumps(line) + "\n").encode())

    def record_session(self, first_round: int, machine: dict[str, Any]) -> None:
        """Append a ``sessions.jsonl`` line: rounds from ``first_round`` on run on ``machine``."""
        line = {"first_round": first_round, "machine": machine}
        with storage.failing_as(self.path / SESSIONS, "append to", self._fix()):
            storage.append_file(self.path / SESSIONS, (dumps(line) + "\n").encode())

    def read_sessions(self) -> list[dict[str, Any]]:
        """The ``sessions.jsonl`` lines (none for a run from before it existed; a torn last line
        or a line that is not a session is skipped: provenance never stops a run)."""
        try:
            text = (self.path / SESSIONS).read_text()
        except (OSError, UnicodeDecodeError):
            return []
        out = []
        for raw in text.splitlines():
            try:
                line = loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and isinstance(line.get("first_round"), int):
                out.append(line)
        return out

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        tmp = self.path / (CHECKPOINT + ".tmp")
        with storage.failing_as(self.path / CHECKPOINT, "write", self._fix(), tmp=tmp):
            storage.save_torch(state, tmp)
            os.replace(tmp, self.path / CHECKPOINT)

    # -- resume ---------------------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        """``config.yaml`` as a mapping; :class:`ResumeError` (one line) if missing or not YAML."""
        cfg_path = self.path / CONFIG
        if not self.path.exists():
            raise ResumeError(
                f"{str(self.path)!r} does not exist; give the directory of a fedge run"
            )
        if not cfg_path.is_file():
            raise ResumeError(f"{str(self.path)!r} is not a fedge run directory (no {CONFIG})")
        try:
            raw = read_yaml(cfg_path.read_text())
        except yaml.YAMLError as exc:
            raise ResumeError(
                f"{str(cfg_path)!r} is not valid YAML {describe_yaml_error(exc)}; fix or restore it, then resume again"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ResumeError(
                f"cannot read {str(cfg_path)!r} ({exc}); restore it, then resume again"
            ) from None
        if not isinstance(raw, dict):
            raise ResumeError(
                f"{str(cfg_path)!r} must hold a mapping of config keys, got {type(raw).__name__}; restore it"
            )
        return recorded_draws(raw)  # written before the draws key: torch's

    def has_sessions(self) -> bool:
        """Whether the run keeps ``sessions.jsonl`` (every run made since it also keeps ``.fedge-config.json``)."""
        return (self.path / SESSIONS).is_file()

    def applied_config(self) -> dict[str, Any] | None:
        """The resolved config the run last ran with (None for runs written before it was kept)."""
        path = self.path / APPLIED_CONFIG
        if not path.is_file():
            return None
        try:
            obj = loads(path.read_text())
        except (OSError, ValueError):
            raise ResumeError(
                f"{str(path)!r} is corrupt; restore it (it records the config the run used)"
            ) from None
        if not isinstance(obj, dict):
            raise ResumeError(
                f"{str(path)!r} is corrupt (holds {type(obj).__name__}, not a mapping of config keys); "
                "restore it (it records the config the run used)"
            )
        return recorded_draws(obj)

    def record_config_change(
        self,
        at_round: int,
        changes: dict[str, tuple[Any, Any]],
        config: dict[str, Any],
        note: str | None = None,
    ) -> None:
        """Log accepted edits (and a ``note`` when the edits are unknown) to ``config_changes.jsonl``
        and make ``config`` the applied one."""
        line: dict[str, Any] = {
            "after_round": at_round,
            "changes": {k: {"from": a, "to": b} for k, (a, b) in changes.items()},
        }
        if note:
            line["note"] = note
        with storage.failing_as(self.path / CONFIG_CHANGES, "append to", self._fix()):
            storage.append_file(self.path / CONFIG_CHANGES, (dumps(line) + "\n").encode())
        storage.atomic_write(self.path / APPLIED_CONFIG, dumps(config).encode(), self._fix())

    def is_complete(self) -> bool:
        try:
            summary = loads((self.path / SUMMARY).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(summary, dict) and summary.get(STATUS) == COMPLETE

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint (None if the run stopped before round 1 finished), its tensors on
        the CPU whatever device wrote them (the strategies move their state to the run's device)."""
        ck = self.path / CHECKPOINT
        if not ck.exists():
            return None
        try:
            return torch.load(ck, weights_only=True, map_location="cpu")
        except Exception as exc:
            raise ResumeError(
                f"checkpoint {str(ck)!r} is corrupt ({exc.__class__.__name__}: {exc}); "
                "the run cannot be resumed — start it again with a new --out"
            ) from None

    def read_metrics(self, last_round: int) -> list[dict[str, Any]]:
        """The metrics lines of rounds ``<= last_round``, reading only.

        A torn *last* line (a kill mid-write) is dropped; any other line that is not a JSON
        object with an integer ``round`` is an error (:class:`ResumeError`): nothing is written,
        so the user keeps every byte."""
        path = self.path / METRICS
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
        kept: list[dict[str, Any]] = []
        for pos, (lineno, raw) in enumerate(numbered):
            try:
                line = loads(raw)
            except ValueError:
                if pos == len(numbered) - 1:
                    break
                line = None
            rnd = line.get("round") if isinstance(line, dict) else None
            if not isinstance(rnd, int) or isinstance(rnd, bool):
                raise ResumeError(
                    f"{str(path)!r} line {lineno} is not a metrics record ({raw[:40]!r}); only the last line may "
                    "be torn by a crash: restore the file or delete that line, then resume again (nothing was changed)"
                )
            if rnd <= last_round:
                kept.append(line)
        return kept

    def write_metrics(self, lines: list[dict[str, Any]]) -> None:
        """Replace ``metrics.jsonl`` by ``lines`` (atomically)."""
        storage.atomic_write(
            self.path / METRICS, "".join(dumps(x) + "\n" for x in lines).encode(), self._fix()
        )

    def truncate_metrics(self, last_round: int) -> list[dict[str, Any]]:
        """Keep the metrics lines of rounds ``<= last_round`` (drop a torn last line)."""
        kept = self.read_metrics(last_round)
        self.write_metrics(kept)
        return kept

    def reopen(self, config: dict[str, Any]) -> None:
        """Mark the run incomplete, then replace its config (to extend it by more rounds).

        In this order a crash in between leaves an incomplete run with the old config, which
        ``--resume`` simply finishes again; never a complete-looking run with a config it did
        not run."""
        with storage.failing_as(self.path / SUMMARY, "remove", self._fix()):
            (self.path / SUMMARY).unlink(missing_ok=True)
        if (self.path / APPLIED_CONFIG).exists():
            storage.atomic_write(self.path / APPLIED_CONFIG, dumps(config).encode(), self._fix())
        try:
            old = (self.path / CONFIG).read_text().splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            old = []
        header = "".join(x for x in old[:1] if x.startswith("# dataset files read from:"))
        storage.atomic_write(
            self.path / CONFIG,
            (header + yaml.safe_dump(config, sort_keys=False)).encode(),
            self._fix(),
        )

    # -- finish ---------------------------------------------------------------------
    def finish(self, summary: dict[str, Any], model: torch.nn.Module) -> None:
        tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        tmp = self.path / (MODEL + ".tmp")
        with storage.failing_as(self.path / MODEL, "write", self._fix(), tmp=tmp):
            storage.save_safetensors(tensors, tmp, metadata={"format": "pt"})
            os.replace(tmp, self.path / MODEL)
        storage.atomic_write(
            self.path / SUMMARY,
            (dumps({**summary, STATUS: COMPLETE}, indent=2) + "\n").encode(),
            self._fix(),
        )

    def temp_files(self) -> list[Path]:
        return sorted(self.path.glob("*.tmp"))
