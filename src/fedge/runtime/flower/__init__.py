"""fedge on Flower (``pip install 'fedge[flower]'``): see :mod:`fedge.runtime.flower.executor` (the server side) and
:mod:`fedge.runtime.flower.adapter` (the ClientApp)."""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from fedge.core.errors import ConfigError

    raise ConfigError(
        "the Flower runtime needs the flwr package, which is not installed; "
        "install it with: pip install 'fedge[flower]'"
    ) from exc

from fedge.runtime.flower.adapter import client_app, server_app  # noqa: E402
from fedge.runtime.flower.executor import FlowerExecutor, flower_simulation  # noqa: E402
from fedge.runtime.flower.grid import LocalGrid  # noqa: E402

__all__ = ["FlowerExecutor", "LocalGrid", "client_app", "flower_simulation", "server_app"]
