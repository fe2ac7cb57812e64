"""Flower's own simulation engine (``flwr.simulation.run_simulation``, Ray backend) as the grid a
:class:`~fedge.runtime.flower.FlowerExecutor` runs on (``--runtime flower-sim --backend ray``).
Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from fedge.core.errors import ConfigError
from fedge.runtime.spec import require_ray

__all__ = ["backend_config", "run_on_ray"]


def backend_config(num_nodes: int, cpus: int | None = None) -> dict[str, Any]:
    """Flower's ``backend_config`` for the Ray backend: one CPU and no GPU per ClientApp actor,
    ``cpus`` actors (default: this machine's cores, at most one per node). ``init_args`` gives Ray
    no address: Flower starts a local Ray instance (whose servers listen on all interfaces, see the
    README), not one bound to loopback."""
    cpus = max(1, min(num_nodes, cpus if cpus is not None else (os.cpu_count() or 1)))
    return {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {
            "num_cpus": cpus,
            "num_gpus": 0,
            "include_dashboard": False,
            "object_store_memory": 256 * 2**20,
            "log_to_driver": False,
            "logging_level": logging.ERROR,
        },
    }


def run_on_ray(
    server: ServerApp, client: ClientApp, num_nodes: int, *, cpus: int | None = None
) -> None:
    """Run ``server`` against ``num_nodes`` virtual SuperNodes running ``client`` in Flower's
    simulation engine (Ray backend). An exception of the ServerApp is raised here."""
    require_ray()
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault(
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0"
    )  # no GPUs asked for; silences a FutureWarning
    import ray
    from flwr.simulation import run_simulation

    if ray.is_initialized():  # Flower would reuse it with its own settings (e.g. not on loopback)
        raise ConfigError(
            "Ray is already initialised in this process; --backend ray starts (and stops) its own: "
            "call ray.shutdown() first"
        )
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)  # run_simulation's deprecation notice and per-round INFO lines
    try:
        run_simulation(
            server_app=server,
            client_app=client,
            num_supernodes=num_nodes,
            backend_config=backend_config(num_nodes, cpus),
        )
    finally:
        flwr_log.setLevel(level)
        if (
            ray.is_initialized()
        ):  # Flower shuts Ray down when its backend ran; not if it failed to start
            ray.shutdown()
