"""Data reconstruction against an observed run: every client's round-1 upload attacked the way
a server that knows the public protocol would, with the target the upload's kind calls for
(:func:`~fedge.attacks.harness.upload_of`: a gradient, −Δ/η for a one-step model delta, BAFFLE's K
loss differences matched directly or through the Stein estimate, the masked vector under secure
aggregation) and the optimizer of DLG (Zhu, Liu, Han, NeurIPS 2019) or Inverting Gradients
(Geiping et al., NeurIPS 2020), :mod:`fedge.attacks.reconstruct`; each reconstruction scored by
pixel MSE against the client's local set beside the mean-image and mid-gray baselines
(:mod:`fedge.attacks.images`). :func:`reconstruct_data` attacks what leaks of a config's round 1:
the uploads, or the activations a method releases to an edge server
(:func:`~fedge.attacks.inversion.activation_inversion`). See docs/privacy/attacks.md.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from fedge.attacks.harness import ObservedRun, observe_run, upload_batch, upload_of
from fedge.attacks.images import (
    baseline_mse,
    match_images,
    mean_image,
    mid_gray,
    pixel_box,
    pixel_mse,
)
from fedge.attacks.inversion import activation_inversion
from fedge.attacks.observe import ServerView
from fedge.attacks.reconstruct import (
    GradientTarget,
    baffle_projection,
    direction_sum,
    idlg_labels,
    invert,
    invert_ig,
    seeded_directions,
)
from fedge.core.config import RunConfig
from fedge.core.errors import ConfigError
from fedge.core.rng import Draws, generator
from fedge.experiment.build import privacy_config
from fedge.methods import get_method
from fedge.methods.base import unpack_model_arrays
from fedge.methods.replay import perturbed_params

__all__ = ["rebuilt_direction_sum", "reconstruct_data", "reconstruction_attack"]


def _warn_delta_is_not_a_gradient(name: str, built: Any, views: list[Any]) -> None:
    """−Δ/η, the target DLG matches for a model delta, is the client's gradient only after one
    plain SGD step; warn (naming why) when the observed run's client did more, so the figure is
    read as an attack on an approximation, not as what the upload would give a better attack."""
    if upload_of(built) != "delta":
        return
    mcfg = built.method_config
    opt = mcfg.client_optimizer
    n = max(len(built.clients[v.cid].indices) for v in views)
    steps = mcfg.local_epochs * -(-n // mcfg.batch_size)
    if mcfg.max_steps is not None:
        steps = min(steps, mcfg.max_steps)
    why = [
        w
        for w, bad in (
            (f"client optimizer {opt.name}", opt.name != "sgd"),
            (f"weight decay {opt.weight_decay:g}", opt.weight_decay > 0),
            ("a client optimizer state kept across rounds", opt.state == "persistent"),
            (f"{steps} local steps (momentum {opt.momentum:g})", steps > 1),
        )
        if bad
    ]
    if why:
        warnings.warn(
            f"the attacked {name} uploads are deltas of {', '.join(why)}: −Δ/η is then not the gradient DLG "
            "matches, so the reconstruction figures attack an approximation (one plain SGD step per upload, e.g. "
            "method.max_steps=1 and an SGD client optimizer without momentum, makes it exact)",
            UserWarning,
            stacklevel=3,
        )


def _targets(
    name: str,
    view: ServerView,
    model: torch.nn.Module,
    mcfg: Any,
    masks: dict[str, torch.Tensor] | None = None,
    *,
    clipped: bool = False,
    draws: Draws = "torch",
) -> Iterator[tuple[str, Any, bool]]:
    """(attack name, target, whether iDLG may read the label) for one upload; ``clipped``: the
    run's clients clip their uploads (DP), so BAFFLE's K values come at an unknown scale;
    ``draws``: the run's generator of seeded draws (BAFFLE's directions are rebuilt with it)."""
    params = dict(model.named_parameters())
    upload = get_method(name).upload(mcfg)
    if upload == "edge_activations":
        # S_a's view: W_c − W_c⁰ after one SGD step (momentum's first step is plain SGD): −η∇L
        yield (
            "dlg",
            GradientTarget({n: -v / mcfg.lr for n, v in view.upload.items() if n in params}),
            True,
        )
    elif upload == "gradient":
        yield "dlg", GradientTarget({n: v for n, v in view.upload.items() if n in params}), True
    elif upload in ("delta", "estimate_delta"):
        # a model delta: −Δ/η is the gradient for one SGD step (baffle epoch: of its estimates)
        lr = mcfg.client_optimizer.lr
        yield (
            "dlg",
            GradientTarget({n: -v / lr for n, v in view.upload.items() if n in params}),
            True,
        )
    elif upload == "ciphertext":  # a ciphertext read as if it were the plaintext gradient
        yield "dlg", GradientTarget({n: v for n, v in view.upload.items() if n in params}), True
    elif upload == "loss_differences":
        seed = view.config.get("seed")
        if not isinstance(seed, int):
            raise ConfigError("the observed BAFFLE broadcast carries no seed")
        names = list(params) if mcfg.perturb is None else None
        if names is None:
            raise ConfigError(
                "the harness attacks BAFFLE with method.perturb=null (all parameters)"
            )
        shapes = {n: params[n].shape for n in names}
        proj = baffle_projection(
            shapes,
            view.upload["dL"],
            sigma=mcfg.sigma,
            seed=seed,
            scheme=mcfg.scheme,
            directions=mcfg.directions,
            masks=masks,
            draws=draws,
        )
        yield "baffle-k", proj, False
        if clipped:
            yield "baffle-k-fit", replace(proj, fit_scale=True), False
        # the Stein estimate ĝ = (1/K) Σ t_k z_k (Eq. 6), exactly what the server forms
        stein = direction_sum(proj.directions, proj.t, proj.t.numel())
        yield "baffle-stein", GradientTarget(stein), True
    elif upload == "seed_scalars":
        yield (
            "dlg-seed-sum",
            GradientTarget(rebuilt_direction_sum(name, view, model, mcfg, draws)),
            True,
        )
    else:
        raise ConfigError(
            f"no reconstruction attack for method {name!r} with this configuration: its uploads are "
            f"{upload or 'nothing an observer reads'}, which the harness does not attack (for a zeroth-order "
            "method set method.mode=batch, whose K loss differences it does)"
        )


def rebuilt_direction_sum(
    name: str, view: ServerView, model: torch.nn.Module, mcfg: Any, draws: Draws = "torch"
) -> dict[str, torch.Tensor]:
    """What a seed-and-scalar client's upload (``seed_scalars``: FedKSeed, DeComFL, FeedSign)
    gives a server that knows the public seeds: D = (1/per) Σ_k t_k z_k over ``model``'s
    trainable parameters, the directions regenerated as for BAFFLE's batch mode
    (:func:`~fedge.attacks.reconstruct.seeded_directions`); the client's model change is −η D
    (:class:`~fedge.methods.spec.SeedScalars`), so DLG matches D as the gradient."""
    read = get_method(name).seed_scalars
    if read is None:
        raise ConfigError(f"method {name!r} declares seed_scalars uploads but no reader of them")
    s = read(mcfg, view.config, view.upload, draws)
    shapes = {n: p.shape for n, p in perturbed_params(model, None).items()}
    z = seeded_directions(shapes, s.t.numel(), s.seed, "gaussian", draws=s.draws)
    return direction_sum(z, s.t, s.per)


def _per_block(
    on_iterations: Callable[[str, int, int, int, int], None],
    attack: str,
    upload: int,
    uploads: int,
    iterations: int,
) -> Callable[[int], None]:
    """``on_iterations`` of one attack on one upload, as an optimizer's ``on_block(done)``."""
    return lambda done: on_iterations(attack, upload, uploads, done, iterations)


