"""The ``fedzo-fmnist-lenet`` preset runs FedZO's update rule (Fang et al., IEEE TSP 2022,
Algorithm 1) through BAFFLE's epoch mode: one client, one local step is one zeroth-order SGD
step on b1 samples with b2 forward differences, computed here by hand, and the server's model
moves by exactly that client's delta; H steps a round and b2 directions a step."""

import copy

import pytest
import torch
import torch.nn.functional as F

import fedge.methods.baffle.epoch as epoch
from fedge.core.config import load_config
from fedge.estimators.directions import make_directions
from fedge.experiment.build import build_run
from fedge.methods.base import model_arrays


@pytest.mark.usefixtures("fake_fashion_mnist")
def test_the_preset_says_fedzo():
    m = build_run(load_config("fedzo-fmnist-lenet")).method_config.model_dump()
    assert (m["mode"], m["k"], m["batch_size"], m["max_steps"], m["scheme"]) == (
        "epoch",
        20,  # b2 directions a step
        20,  # b1 samples a step
        5,  # H local steps
        "forward",  # f(x + μv) − f(x)
    )
    assert m["clip"] is None and m["ema"] is None
    assert m["client_optimizer"]["name"] == "sgd" and m["client_optimizer"]["momentum"] == 0
    assert m["server_optimizer"]["name"] == "sgd" and m["server_optimizer"]["lr"] == 1.0


@pytest.mark.usefixtures("fake_fashion_mnist")
def test_one_client_one_step_is_a_hand_computed_zo_sgd_step(monkeypatch):
    """w_1 = w_0 − η/(b2·σ) Σ_k [L(w_0 + σz_k; B) − L(w_0; B)] z_k, z_k drawn from the step's
    seed, B the step's b1 samples (both recorded as the client computes them)."""
    calls = []
    real = epoch.zeroth_order_gradient

    def spy(model, loss_fn, batch, spec, *, seed, params, masks):
        calls.append((copy.deepcopy(model), batch, seed, list(params)))
        return real(model, loss_fn, batch, spec, seed=seed, params=params, masks=masks)

    monkeypatch.setattr(epoch, "zeroth_order_gradient", spy)
    overrides = {
        "rounds": 1,
        "clients.num": 1,
        "clients.per_round": 1,
        "method.max_steps": 1,
        "dataset.limit_train": 100,
        "dataset.limit_test": 50,
        "measure.flops": False,
    }
    cfg = load_config("fedzo-fmnist-lenet", overrides=[f"{k}={v}" for k, v in overrides.items()])
    run = build_run(cfg)
    sim = run.simulation()
    w0 = model_arrays(sim.strategy.model)
    sim.run_round(1)
    w1 = model_arrays(sim.strategy.model)
    sim.close()

    assert len(calls) == 1  # H = 1 here: one step, one estimate
    model, (x, y), seed, names = calls[0]
    m = run.method_config
    k, sigma, eta = m.k, m.sigma, m.client_optimizer.lr
    assert len(x) == 20  # b1
    params = dict(model.named_parameters())
    dirs = make_directions("gaussian", {n: params[n].shape for n in names}, k, draws=cfg.draws)
    z = [{n: dirs.draw(seed, [j], n, params[n].shape)[0] for n in names} for j in range(k)]
    with torch.no_grad():
        base = float(F.cross_entropy(model(x), y))
        g = {n: torch.zeros_like(params[n], dtype=torch.float64) for n in names}
        for zj in z:
            m = copy.deepcopy(model)
            for n, p in m.named_parameters():
                if n in zj:
                    p.add_(zj[n], alpha=sigma)
            diff = float(F.cross_entropy(m(x), y)) - base
            for n in names:
                g[n] += diff / (k * sigma) * zj[n].double()
    for n in names:
        want = w0[n].double() - eta * g[n]
        err = float((w1[n].double() - want).norm() / (w0[n].double() - want).norm())
        assert err < 1e-2, (n, err)  # float32 forwards, batched differently
    untouched = [n for n in w0 if n not in names]
    assert all(torch.equal(w0[n], w1[n]) for n in untouched)  # no buffers move
