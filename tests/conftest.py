"""Shared test fixtures: tiny, fast federations. The ``needs_data`` marker and the Fashion-MNIST
fixtures (``fashion_mnist``, ``fake_fashion_mnist``) come from tests/real_data.py, the
``needs_cuda`` marker from tests/accelerators.py."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# PPFL's simulated TEE fuses: a file of this test process's own (and of the processes it
# starts), never the user's ~/.local/state/fedge/tee-platform
_TEE_DIR = tempfile.mkdtemp(prefix="fedge-test-tee-")
atexit.register(shutil.rmtree, _TEE_DIR, ignore_errors=True)
os.environ["FEDGE_TEE_PLATFORM"] = os.path.join(_TEE_DIR, "platform")
torch.set_num_threads(1)

pytest_plugins = ["real_data", "accelerators"]


def tiny_config(**overrides):
    """A synthetic 8x8 federation that trains in a fraction of a second per round."""
    cfg = {
        "seed": 0,
        "rounds": 3,
        "clients": {"num": 4, "per_round": 4},
        "dataset": {"name": "synthetic"},
        "partition": {"name": "iid"},
        "model": {"name": "mlp"},
        "method": {
            "name": "fedavg",
            "local_epochs": 1,
            "batch_size": 32,
            "client_optimizer": {"lr": 0.1},
        },
    }
    for key, value in overrides.items():
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


@pytest.fixture
def tiny():
    return tiny_config
