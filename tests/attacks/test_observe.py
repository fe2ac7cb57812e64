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
        return observe_run(attack_config(method, clients=clients, per_client=per_client, dataset="digits"))


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
    for a, b in zip(run.observer.model.parameters(), plain.method.strategy.model.parameters(), strict=True):
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


def _participation(cfg, rounds: int):  # noqa: ANN001, ANN202
    """Run ``rounds`` rounds of ``cfg`` under a :class:`Participation` recorder."""
    from dataclasses import replace

    from fedge.attacks.observe import Participation

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_run(cfg)
    rec = Participation(built.method.strategy)
    sim = replace(built, method=replace(built.method, strategy=rec)).simulation()
    lines = [sim.run_round(t) for t in range(1, rounds + 1)]
    sim.close()
    return rec.aggregated, lines


def test_participation_is_the_sampled_clients_that_replied_and_no_skipped_round() -> None:
    """Oracle: the engine's own sampler and dropout draws. Prepare: 3 of 4 clients a round,
    each dropping out with p = 0.4, a round needing 2 replies. Assert: each completed round
    records its sampled clients that did not drop out; a skipped round records nothing."""
    from fedge.runtime.engine import drops_out, sample_clients

    cfg = attack_config({"name": "fedavg", "local_epochs": 1, "batch_size": 2}, clients=4, per_client=2,
                        dataset="digits", model="lenet", rounds=6)  # fmt: skip
    clients = cfg.clients.model_copy(update={"per_round": 3, "dropout": 0.4, "min_replies": 2})
    cfg = cfg.model_copy(update={"clients": clients})
    aggregated, lines = _participation(cfg, cfg.rounds)
    expected = {}
    for r in range(1, cfg.rounds + 1):
        replied = [c for c in sample_clients(cfg.seed, r, 4, 3) if not drops_out(cfg.seed, 0.4, r, 0, c)]
        if len(replied) >= 2:
            expected[r] = replied
    assert aggregated == expected
    assert any("round_skipped" in line for line in lines)  # the case is exercised:
    assert any(len(ids) < 3 for ids in aggregated.values())  # a short round, and one that lost a client


def test_participation_under_secure_aggregation_is_the_survivors() -> None:
    """Clients that vanish after key agreement (``secagg_dropout``) replied to the first two
    exchanges but are not in the sum: the strategy names the survivors, U3."""
    from fedge.core.rng import generator

    method = {"name": "fedavg", "local_epochs": 1, "batch_size": 2, "secure_aggregation": True, "secagg_dropout": 0.25}
    cfg = attack_config(method, clients=4, per_client=2, dataset="digits", model="lenet", rounds=2)
    aggregated, lines = _participation(cfg, cfg.rounds)
    for r in (1, 2):
        gone = torch.randperm(4, generator=generator(cfg.seed, "secagg-dropout", r))[:1].tolist()
        assert aggregated[r] == sorted(set(range(4)) - set(gone))
        assert lines[r - 1]["secagg_survivors"] == 3
