"""The Observer records what the server sees without changing what the method does."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from fedge.attacks.harness import attack_config, observe_run
from fedge.experiment.build import build_run


def _quiet_run(method: dict, clients: int = 2, per_client: int = 1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return observe_run(
            attack_config(method, clients=clients, per_client=per_client, dataset="digits")
        )


def test_fedsgd_upload_is_the_clients_gradient_at_the_broadcast_model() -> None:
    run = _quiet_run({"name": "fedsgd", "batch_size": 1})
    views = run.views
    assert sorted(v.cid for v in views) == [0, 1]
    model = run.built.model_fn()
    for v in views:
        model.load_state_dict({**model.state_dict(), **v.model})
        data = run.built.clients[v.cid]
        x, y = data.x[data.indices], data.y[data.indices]
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
        for (name, _), g in zip(model.named_parameters(), grads, strict=True):
            torch.testing.assert_close(v.upload[name], g)
        assert not v.masked


def test_observer_does_not_change_the_trained_model() -> None:
    method = {"name": "baffle", "mode": "batch", "k": 8, "ema": None}
    run = _quiet_run(method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = build_run(attack_config(method, clients=2, per_client=1, dataset="digits"))
    sim = plain.simulation()
    sim.run_round(1)
    sim.close()
    for a, b in zip(
        run.observer.model.parameters(), plain.method.strategy.model.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b)


def test_baffle_upload_is_k_values_with_seed_and_masked_under_secure_aggregation() -> None:
    base = {"name": "baffle", "mode": "batch", "k": 8, "ema": None}
    clear = _quiet_run({**base, "secure_aggregation": False}).views
    masked = _quiet_run(base).views
    assert all(v.upload["dL"].shape == (8,) and isinstance(v.config["seed"], int) for v in clear)
    assert all(v.masked and v.upload["dL"].shape == (8,) for v in masked)
    by_cid = {v.cid: v for v in clear}
    for v in masked:  # same seed, same data: the plaintext is known; the masked vector is not it
        assert v.config["seed"] == by_cid[v.cid].config["seed"]
        assert not torch.allclose(v.upload["dL"], by_cid[v.cid].upload["dL"], atol=1e-2)