def reconstruction_attack(
    run: ObservedRun,
    *,
    iterations: int = 300,
    samples: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    optimizer: str = "dlg",
    on_iterations: Callable[[str, int, int, int, int], None] | None = None,
) -> dict[str, Any]:
    """Attack every observed upload of round 1 (at most ``samples`` clients); returns the
    per-attack median/mean MSE, PSNR and label accuracy, baselines, and per-client results.
    ``optimizer``: ``dlg`` (L2 matching, L-BFGS) or ``ig`` (Inverting Gradients: cosine + TV,
    Adam, projected onto the pixel box [0, 1]; attack names get ``ig`` / ``-ig``).

    ``progress(done, total)``: after each upload. ``on_iterations(attack, upload, uploads,
    done, iterations)``: inside upload ``upload`` (1-based) of ``uploads``, after every block of
    :data:`~fedge.attacks.reconstruct.BLOCK` iterations of ``attack``."""
    if optimizer not in ("dlg", "ig"):
        raise ConfigError(f"optimizer {optimizer!r}; expected 'dlg' or 'ig'")
    built = run.built
    ds = built.dataset
    name = built.config.method.name
    views = [v for v in run.views if v.rnd == 1][: samples or None]
    if not views:
        raise ConfigError("no upload observed in round 1: nothing to attack")
    model = built.model_fn()
    shape, classes = tuple(ds.input_shape), ds.num_classes
    _warn_delta_is_not_a_gradient(name, built, views)
    mean_img = mean_image(built)
    gray = mid_gray(ds, mean_img)
    box = pixel_box(ds)
    results: dict[str, list[dict[str, Any]]] = {}
    base_mean, base_gray, base_typical = [], [], []
    for i, view in enumerate(views):
        data = built.clients[view.cid]
        x_true, y_true = data.x[data.indices], data.y[data.indices]
        state = model.state_dict()
        masks = None
        if upload_of(built) != "seed_scalars":  # else no model was sent: the seeded initial one
            dense, masks = unpack_model_arrays(
                dict(view.model), state, who="the observed broadcast"
            )
            model.load_state_dict({k: dense.get(k, v) for k, v in state.items()})
        model.train()
        b = upload_batch(built.method_config, x_true.shape[0])
        base_mean += baseline_mse(mean_img, b, x_true, ds)
        base_gray += baseline_mse(gray, b, x_true, ds)
        base_typical.append(
            float(pixel_mse(mean_img.expand_as(x_true), x_true, ds.mean, ds.std).mean())
        )
        clipped = privacy_config(built.config).enabled
        for attack, target, idlg in _targets(
            name, view, model, built.method_config, masks, clipped=clipped, draws=built.config.draws
        ):
            labels = (
                idlg_labels(target.grads, model)
                if idlg and b == 1 and isinstance(target, GradientTarget)
                else None
            )
            gen = generator(seed, "attack", attack, view.rnd, view.cid)
            if optimizer == "ig":
                attack = "ig" if attack == "dlg" else f"{attack}-ig"
            on_block = (
                None
                if on_iterations is None
                else _per_block(on_iterations, attack, i + 1, len(views), iterations)
            )
            if optimizer == "ig":
                rec = invert_ig(
                    model,
                    target,
                    input_shape=shape,
                    num_classes=classes,
                    batch=b,
                    labels=labels,
                    iterations=iterations,
                    bounds=box,
                    generator=gen,
                    on_block=on_block,
                )
            else:
                rec = invert(
                    model,
                    target,
                    input_shape=shape,
                    num_classes=classes,
                    batch=b,
                    labels=labels,
                    iterations=iterations,
                    generator=gen,
                    on_block=on_block,
                )
            matched = match_images(rec.x, x_true, ds)
            label_hits = sum(int(rec.labels[j] == y_true[at]) for j, (_, at) in enumerate(matched))
            results.setdefault(attack, []).append(
                {
                    "cid": view.cid,
                    "mse": [m for m, _ in matched],
                    "label_accuracy": label_hits / b,
                    "match_loss": rec.loss,
                    "masked": view.masked,
                    "x": rec.x,
                    "truth": torch.stack([x_true[at] for _, at in matched]),
                }
            )
        if progress is not None:
            progress(i + 1, len(views))
    summary: dict[str, Any] = {
        "method": name,
        "clients_attacked": len(views),
        "iterations": iterations,
        "masked": any(v.masked for v in views),
        "baseline_mean_image_mse": statistics.median(base_mean),
        "baseline_mid_gray_mse": statistics.median(base_gray),
        # the mean image against a typical local image, not the closest one (~0.087 on Fashion-MNIST)
        "baseline_mean_image_mse_typical": statistics.median(base_typical),
        "attacks": {},
    }
    for attack, rows in results.items():
        all_mse = [m for r in rows for m in r["mse"]]
        med = statistics.median(all_mse)
        summary["attacks"][attack] = {
            "median_mse": med,
            "mean_mse": statistics.fmean(all_mse),
            "median_psnr_db": 10 * math.log10(1 / med) if med > 0 else float("inf"),
            "label_accuracy": statistics.fmean(r["label_accuracy"] for r in rows),
            # share of clients whose target gave a finite matching loss at all (ciphertext read
            # as floats does not: the "reconstruction" is then the dummy start, not an attack's result)
            "finite_objective": statistics.fmean(
                float(math.isfinite(r["match_loss"])) for r in rows
            ),
            "clients": [{k: v for k, v in r.items() if k not in ("x", "truth")} for r in rows],
        }
    summary["_images"] = {
        a: (torch.cat([r["truth"] for r in rows]), torch.cat([r["x"] for r in rows]))
        for a, rows in results.items()
    }
    return summary


def reconstruct_data(
    cfg: RunConfig,
    *,
    iterations: int = 300,
    samples: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    optimizer: str = "dlg",
    on_iterations: Callable[[str, int, int, int, int], None] | None = None,
) -> tuple[ObservedRun, dict[str, Any]]:
    """Round 1 of ``cfg`` observed (:func:`~fedge.attacks.harness.observe_run`) and the
    clients' data reconstructed from what leaks: each upload at the server
    (:func:`reconstruction_attack`), or, for a method whose clients release activations to an
    edge server (and send the server only a masked model), those activations inverted
    (:func:`~fedge.attacks.inversion.activation_inversion`; ``optimizer`` and
    ``on_iterations`` do not apply)."""
    edge = upload_of(cfg) == "edge_activations"
    run = observe_run(cfg, parties=("edge",) if edge else ())
    if edge:
        result = activation_inversion(
            run, iterations=iterations, samples=samples, seed=seed, progress=progress
        )
    else:
        result = reconstruction_attack(
            run,
            iterations=iterations,
            samples=samples,
            seed=seed,
            progress=progress,
            optimizer=optimizer,
            on_iterations=on_iterations,
        )
    return run, result
