"""FedProx against its oracles: μ = 0 is FedAvg bit for bit; its gradient is autograd's of the
full objective F + μ/2‖w − w_t‖²; a hand-computed two-step example; and secure aggregation,
DP and freezing compose onto it by configuration alone."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedge.core.config import load_config
from fedge.core.context import ClientContext, ClientData
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.experiment.build import build_run
from fedge.methods.fedprox import proximal_gradient_fn
from fedge.methods.local import ClientOptimizerConfig, LocalTraining, backprop_gradient_fn


def _cfg(tiny, privacy=None, **method):
    base = {"local_epochs": 2, "batch_size": 8, "client_optimizer": {"lr": 0.1}}
    extra = {"privacy": privacy} if privacy else {}
    return load_config(tiny(method={**base, **method}, **extra))


def _train(tiny, rounds=2, **method):
    built = build_run(_cfg(tiny, **method))
    sim = built.simulation()
    lines = [sim.run_round(r) for r in range(1, rounds + 1)]
    sim.close()
    return built, lines, sim.strategy.eval_model().state_dict()


def _ctx(x, y, **kw):
    return ClientContext(
        cid=0,
        rnd=1,
        data=ClientData(x, y, torch.arange(len(y))),
        generator=torch.Generator().manual_seed(0),
        meter=Meter(),
        **kw,
    )


def test_mu_zero_is_fedavg_bit_for_bit(tiny):
    _, plain, w_plain = _train(tiny, name="fedavg")
    _, prox, w_prox = _train(tiny, name="fedprox", mu=0.0)
    timing = ("wall", "_s")
    strip = [{k: v for k, v in x.items() if not any(t in k for t in timing)} for x in plain]
    assert strip == [{k: v for k, v in x.items() if not any(t in k for t in timing)} for x in prox]
    assert w_plain.keys() == w_prox.keys()
    assert all(torch.equal(w_plain[k], w_prox[k]) for k in w_plain)


def test_mu_moves_the_model(tiny):
    _, _, w0 = _train(tiny, rounds=1, name="fedprox", mu=0.0)
    _, _, w1 = _train(tiny, rounds=1, name="fedprox", mu=1.0)
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)


def test_proximal_gradient_is_autograd_of_the_full_objective():
    """Oracle: autograd of F_k(w) + μ/2 Σ‖w − w_t‖² at a w away from w_t."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    w_t = {k: v.detach() + 0.3 * torch.randn_like(v) for k, v in model.named_parameters()}
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    mu = 0.7
    _, got = proximal_gradient_fn(mu)(model, (x, y), _ctx(x, y, global_arrays=w_t))
    params = dict(model.named_parameters())
    objective = F.cross_entropy(model(x), y) + mu / 2 * sum(
        (params[k] - w_t[k]).square().sum() for k in params
    )
    want = dict(zip(params, torch.autograd.grad(objective, list(params.values())), strict=True))
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)
    # and μ = 0 is the plain gradient function itself
    assert proximal_gradient_fn(0.0) is backprop_gradient_fn


def test_two_local_steps_by_hand():
    """F(w) = ½(w − a)² on one weight, SGD with rate η from w_t, μ = 0.5:
    step 1 at w_t: g = w_t − a (the proximal term is 0); step 2 at w_1: g = (w_1 − a) + μ(w_1 − w_t).
    With w_t = 1, a = 3, η = 0.1: w_1 = 1.2; g_2 = −1.8 + 0.1 = −1.7; w_2 = 1.37; Δ = 0.37."""
    a = 3.0

    def quadratic(model, batch, ctx, masks):
        w = model.weight
        return None, {"weight": (w.detach() - a).clone()}

    client = LocalTraining(
        lambda: torch.nn.Linear(1, 1, bias=False),
        local_epochs=2,
        batch_size=1,
        max_steps=2,
        optimizer=ClientOptimizerConfig(lr=0.1),
        gradient_fn=proximal_gradient_fn(0.5, base=quadratic),
    )
    x, y = torch.ones(1, 1), torch.zeros(1, dtype=torch.int64)
    reply = client.run(Message({"weight": torch.tensor([[1.0]])}), _ctx(x, y))
    torch.testing.assert_close(reply.arrays["weight"], torch.tensor([[0.37]]))


def test_secure_aggregation_composes_by_configuration(tiny):
    """Oracle: plain FedProx; the secure sum equals it up to the fixed-point step."""
    built, lines, w_secure = _train(tiny, rounds=1, name="fedprox", secure_aggregation=True)
    _, _, w_plain = _train(tiny, rounds=1, name="fedprox")
    assert built.method.applied == ("secure_aggregation",) and lines[0]["phases"] == 4
    for k in w_plain:
        assert float((w_plain[k] - w_secure[k]).abs().max()) < 1e-5


def test_dp_and_freezing_compose_by_configuration(tiny):
    dp = {"mechanism": "gaussian", "noise_multiplier": 0.5, "clip": 1.0}
    built = build_run(_cfg(tiny, dp, name="fedprox", mu=0.1, freeze=["features.fc1"]))
    assert built.method.applied == ("freeze", "dp")
    before = built.model_fn().state_dict()
    sim = built.simulation()
    line = sim.run_round(1)
    after = sim.strategy.eval_model().state_dict()
    assert line["epsilon"] > 0
    frozen = [k for k in before if k.startswith("features.fc1.")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in frozen)
