"""End to end through the real engine: observe round 1, reconstruct the clients' data from
what the server saw (DLG/iDLG, BAFFLE's K values, the Stein estimate), scored against the
baselines."""

from __future__ import annotations

import warnings

import pytest

from fedge.attacks.harness import attack_config, observe_run
from fedge.attacks.reconstruct_run import reconstruction_attack


def _attack(method: dict, iterations: int = 100) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(attack_config(method, clients=2, per_client=1, dataset="digits"))
    return reconstruction_attack(run, iterations=iterations)


def test_single_sample_fedsgd_leaks_the_image_and_label() -> None:
    s = _attack({"name": "fedsgd", "batch_size": 1})
    dlg = s["attacks"]["dlg"]
    assert dlg["median_mse"] < 1e-3 < s["baseline_mean_image_mse"]
    assert dlg["label_accuracy"] == 1.0
    assert s["_images"]["dlg"][1].shape == (2, 1, 8, 8)


def test_masked_baffle_upload_is_no_better_than_the_mean_image() -> None:
    s = _attack(
        {"name": "baffle", "mode": "batch", "k": 100}
    )  # EMA on: secure aggregation sits beneath it
    assert s["masked"]
    for attack in ("baffle-k", "baffle-stein"):
        assert s["attacks"][attack]["median_mse"] > s["baseline_mean_image_mse"]


def test_clear_baffle_k_values_leak_an_image_smaller_than_k() -> None:
    s = _attack(
        {"name": "baffle", "mode": "batch", "k": 100, "ema": None, "secure_aggregation": False}, 300
    )
    assert not s["masked"]
    assert s["attacks"]["baffle-k"]["median_mse"] < s["baseline_mean_image_mse"] / 4
    assert "baffle-k-fit" not in s["attacks"]  # no DP: the K values come at their own scale


def test_fedpt_delta_of_one_step_leaks_like_a_gradient() -> None:
    s = _attack(
        {
            "name": "fedpt",
            "freeze": "largest",
            "local_epochs": 1,
            "batch_size": 1,
            "client_optimizer": {"name": "sgd", "lr": 0.1},
        }
    )
    assert s["attacks"]["dlg"]["median_mse"] < s["baseline_mean_image_mse"] / 4


def test_ntk_baffle_k_values_are_projections_on_masked_directions() -> None:
    """Oracle: the client's true gradient projected on z_k ⊙ m equals the uploaded t_k."""
    import torch
    import torch.nn.functional as F

    from fedge.attacks.reconstruct_run import _targets
    from fedge.methods.base import unpack_model_arrays

    method = {
        "name": "ntk-baffle",
        "mode": "batch",
        "k": 32,
        "ema": None,
        "density": 0.5,
        "secure_aggregation": False,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(attack_config(method, clients=1, per_client=1, dataset="digits"))
    v = run.views[0]
    model = run.built.model_fn()
    dense, masks = unpack_model_arrays(dict(v.model), model.state_dict())
    assert masks and any(not bool(m.all()) for m in masks.values())
    model.load_state_dict({k: dense.get(k, x) for k, x in model.state_dict().items()})
    d = run.built.clients[v.cid]
    names = [n for n, _ in model.named_parameters()]
    g = dict(
        zip(
            names,
            torch.autograd.grad(
                F.cross_entropy(model(d.x[d.indices]), d.y[d.indices]), list(model.parameters())
            ),
            strict=True,
        )
    )
    proj = next(
        t
        for name, t, _ in _targets(
            "ntk-baffle", v, model, run.built.method_config, masks, draws=run.built.config.draws
        )
        if name == "baffle-k"
    )
    torch.testing.assert_close(proj.project(g), proj.t, rtol=2e-2, atol=2e-2)


def _observe(method: dict, privacy: dict | None = None, parties: tuple[str, ...] = (), **kw):  # noqa: ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return observe_run(
            attack_config(method, privacy=privacy, dataset="digits", **kw), parties=parties
        )


def test_dp_clips_what_the_server_sees_and_the_harness_fits_the_scale() -> None:
    """Central DP: each client's K values arrive clipped to L2 norm C (the clip is active at
    C = 1e-4), un-noised; the harness adds the scale-fitted K-value match and scores it."""
    import torch

    from fedge.attacks.reconstruct_run import _targets

    method = {"name": "baffle", "mode": "batch", "k": 32, "ema": None, "secure_aggregation": False}
    dp = {"mechanism": "gaussian", "clip": 1e-4, "noise_multiplier": 1.0}
    run = _observe(method, dp, clients=2, per_client=1)
    clear = _observe(method, clients=2, per_client=1)
    for v, c in zip(
        run.views, clear.views, strict=True
    ):  # the same client, the same seed: only the clip differs
        assert abs(float(v.upload["dL"].norm()) - 1e-4) < 1e-9 < float(c.upload["dL"].norm()) - 1e-4
        torch.testing.assert_close(v.upload["dL"], c.upload["dL"] * (1e-4 / c.upload["dL"].norm()))
    model = run.built.model_fn()
    names = [
        n
        for n, *_ in _targets("baffle", run.views[0], model, run.built.method_config, clipped=True)
    ]
    assert names == ["baffle-k", "baffle-k-fit", "baffle-stein"]
    s = reconstruction_attack(run, iterations=40)
    assert {"baffle-k", "baffle-k-fit", "baffle-stein"} == set(s["attacks"])
    fit = s["attacks"]["baffle-k-fit"]["clients"]
    # relative residual after the best scale: better than orthogonal (≥ 0 up to float32 roundoff of 1 − cos²)
    assert all(-1e-6 <= c["match_loss"] < 1 for c in fit)


def test_dlg_on_deltas_warns_when_the_delta_is_not_one_plain_sgd_step() -> None:
    """−Δ/η is the gradient only after one plain SGD step: no warning for the leakage table's
    FedAvg row (batch 1, SGD); a warning naming the steps and momentum for a 2-step momentum run."""
    exact = _observe(
        {
            "name": "fedavg",
            "local_epochs": 1,
            "batch_size": 1,
            "client_optimizer": {"name": "sgd", "lr": 0.1},
        },
        clients=2,
        per_client=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reconstruction_attack(exact, iterations=20)
    approx = _observe(
        {
            "name": "fedavg",
            "local_epochs": 1,
            "batch_size": 1,
            "client_optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        },
        clients=2,
        per_client=2,
    )
    with pytest.warns(
        UserWarning,
        match=r"deltas of 2 local steps \(momentum 0.9\): −Δ/η is then not the gradient",
    ):
        reconstruction_attack(approx, iterations=20)


def test_batch_baselines_are_scored_like_the_attack() -> None:
    """The mean-image baseline of a batch of 2 is 2 copies of it matched one to one: the mean
    image against each of the client's 2 images, not twice against the closer one."""
    import statistics

    from fedge.attacks.images import mean_image, pixel_mse

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = observe_run(
            attack_config(
                {"name": "fedsgd", "batch_size": 2}, clients=2, per_client=2, dataset="digits"
            )
        )
    s = reconstruction_attack(run, iterations=20)
    ds, mean_img = run.built.dataset, mean_image(run.built)
    each = [
        float(v)
        for c in run.built.clients
        for v in pixel_mse(mean_img.expand(2, -1, -1, -1), c.x[c.indices], ds.mean, ds.std)
    ]
    assert s["baseline_mean_image_mse"] == pytest.approx(statistics.median(each))
    assert (
        len({tuple(t.flatten().tolist()) for t in s["_images"]["dlg"][0][:2]}) == 2
    )  # two distinct truths
