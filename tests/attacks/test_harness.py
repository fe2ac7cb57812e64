"""Observing a run through the real engine: what the aggregation server of EPPFL reads of
each device's masked upload."""

from __future__ import annotations

import warnings

from fedge.attacks.harness import attack_config, observe_run
from fedge.attacks.reconstruct_run import reconstruction_attack


def _observe(method: dict, privacy: dict | None = None, parties: tuple[str, ...] = (), **kw):  # noqa: ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return observe_run(
            attack_config(method, privacy=privacy, dataset="digits", **kw), parties=parties
        )


def test_eppfl_aggregation_server_view_is_the_device_gradient_unmasked_and_noise_masked() -> None:
    """Oracle (method.masks=false): S_a's decoded upload −(W_c − W_c⁰)/η is the autograd
    gradient of the full model's loss on the device's one sample w.r.t. M_c (one SGD step;
    momentum's first step is plain SGD). With the masks: uniform ring elements, no better
    than the mean image."""
    import torch
    import torch.nn.functional as F

    method = {"name": "eppfl", "local_epochs": 1, "batch_size": 1}
    run = _observe({**method, "masks": False}, clients=2, per_client=1, parties=("edge",))
    views = run.views
    assert len(views) == 2 and not any(v.masked for v in views)
    for v in views:
        model = run.built.model_fn()
        model.load_state_dict({**model.state_dict(), **v.model})
        d = run.built.clients[v.cid]
        params = dict(model.named_parameters())
        g = torch.autograd.grad(
            F.cross_entropy(model(d.x[d.indices]), d.y[d.indices]), [params[n] for n in v.upload]
        )
        for (n, up), gn in zip(v.upload.items(), g, strict=True):
            torch.testing.assert_close(
                -up / run.built.method_config.lr, gn, rtol=1e-3, atol=1e-5, msg=n
            )
    masked = _observe(method, clients=2, per_client=1, parties=("edge",))
    assert all(v.masked for v in masked.views) and len(masked.views) == 2
    s = reconstruction_attack(masked, iterations=40)
    assert s["masked"] and s["attacks"]["dlg"]["median_mse"] > s["baseline_mean_image_mse"]
