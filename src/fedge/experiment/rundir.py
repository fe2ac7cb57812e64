"""The run directory: what a run leaves on disk, written so that a crash never leaves
something that looks complete.

    config.yaml        resolved config (every default filled in)
    partition.json     partition summary (samples and label histogram per client)
    metrics.jsonl      one JSON object per completed round, flushed every round
    checkpoint.pt      state after the last completed round (atomic replace), for --resume
    summary.json       written last, with "status": "complete"
    model.safetensors  final model (the one evaluated: the EMA where a method keeps one)
    plots/, report.md, report.html

A run is complete exactly when ``summary.json`` exists with ``status == "complete"``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

from fedge.core.errors import ConfigError, ResumeError

__all__ = ["RunDir"]

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunDir:
    """A run directory being written (or resumed)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # -- creation -------------------------------------------------------------------
    @staticmethod
    def check_new(path: str | Path) -> None:
        """Raise :class:`ConfigError` if ``path`` exists and is not an empty directory."""
        p = Path(path)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise ConfigError(
                f"output directory {str(p)!r} already exists and is not empty; "
                f"choose another --out, or continue that run with: fedge run --resume {p}"
            )

    def create(self, config: dict[str, Any], partition: dict[str, Any]) -> None:
        self.check_new(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / CONFIG, yaml.safe_dump(config, sort_keys=False).encode())
        _atomic_write(self.path / "partition.json", json.dumps(partition).encode())
        (self.path / METRICS).write_text("")

    # -- per round ------------------------------------------------------------------
    def append_metrics(self, line: dict[str, Any]) -> None:
        with open(self.path / METRICS, "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        tmp = self.path / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.path / CHECKPOINT)

    # -- resume ---------------------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        cfg_path = self.path / CONFIG
        if not cfg_path.is_file():
            raise ResumeError(f"{str(self.path)!r} is not a fedge run directory (no {CONFIG})")
        return yaml.safe_load(cfg_path.read_text())

    def is_complete(self) -> bool:
        try:
            return json.loads((self.path / SUMMARY).read_text()).get("status") == "complete"
        except (OSError, ValueError):
            return False

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint (None if the run stopped before round 1 finished)."""
        ck = self.path / CHECKPOINT
        if not ck.exists():
            return None
        try:
            return torch.load(ck, weights_only=True)
        except Exception as exc:
            raise ResumeError(
                f"checkpoint {str(ck)!r} is corrupt ({exc.__class__.__name__}: {exc}); "
                "the run cannot be resumed — start it again with a new --out"
            ) from None

    def truncate_metrics(self, last_round: int) -> list[dict[str, Any]]:
        """Keep the metrics lines of rounds ``<= last_round`` (drop a torn last line)."""
        path = self.path / METRICS
        kept: list[dict[str, Any]] = []
        if path.exists():
            for raw in path.read_text().splitlines():
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(line, dict) and line.get("round", 0) <= last_round:
                    kept.append(line)
        _atomic_write(path, "".join(json.dumps(x) + "\n" for x in kept).encode())
        return kept

    def reopen(self, config: dict[str, Any]) -> None:
        """Mark the run incomplete, then replace its config (to extend it by more rounds).

        In this order a crash in between leaves an incomplete run with the old config, which
        ``--resume`` simply finishes again; never a complete-looking run with a config it did
        not run."""
        (self.path / SUMMARY).unlink(missing_ok=True)
        _atomic_write(self.path / CONFIG, yaml.safe_dump(config, sort_keys=False).encode())

    # -- finish ---------------------------------------------------------------------
    def finish(self, summary: dict[str, Any], model: torch.nn.Module) -> None:
        tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        tmp = self.path / "model.safetensors.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, self.path / "model.safetensors")
        _atomic_write(self.path / SUMMARY, (json.dumps({**summary, "status": "complete"}, indent=2) + "\n").encode())
