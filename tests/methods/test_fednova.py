"""FedNova against its oracles: the normalized update of two clients with unequal local steps on
a quadratic, computed by hand; a_i for momentum SGD against torch's own steps on a linear loss;
equal local work equals FedAvg within float rounding; the drawn local epochs are a pure function
of (seed, round, client); secure aggregation and DP are refused by name."""

from __future__ import annotations

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.context import ClientContext, ClientData
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.experiment.build import build_run
from fedge.methods.base import ServerOptimizerConfig
from fedge.methods.fednova import (
    FedNovaAveraging,
    FedNovaClient,
    FedNovaConfig,
    drawn_local_epochs,
    normalizer,
)


def _train(tiny, rounds=2, **method):
    base = {"local_epochs": 2, "batch_size": 8, "client_optimizer": {"lr": 0.1}}
    built = build_run(load_config(tiny(method={**base, **method})))
    sim = built.simulation()
    lines = [sim.run_round(r) for r in range(1, rounds + 1)]
    sim.close()
    return built, lines, sim.strategy.eval_model().state_dict()


def _ctx(n, cid=0, rnd=1):
    x, y = torch.ones(n, 1), torch.zeros(n, dtype=torch.int64)
    return ClientContext(
        cid=cid,
        rnd=rnd,
        data=ClientData(x, y, torch.arange(n)),
        generator=torch.Generator().manual_seed(cid),
        meter=Meter(),
    )


def _quadratic(target):
    """The gradient of F(w) = ½(w − target)² on a one-weight model."""

    def gradient(model, batch, ctx, masks):
        return None, {"weight": (model.weight.detach() - target).clone()}

    return gradient


def _line():
    return torch.nn.Linear(1, 1, bias=False)


def test_normalized_update_by_hand_with_unequal_local_steps():
    """Two clients on F_c(w) = ½(w − t_c)², SGD η = 0.5 from x = 0, one epoch of batch size 1:
    client 1 has n = 1 sample (τ = 1), client 2 has n = 3 (τ = 3); p = (1/4, 3/4).
    Each step w ← w − η(w − t) = ½w + ½t, so Δ_c = t_c (1 − ½^τ):
    client 1 (t = 1): Δ = 0.5, d = 0.5 / 1 = 0.5; client 2 (t = 2): Δ = 1.75, d = 1.75 / 3.
    τ_eff = ¼·1 + ¾·3 = 2.5; Σ p d = 0.125 + 0.4375 = 0.5625; x ← 0 + 2.5 · 0.5625 = 1.40625
    (FedAvg: ¼·0.5 + ¾·1.75 = 1.4375)."""
    cfg = FedNovaConfig(local_epochs=1, batch_size=1, client_optimizer={"lr": 0.5})
    broadcast = Message({"weight": torch.tensor([[0.0]])})
    replies = {}
    for cid, (n, target) in enumerate([(1, 1.0), (3, 2.0)], start=1):
        client = FedNovaClient(_line, cfg, seed=0, gradient_fn=_quadratic(target))
        replies[cid] = client.run(broadcast, _ctx(n, cid))
    assert [r.config["tau"] for r in replies.values()] == [1, 3]
    assert [r.config["a"] for r in replies.values()] == [1.0, 3.0]
    torch.testing.assert_close(replies[1].arrays["weight"], torch.tensor([[0.5]]))
    torch.testing.assert_close(replies[2].arrays["weight"], torch.tensor([[1.75 / 3]]))

    model = _line()
    with torch.no_grad():
        model.weight.zero_()
    server = FedNovaAveraging(
        model, ServerOptimizerConfig().build(), replies_are_gradients=False, weighting="samples"
    )
    metrics = server.aggregate_round(1, replies)
    assert metrics["tau_eff"] == pytest.approx(2.5)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.40625]]))


def test_momentum_normalizer_matches_torch_sgd_on_a_linear_loss():
    """With a constant gradient g = 1, τ momentum-SGD steps move w by −η·a(τ, ρ) exactly
    (torch's SGD: buf ← ρ·buf + g, w ← w − η·buf); a(3, ½) = 1 + 1.5 + 1.75 = 4.25 by hand."""
    assert normalizer(3, 0.5) == pytest.approx(4.25)
    assert normalizer(7) == 7.0
    for tau, rho in [(1, 0.9), (4, 0.5), (9, 0.9)]:
        cfg = FedNovaConfig(
            local_epochs=1, batch_size=1, client_optimizer={"lr": 0.1, "momentum": rho}
        )
        client = FedNovaClient(
            _line, cfg, seed=0, gradient_fn=lambda m, b, c, k: (None, {"weight": torch.ones(1, 1)})
        )
        reply = client.run(Message({"weight": torch.tensor([[0.0]])}), _ctx(tau))
        a = reply.config["a"]
        assert reply.config["tau"] == tau and a == pytest.approx(normalizer(tau, rho))
        # the client sends Δ / a = −η: momentum's extra weight is divided out
        torch.testing.assert_close(
            reply.arrays["weight"], torch.tensor([[-0.1]]), rtol=1e-5, atol=1e-6
        )


