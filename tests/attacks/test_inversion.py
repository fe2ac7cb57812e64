"""Activation inversion (EPPFL's edge-server view) against the true input and through the real engine."""

from __future__ import annotations

import warnings

import torch

from fedge.attacks.inversion import invert_activations
from fedge.methods.eppfl.split import activation_positions


def _device() -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(1, 8, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.3)
        conv.bias.zero_()
    return torch.nn.Sequential(conv, torch.nn.Tanh())


def test_exact_kept_activations_invert_to_the_input_and_noise_defeats_it() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 1, 8, 8, generator=g)  # inputs in the pixel box [0, 1]
    dev = _device()
    pos = activation_positions(7, (2, 8, 64), 48)  # θ_a = 0.75
    with torch.no_grad():
        released = dev(x).reshape(2, 8, 64).gather(-1, pos)
    box = (torch.zeros(1), torch.ones(1))
    rec = invert_activations(
        dev,
        released,
        input_shape=(1, 8, 8),
        positions=pos,
        bounds=box,
        iterations=400,
        generator=torch.Generator().manual_seed(2),
    )
    mse = ((rec.x - x) ** 2).mean().item()
    baseline = ((x.mean(0, keepdim=True) - x) ** 2).mean().item()  # the batch's own mean image
    assert mse < baseline / 100 and rec.loss < 1e-3
    noisy = released + 5.0 * torch.randn(released.shape, generator=g)
    bad = invert_activations(
        dev,
        noisy,
        input_shape=(1, 8, 8),
        positions=pos,
        bounds=box,
        iterations=400,
        generator=torch.Generator().manual_seed(2),
    )
    assert ((bad.x - x) ** 2).mean().item() > 10 * mse


def _eppfl(dp: dict | None):  # type: ignore[no-untyped-def]
    from fedge.attacks.harness import attack_config, observe_run
    from fedge.attacks.inversion import activation_inversion

    cfg = attack_config(
        {"name": "eppfl", "local_epochs": 1, "batch_size": 1, "dp": dp},
        clients=2,
        per_client=1,
        dataset="digits",
        model="lenet",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(cfg, parties=("edge",))
    return run, activation_inversion(run, iterations=300)


def test_edge_server_view_is_recorded_and_inverted_without_dp() -> None:
    run, r = _eppfl(None)
    ops = [(p.key, p.message.config.get("op")) for p in run.party_records]
    for cid in (
        0,
        1,
    ):  # one batch, one epoch: S_a loads M_s, the device steps once, S_a collects M_s
        assert [op for k, op in ops if k == cid] == ["load", "step", "upload"]
    step = next(p.message for p in run.party_records if p.message.config.get("op") == "step")
    assert step.arrays["a"].shape == (
        1,
        16,
        64,
    )  # lenet's first conv output on 8x8 digits: what the device sent
    a = r["attacks"]["eppfl-inversion"]
    assert a["median_mse"] < r["baseline_mean_image_mse"] / 100


def test_laplace_noise_on_the_activations_leaves_no_better_than_the_mean_image() -> None:
    _, r = _eppfl({"epsilon": 1.0, "clip": 10.0})
    assert r["epsilon"] == 1.0
    assert r["attacks"]["eppfl-inversion"]["median_mse"] > r["baseline_mean_image_mse"]
