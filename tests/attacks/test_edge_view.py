"""What EPPFL's edge server holds after round 1, through the real engine."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedge.attacks.edge_view import edge_view, released_activations
from fedge.attacks.harness import attack_config, observe_run
from fedge.core.errors import ConfigError


def test_edge_server_reads_released_activations_at_their_positions() -> None:
    """Oracle: the released kept activations (θ_a = 0.5), put back at the positions the
    message's seed regenerates, are M_c(x) there and 0 elsewhere."""
    method = {"name": "eppfl", "local_epochs": 1, "batch_size": 1, "theta_a": 0.5}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(
            attack_config(method, clients=2, per_client=1, dataset="digits"), parties=("edge",)
        )
    steps, split = edge_view(run, "test")
    assert sorted(steps) == [0, 1]
    for cid, msg in steps.items():
        d = run.built.clients[cid]
        with torch.no_grad():
            full = split.device(d.x[d.indices]).reshape(1, -1)
        dense = released_activations(msg)
        kept = dense != 0
        assert 0.4 < float(kept.double().mean()) < 0.6
        torch.testing.assert_close(dense[kept], full[kept])


def test_a_run_without_an_edge_server_is_refused_with_its_method() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(
            attack_config(
                {"name": "fedsgd", "batch_size": 1}, clients=1, per_client=1, dataset="digits"
            )
        )
    with pytest.raises(ConfigError, match="activations released to an edge server"):
        edge_view(run, "activation inversion")
