"""BAFFLE's zeroth-order spec: built once from the method config, and the one value the client,
the server and the seeds-downlink replay estimate with."""

import torch
import torch.nn.functional as F

from fedge.core.messages import Message
from fedge.estimators import ZerothOrderSpec, estimate_gradient, loss_differences
from fedge.methods.baffle import BaffleBatchClient, BaffleBatchStrategy, BaffleConfig
from fedge.methods.ntk_baffle import NtkBaffleConfig
from fedge.methods.replay import ClientReplica, OneStep, replay_step


def _model() -> torch.nn.Module:
    """Weights from an explicit generator (no global RNG)."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def test_the_spec_is_built_from_the_config() -> None:
    cfg = BaffleConfig(
        mode="batch",
        k=12,
        sigma=1e-3,
        scheme="central",
        estimator="lean",
        chunk=4,
        directions="block",
        precision="bfloat16",
    )
    assert cfg.zo_spec(workers=3) == ZerothOrderSpec(
        k=12,
        sigma=1e-3,
        scheme="central",
        directions="block",
        mode="lean",
        chunk=4,
        dtype=torch.bfloat16,
        workers=3,
    )
    # the defaults: BAFFLE's K = 100, σ = 1e-4, twice-FD, fast estimator, float32 (dtype None)
    assert BaffleConfig().zo_spec() == ZerothOrderSpec(
        k=100, sigma=1e-4, scheme="forward", mode="fast"
    )
    ntk = NtkBaffleConfig(prune_k=7, prune_sigma=0.05, k=20)
    assert ntk.prune_spec() == ZerothOrderSpec(k=7, sigma=0.05, scheme="central")
    assert ntk.zo_spec() == ZerothOrderSpec(k=20, sigma=1e-4, scheme="forward", mode="fast")


def test_client_server_and_replica_estimate_with_the_configs_spec() -> None:
    """The client's ΔL and the server's ĝ are those of the estimator functions under
    ``cfg.zo_spec()``; the seeds-downlink replica replays with the same spec."""
    cfg = BaffleConfig(mode="batch", k=5, sigma=1e-2, clip=None, downlink="seeds")
    spec = cfg.zo_spec()
    client = BaffleBatchClient(_model, cfg, threads=2)
    assert client.spec == cfg.zo_spec(workers=2)
    assert client.replica is not None and client.replica.update == OneStep(client.spec, None, None)
    strat = BaffleBatchStrategy(_model(), cfg, seed=4)
    assert strat.spec == spec

    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    seed = strat.round_seed(1)
    d = loss_differences(_model(), F.cross_entropy, (x, y), spec, seed=seed)
    got = strat.estimate(1, {0: Message({"dL": d}, {"num_samples": 6})})
    want = estimate_gradient(dict(_model().named_parameters()), d, spec, seed=seed)
    for name in want:
        assert torch.equal(got[name], want[name]), name

    replica = ClientReplica(
        _model(), cfg.server_optimizer.build(), OneStep(spec, cfg.perturb, cfg.clip), k=cfg.k
    )
    strat.shared_update(1, d, [0])
    assert not torch.equal(strat.model[1].weight, _model()[1].weight)  # the server stepped
    replay_step(replica.server, spec, seed, d, perturb=cfg.perturb, clip=cfg.clip)
    for (name, p), q in zip(strat.model.named_parameters(), replica.server.model.parameters()):
        assert torch.equal(p, q), name  # the replayed model is the server's, bit for bit