def test_equal_local_work_is_fedavg_within_float_rounding(tiny):
    """Every client runs max_steps = 3 steps (iid, ≥ 3 batches each): a_i = 3 = τ_eff, so FedNova's
    update is FedAvg's. Not bit for bit: the client divides Δ by 3 and the server multiplies the
    mean by τ_eff = Σ p_i·3, two float32/float64 roundings FedAvg does not do."""
    _, plain, w_plain = _train(tiny, name="fedavg", max_steps=3)
    _, nova, w_nova = _train(tiny, name="fednova", max_steps=3)
    assert [x["tau_eff"] for x in nova] == pytest.approx([3.0, 3.0])
    assert w_plain.keys() == w_nova.keys()
    for k in w_plain:
        torch.testing.assert_close(w_nova[k], w_plain[k], rtol=1e-5, atol=1e-6)
    for p, n in zip(plain, nova, strict=True):
        assert n["train_loss"] == pytest.approx(p["train_loss"], rel=1e-5)


def test_unequal_local_work_differs_from_fedavg(tiny):
    _, _, w_plain = _train(tiny, rounds=1, name="fedavg")
    _, nova, w_nova = _train(tiny, rounds=1, name="fednova", local_epochs_range=[1, 4])
    assert any(not torch.allclose(w_plain[k], w_nova[k], atol=1e-4) for k in w_plain)
    assert nova[0]["tau_eff"] > 0


def test_drawn_epochs_are_a_pure_function_of_seed_round_client():
    draws = [drawn_local_epochs(7, rnd, cid, 1, 5) for rnd in range(1, 5) for cid in range(50)]
    assert draws == [drawn_local_epochs(7, r, c, 1, 5) for r in range(1, 5) for c in range(50)]
    assert set(draws) == {1, 2, 3, 4, 5}  # 200 draws cover the range
    assert draws != [drawn_local_epochs(8, r, c, 1, 5) for r in range(1, 5) for c in range(50)]
    assert {drawn_local_epochs(0, 1, c, 3, 3) for c in range(20)} == {3}


def test_client_runs_its_drawn_epochs(tiny):
    """A client with 4 samples and batch size 1 runs 4·E steps, E its drawn epochs."""
    cfg = FedNovaConfig(batch_size=1, local_epochs_range=[1, 5], client_optimizer={"lr": 0.1})
    client = FedNovaClient(_line, cfg, seed=3, gradient_fn=_quadratic(1.0))
    for rnd, cid in [(1, 0), (1, 1), (2, 0), (5, 9)]:
        reply = client.run(Message({"weight": torch.tensor([[0.0]])}), _ctx(4, cid, rnd))
        assert reply.config["tau"] == 4 * drawn_local_epochs(3, rnd, cid, 1, 5)
    # and a whole run is reproducible
    _, a, wa = _train(tiny, rounds=2, name="fednova", local_epochs_range=[1, 3])
    _, b, wb = _train(tiny, rounds=2, name="fednova", local_epochs_range=[1, 3])
    assert [x["tau_eff"] for x in a] == [x["tau_eff"] for x in b]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_config_refuses_what_the_normalizer_cannot_describe():
    with pytest.raises(ValueError, match="local_epochs_range"):
        FedNovaConfig(local_epochs_range=[3, 1])
    with pytest.raises(ValueError, match="client_optimizer.name=sgd"):
        FedNovaConfig(client_optimizer={"name": "adam"})
    with pytest.raises(ValueError, match="state=fresh"):
        FedNovaConfig(client_optimizer={"momentum": 0.9, "state": "persistent"})


def test_secure_aggregation_and_dp_are_refused_by_name(tiny):
    with pytest.raises(ConfigError, match="secure_aggregation"):
        build_run(load_config(tiny(method={"name": "fednova", "secure_aggregation": True})))
    dp = {"mechanism": "gaussian", "noise_multiplier": 0.5, "clip": 1.0}
    with pytest.raises(ConfigError, match="DP"):
        build_run(load_config(tiny(method={"name": "fednova"}, privacy=dp)))


def test_freezing_composes(tiny):
    built, _, after = _train(tiny, rounds=1, name="fednova", freeze=["features.fc1"])
    assert built.method.applied == ("freeze",)
    before = built.model_fn().state_dict()
    frozen = [k for k in before if k.startswith("features.fc1.")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)


def test_a_reply_without_its_normalizer_is_refused():
    server = FedNovaAveraging(
        _line(), ServerOptimizerConfig().build(), replies_are_gradients=False, weighting="samples"
    )
    reply = Message({"weight": torch.zeros(1, 1)}, config={"num_samples": 3, "tau": 2})
    with pytest.raises(MessageError, match="a=None"):
        server.aggregate_round(1, {0: reply})
