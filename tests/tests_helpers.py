"""Helpers shared by test modules (imported as a plain module: tests/ is on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path

WALL_KEYS = {"wall_s", "client_wall_s"}


def metrics_without_wall(run_dir: str | Path) -> list[dict]:
    """metrics.jsonl of a run, minus wall-clock fields (which legitimately differ)."""
    lines = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in line.items() if k not in WALL_KEYS} for line in lines]
