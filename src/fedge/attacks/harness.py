"""One short instrumented run, the reconstruction attack on every client's upload, baselines.

:func:`observe_run` builds a run from a config (:func:`fedge.experiment.build.build_run`),
wraps its strategy in an :class:`~fedge.attacks.observe.Observer` and runs the given rounds
through the real engine. :func:`reconstruction_attack` reads each client's upload with
:func:`~fedge.attacks.observe.server_views` and attacks it the way a server that knows the
public protocol (method, K, σ, scheme, directions, client learning rate) would:

- fedsgd: the upload is the gradient → DLG on it;
- fedavg: the upload is a model delta; with one local SGD step at rate η it is −η∇L, so the
  target is −Δ/η (exact for one step, an approximation for more);
- baffle (batch mode): the upload is K loss differences, with the model and seed broadcast:
  ``baffle-k`` matches the K values directly, ``baffle-stein`` runs DLG on the Stein
  estimate ĝ (Eq. 6);
- under secure aggregation the same is done to the masked vector the server receives;
- under DP (``privacy.mechanism`` on) each client clips its upload to L2 norm ``privacy.clip``
  before it leaves (the noise is added to the sum later, :mod:`fedge.methods.private`): the
  server sees clipped, un-noised values whose scale α = min(1, C/‖upload‖) it does not know.
  For BAFFLE it also tries ``baffle-k-fit``: the K-value match with that scale fitted in
  closed form (:class:`~fedge.attacks.reconstruct.ProjectionTarget` ``fit_scale``);
- eppfl: the aggregation server S_a receives each device's M_c in the fixed-point ring under
  the randomness server's additive mask; it decodes it as the plaintext would be
  (:func:`eppfl_server_views`) and runs DLG on −(W_c − W_c⁰)/η (one local SGD step), as for a
  FedAvg delta. The edge server's view is :func:`activation_inversion` and :func:`edge_pia_attack`.

Ground truth: each client's local set. The metric is the MSE in [0, 1] pixel space between
each reconstructed image and an image of that client's local set (a batch's order is not
identifiable, and which samples a client drew is the client's secret): for one image the
closest local image; for a batch of B the one-to-one assignment of the B reconstructions to
B distinct local images with the least total MSE (:func:`match_images`), so one good
reconstruction cannot stand for several samples (closest-image matching let it, and flattered
batch attacks). The baselines are the training set's mean image and mid-gray, B copies of
each scored the same way. With local sets as small as the batch (:func:`attack_config`)
the local set is "the samples that were attacked".
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fedge.attacks.observe import Observer, PartyObserved, ServerView, observe_parties, server_views
from fedge.attacks.reconstruct import (
    GradientTarget,
    baffle_projection,
    idlg_labels,
    invert,
    invert_ig,
)
from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ConfigError
from fedge.core.rng import generator
from fedge.experiment.build import BuiltRun, build_run, method_config, privacy_config
from fedge.methods import get_method
from fedge.methods.base import unpack_model_arrays
from fedge.methods.spec import Upload

__all__ = [
    "activation_inversion",
    "attack_config",
    "edge_pia_attack",
    "eppfl_server_views",
    "LEAKAGE_ROWS",
    "leakage_table",
    "match_images",
    "observe_run",
    "ObservedRun",
    "one_batch_clients",
    "pia_attack",
    "pixel_mse",
    "reconstruction_attack",
    "released_activations",
    "upload_of",
]


def upload_of(run: BuiltRun | RunConfig) -> Upload | None:
    """What an observer of a run's uploads sees (its method's
    :attr:`~fedge.methods.spec.MethodSpec.upload`), from the built run or its config."""
    if isinstance(run, BuiltRun):
        return get_method(run.config.method.name).upload(run.method_config)
    return get_method(run.method.name).upload(method_config(run))


@dataclass
class ObservedRun:
    built: BuiltRun
    observer: Observer
    party_records: list[PartyObserved] = field(
        default_factory=list
    )  # side parties' inputs (observe_run parties=)

    @property
    def views(self) -> list[ServerView]:
        layout = None
        strategy: Any = self.observer.inner
        while (
            strategy is not None
        ):  # through wrappers (EMA, ...) to secure aggregation's flattening layout
            summands = getattr(strategy, "summands", None)
            if isinstance(summands, dict):
                layout = {n: shape for n, (shape, _) in summands.items()}
                break
            strategy = getattr(strategy, "inner", None)
        upload = upload_of(self.built)
        if upload == "edge_activations":
            return eppfl_server_views(self)
        sealed = None
        if upload == "ciphertext":  # the public protocol says the upload is a ciphertext
            sealed = {n: p.shape for n, p in self.built.model_fn().named_parameters()}
        return server_views(self.observer.records, layout, sealed)


def observe_run(
    cfg: RunConfig,
    rounds: int = 1,
    prepare: Callable[[BuiltRun], BuiltRun] | None = None,
    parties: tuple[str, ...] = (),
) -> ObservedRun:
    """Build ``cfg`` (then ``prepare`` it, e.g. to cut clients' local sets) and run ``rounds``
    rounds with every exchange recorded, and every message to the side ``parties`` named
    (e.g. EPPFL's ``edge``)."""
    built = build_run(cfg)
    if prepare is not None:
        built = prepare(built)
    observer = Observer(built.method.strategy)
    records: list[PartyObserved] = []
    spies = (
        observe_parties(built.method.parties, list(parties), records)
        if parties
        else built.method.parties
    )
    built = replace(built, method=replace(built.method, strategy=observer, parties=spies))
    sim = built.simulation()
    try:
        for t in range(1, rounds + 1):
            sim.run_round(t)
    finally:
        sim.close()
    return ObservedRun(built, observer, records)


def pixel_mse(
    a: torch.Tensor, b: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """Per-image MSE in [0, 1] pixel space of normalized images a, b of shape (B, C, H, W)."""
    s = torch.tensor(std).view(1, -1, 1, 1)
    m = torch.tensor(mean).view(1, -1, 1, 1)
    pa, pb = (a * s + m).clamp(0, 1), (b * s + m).clamp(0, 1)
    return ((pa - pb) ** 2).flatten(1).mean(1)


def _nearest(img: torch.Tensor, local: torch.Tensor, ds: Any) -> tuple[float, int]:
    """(pixel MSE, index) of the image of ``local`` closest to ``img`` (1, C, H, W)."""
    mse = torch.cat(
        [
            pixel_mse(img.expand(len(chunk), *img.shape[1:]), chunk, ds.mean, ds.std)
            for chunk in local.split(4096)
        ]
    )
    i = int(mse.argmin())
    return float(mse[i]), i


def match_images(recs: torch.Tensor, local: torch.Tensor, ds: Any) -> list[tuple[float, int]]:
    """(pixel MSE, index into ``local``) for each of the B images of ``recs`` (B, C, H, W).

    B = 1: the closest image of ``local``. B > 1: a one-to-one assignment of the B images to
    B distinct images of ``local`` minimizing the summed MSE (the Hungarian method,
    :func:`scipy.optimize.linear_sum_assignment`), the usual scoring of batch gradient
    inversion: matching each image to its closest independently lets one good reconstruction
    (or the batch's mean repeated B times) stand for every sample."""
    if len(recs) == 1:
        return [_nearest(recs, local, ds)]
    if len(recs) > len(local):
        raise ValueError(
            f"{len(recs)} reconstructions for a local set of {len(local)} images: "
            "a one-to-one assignment needs at most as many reconstructions as images"
        )
    from scipy.optimize import linear_sum_assignment  # noqa: PLC0415

    cost = torch.stack(
        [
            torch.cat(
                [
                    pixel_mse(r[None].expand(len(chunk), *r.shape), chunk, ds.mean, ds.std)
                    for chunk in local.split(4096)
                ]
            )
            for r in recs
        ]
    )
    rows, cols = linear_sum_assignment(cost.double().numpy())
    at = dict(zip(rows.tolist(), cols.tolist(), strict=True))
    return [(float(cost[j, at[j]]), at[j]) for j in range(len(recs))]


def _pixel_box(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel range [0, 1] in the dataset's normalized input space, as (low, high) of shape (1, C, 1, 1)."""
    m, s = torch.tensor(ds.mean).view(1, -1, 1, 1), torch.tensor(ds.std).view(1, -1, 1, 1)
    return (0 - m) / s, (1 - m) / s


def _batch(mcfg: Any, local: int) -> int:
    """How many samples the upload depends on: fedsgd's batch, fedavg's batch (one step),
    BAFFLE's mini-batch or whole local set (``delta_loss_on``)."""
    size = getattr(mcfg, "batch_size", 0) or local
    if getattr(mcfg, "delta_loss_on", "batch") == "local_set":
        size = local
    return min(size, local)


def _mean_image(built: BuiltRun, limit: int = 10_000) -> torch.Tensor:
    """The training set's mean image (its first ``limit`` images; not only the attacked
    clients' few), in the run's normalized input space: the baseline an attack must beat."""
    from fedge.data.registry import load_dataset  # noqa: PLC0415

    d, ds = built.config.dataset, built.dataset
    ref = load_dataset(
        d.name,
        root=d.root,
        resize=d.resize,
        limit_train=limit,
        limit_test=1,
        seed=built.config.seed,
    )
    s_ref, m_ref = torch.tensor(ref.std).view(1, -1, 1, 1), torch.tensor(ref.mean).view(1, -1, 1, 1)
    pixels = (ref.x_train * s_ref + m_ref).mean(0, keepdim=True)
    return (pixels - torch.tensor(ds.mean).view(1, -1, 1, 1)) / torch.tensor(ds.std).view(
        1, -1, 1, 1
    )


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
) -> Iterator[tuple[str, Any, bool]]:
    """(attack name, target, whether iDLG may read the label) for one upload; ``clipped``: the
    run's clients clip their uploads (DP), so BAFFLE's K values come at an unknown scale."""
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
        )
        yield "baffle-k", proj, False
        if clipped:
            yield "baffle-k-fit", replace(proj, fit_scale=True), False
        # the Stein estimate ĝ = (1/K) Σ t_k z_k (Eq. 6), exactly what the server forms
        k = proj.t.numel()
        stein = {n: torch.einsum("k,k...->...", proj.t, z) / k for n, z in proj.directions.items()}
        yield "baffle-stein", GradientTarget(stein), True
    else:
        raise ConfigError(
            f"no reconstruction attack for method {name!r} with this configuration: its uploads are "
            f"{upload or 'nothing an observer reads'}, which the harness does not attack (for a zeroth-order "
            "method set method.mode=batch, whose K loss differences it does)"
        )


def reconstruction_attack(
    run: ObservedRun,
    *,
    iterations: int = 300,
    samples: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    optimizer: str = "dlg",
) -> dict[str, Any]:
    """Attack every observed upload of round 1 (at most ``samples`` clients); returns the
    per-attack median/mean MSE, PSNR and label accuracy, baselines, and per-client results.
    ``optimizer``: ``dlg`` (L2 matching, L-BFGS) or ``ig`` (Inverting Gradients: cosine + TV,
    Adam, projected onto the pixel box [0, 1]; attack names get ``ig`` / ``-ig``)."""
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
    mean_img = _mean_image(built)
    gray = (
        ((0.5 - torch.tensor(ds.mean)) / torch.tensor(ds.std)).view(1, -1, 1, 1).expand_as(mean_img)
    )
    box = _pixel_box(ds)
    results: dict[str, list[dict[str, Any]]] = {}
    base_mean, base_gray, base_typical = [], [], []
    for i, view in enumerate(views):
        data = built.clients[view.cid]
        x_true, y_true = data.x[data.indices], data.y[data.indices]
        state = model.state_dict()
        dense, masks = unpack_model_arrays(dict(view.model), state, who="the observed broadcast")
        model.load_state_dict({k: dense.get(k, v) for k, v in state.items()})
        model.train()
        b = _batch(built.method_config, x_true.shape[0])
        base_mean += [
            m for m, _ in match_images(mean_img.expand(b, *mean_img.shape[1:]), x_true, ds)
        ]
        base_gray += [m for m, _ in match_images(gray.expand(b, *gray.shape[1:]), x_true, ds)]
        base_typical.append(
            float(pixel_mse(mean_img.expand_as(x_true), x_true, ds.mean, ds.std).mean())
        )
        clipped = privacy_config(built.config).enabled
        for attack, target, idlg in _targets(
            name, view, model, built.method_config, masks, clipped=clipped
        ):
            labels = (
                idlg_labels(target.grads, model)
                if idlg and b == 1 and isinstance(target, GradientTarget)
                else None
            )
            gen = generator(seed, "attack", attack, view.rnd, view.cid)
            if optimizer == "ig":
                attack = "ig" if attack == "dlg" else f"{attack}-ig"
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


def activation_inversion(
    run: ObservedRun,
    *,
    iterations: int = 300,
    samples: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """EPPFL: invert each device's first released activations of round 1, as its edge server
    received them (``observe_run(..., parties=("edge",))``), with the round's global M_c
    (what S_a broadcast in round 1, in the clear then; see :mod:`fedge.attacks.inversion`).
    Scored like :func:`reconstruction_attack`: pixel MSE to the closest image of the
    client's local set, beside the mean-image and mid-gray baselines."""
    from fedge.attacks.inversion import invert_activations  # noqa: PLC0415
    from fedge.methods.eppfl.split import activation_positions  # noqa: PLC0415

    built = run.built
    mcfg = built.method_config
    steps, split = _edge_view(run, "activation inversion")
    ds = built.dataset
    shape = tuple(ds.input_shape)
    bounds = _pixel_box(ds)
    clip = mcfg.dp.clip if mcfg.dp is not None else None
    mean_img = _mean_image(built)
    gray = (
        ((0.5 - torch.tensor(ds.mean)) / torch.tensor(ds.std)).view(1, -1, 1, 1).expand_as(mean_img)
    )
    cids = sorted(steps)[: samples or None]
    mse: list[float] = []
    base_mean, base_gray, clients, truths, recs = [], [], [], [], []
    for i, cid in enumerate(cids):
        msg = steps[cid]
        a = msg.arrays["a"]
        full = tuple(int(v) for v in str(msg.config["shape"]).split(","))
        b, c = full[0], full[1] if len(full) > 2 else 1
        n = math.prod(full[1:]) // c
        seed_pos = msg.config_int("seed", -1)
        pos = activation_positions(seed_pos, (b, c, n), a.shape[-1]) if seed_pos >= 0 else None
        rec = invert_activations(
            device_as_run(split.device),
            a,
            input_shape=shape,
            positions=pos,
            clip=clip,
            bounds=bounds,
            iterations=iterations,
            generator=generator(seed, "attack", "eppfl-inversion", cid),
        )
        data = built.clients[cid]
        x_true = data.x[data.indices]
        per = match_images(rec.x, x_true, ds)
        mse += [p[0] for p in per]
        base_mean += [
            m for m, _ in match_images(mean_img.expand(b, *mean_img.shape[1:]), x_true, ds)
        ]
        base_gray += [m for m, _ in match_images(gray.expand(b, *gray.shape[1:]), x_true, ds)]
        clients.append(
            {
                "cid": cid,
                "mse": [p[0] for p in per],
                "match_loss": rec.loss,
                "released": list(a.shape),
            }
        )
        truths.append(torch.stack([x_true[p[1]] for p in per]))
        recs.append(rec.x)
        if progress is not None:
            progress(i + 1, len(cids))
    med = statistics.median(mse)
    eps = mcfg.dp.epsilon if mcfg.dp is not None else None
    return {
        "method": built.config.method.name,
        "attack": "activation inversion at the edge server (white-box M_c, Adam, pixel box)",
        "epsilon": eps,
        "clip": clip,
        "theta_a": mcfg.theta_a,
        "clients_attacked": len(cids),
        "iterations": iterations,
        "baseline_mean_image_mse": statistics.median(base_mean),
        "baseline_mid_gray_mse": statistics.median(base_gray),
        "attacks": {
            "eppfl-inversion": {
                "median_mse": med,
                "mean_mse": statistics.fmean(mse),
                "median_psnr_db": 10 * math.log10(1 / med) if med > 0 else float("inf"),
                "clients": clients,
            }
        },
        "_images": {"eppfl-inversion": (torch.cat(truths), torch.cat(recs))},
    }


def _edge_view(run: ObservedRun, attack: str) -> tuple[dict[int, Any], Any]:
    """What an EPPFL edge server holds after round 1: each device's first ``step`` message
    (its released activations, taken with the broadcast M_c), and the split model with the
    round-1 global M_c (broadcast in the clear in round 1) loaded into its device half."""
    from fedge.methods.eppfl.split import split_model  # noqa: PLC0415

    built = run.built
    if upload_of(built) != "edge_activations":
        raise ConfigError(
            f"{attack} attacks activations released to an edge server (EPPFL's); this run is "
            f"{built.config.method.name!r}, which releases none"
        )
    steps: dict[int, Any] = {}
    for r in (
        run.party_records
    ):  # the first step of each device in round 1: taken with the broadcast M_c
        if (
            r.party == "edge"
            and r.rnd == 1
            and r.message.config.get("op") == "step"
            and r.key is not None
        ):
            steps.setdefault(r.key, r.message)
    if not steps:
        raise ConfigError(
            "no activations observed at the edge server in round 1; run observe_run with parties=('edge',)"
        )
    sent = next((o.sent for o in run.observer.records if o.rnd == 1 and o.sent.arrays), None)
    if sent is None or "masked_sum" in sent.config:
        raise ConfigError("round 1's broadcast of M_c was not observed in the clear")
    split = split_model(built.model_fn(), getattr(built.method_config, "cut", None))
    dstate = split.device.state_dict()
    with torch.no_grad():
        for key, local in split.device_keys.items():
            dstate[local].copy_(sent.arrays[key])
    return steps, split


def eppfl_server_views(run: ObservedRun) -> list[ServerView]:
    """EPPFL's aggregation server S_a: each device's upload of a round whose broadcast W_c⁰ was
    in the clear (round 1), read as the public protocol says — W_c + r_i in the fixed-point
    ring (:data:`fedge.methods.eppfl.FIXED_POINT`, config ``masked``), decoded as if it were the
    plaintext and laid out over M_c's floating-point keys — minus W_c⁰: a model delta
    (``masked`` True). With ``method.masks=false`` the reply's arrays are W_c itself."""
    from fedge.methods.eppfl import FIXED_POINT  # noqa: PLC0415
    from fedge.methods.eppfl.device import float_keys, unflatten  # noqa: PLC0415
    from fedge.methods.eppfl.split import split_model  # noqa: PLC0415

    built = run.built
    keys = float_keys(split_model(built.model_fn(), getattr(built.method_config, "cut", None)))
    views = []
    for r in run.observer.records:
        if "masked_sum" in r.sent.config or not all(k in r.sent.arrays for k in keys):
            continue  # a masked broadcast: S_a does not know W_c⁰ either
        w0 = {k: r.sent.arrays[k] for k in keys}
        blob = r.reply.config.get("masked")
        if isinstance(blob, bytes):
            w, masked = unflatten(FIXED_POINT.decode(FIXED_POINT.from_bytes(blob)), w0, keys), True
        elif all(k in r.reply.arrays for k in keys):
            w, masked = {k: r.reply.arrays[k] for k in keys}, False
        else:
            continue
        config = {k: v for k, v in r.sent.config.items() if not isinstance(v, bytes)}
        upload = {k: w[k].to(torch.float32) - w0[k].to(torch.float32) for k in keys}
        views.append(
            ServerView(r.rnd, r.cid, dict(r.sent.arrays), config, upload, masked, r.reply.nbytes)
        )
    return views


def _dense(a: torch.Tensor, seed_pos: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """(B, C·N) released values at their positions, zeros at positions not released."""
    from fedge.methods.eppfl.split import activation_positions, scatter  # noqa: PLC0415

    if seed_pos >= 0:
        a = scatter(
            a.to(torch.float32), activation_positions(seed_pos, shape, a.shape[-1]), shape[-1]
        )
    return a.reshape(shape[0], -1).to(torch.float32)


def device_as_run(device: torch.nn.Module) -> torch.nn.Module:
    """A copy of EPPFL's device half that computes what the device computed: norm layers in
    training mode (the device runs M_c in train mode, so BatchNorm uses the batch's statistics,
    not its running ones), everything else in eval mode (dropout off: the zoo's split points
    have none). A copy, so the attacker's forwards leave the run's running statistics alone."""
    import copy  # noqa: PLC0415

    twin = copy.deepcopy(device)
    for m in twin.modules():
        m.train(isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    return twin


def released_activations(step: Any) -> torch.Tensor:
    """An EPPFL ``step`` message as its edge server reads it: the (B, C·N_c) cut activations
    with the released values at their positions (regenerated from the message's seed, θ_a)
    and zeros where nothing was released."""
    full = tuple(int(v) for v in str(step.config["shape"]).split(","))
    b, c = full[0], full[1] if len(full) > 2 else 1
    return _dense(step.arrays["a"], step.config_int("seed", -1), (b, c, math.prod(full[1:]) // c))


def edge_pia_attack(
    run: ObservedRun, *, prop: int = 0, aux_updates: int = 64, seed: int = 0
) -> dict[str, Any]:
    """Property inference at EPPFL's edge server (Melis et al. 2019's batch property, "class
    ``prop`` occurs in the batch", against the split-learning view): S_e sees each device's
    released kept activations (noisy under DP) and knows the round's M_c. It simulates the
    public device pipeline — M_c, the kept positions (θ_a), the per-sample L1 clip and
    Laplace noise Lap(2C/ε) — on ``aux_updates`` auxiliary batches (the test split), half
    with the property and half without (:func:`~fedge.attacks.property.aux_batch`), trains a
    per-sample classifier "is this sample of class ``prop``" (logistic regression on the
    released values scattered back to their positions, zeros elsewhere), and scores each
    observed device by its most confident sample (the batch has the property iff some
    sample has it). Metric: AUC over the observed devices (chance 0.5)."""
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

    from fedge.attacks.membership import roc_auc  # noqa: PLC0415
    from fedge.attacks.property import aux_batch  # noqa: PLC0415
    from fedge.methods.eppfl.split import activation_positions, kept  # noqa: PLC0415
    from fedge.privacy.dp.laplace import LaplaceMechanism  # noqa: PLC0415

    built = run.built
    mcfg, ds = built.method_config, built.dataset
    steps, split = _edge_view(run, "edge property inference")
    mech = LaplaceMechanism(mcfg.dp.epsilon, mcfg.dp.clip) if mcfg.dp is not None else None

    observed, truth, seen_labels = {}, {}, {}
    for cid, msg in steps.items():
        observed[cid] = released_activations(msg)
        seen_labels[cid] = msg.arrays.get("y")
        data = built.clients[cid]
        truth[cid] = bool((data.y[data.indices] == prop).any())
    if len(set(truth.values())) == 1:
        raise ConfigError(
            f"edge property inference needs devices with and without class {prop} in their batch; all "
            f"{len(truth)} observed devices {'had' if all(truth.values()) else 'lacked'} it. Use more devices "
            "or another property class"
        )
    size = max(len(v) for v in observed.values())
    device = device_as_run(split.device)
    feats, labels = [], []
    for j in range(aux_updates):
        g = generator(seed, "edge-pia", j)
        idx = aux_batch(ds.y_test, size, prop, j % 2 == 0, g)
        with torch.no_grad():
            a = device(ds.x_test[idx])
        b, c = a.shape[0], a.shape[1] if a.dim() > 2 else 1
        n = a[0].numel() // c
        flat, seed_pos = a.reshape(b, c, n), -1
        if mcfg.theta_a < 1:
            seed_pos = int(torch.randint(2**62, (1,), generator=g))
            flat = flat.gather(-1, activation_positions(seed_pos, (b, c, n), kept(n, mcfg.theta_a)))
        if mech is not None:
            flat = mech.release(flat, generator=g)[1]
        feats.append(_dense(flat, seed_pos, (b, c, n)))
        labels.append(ds.y_test[idx] == prop)
    x, y = torch.cat(feats).double().numpy(), torch.cat(labels).numpy()
    clf = make_pipeline(
        StandardScaler(), LogisticRegression(C=1.0, max_iter=2000, class_weight="balanced")
    )
    clf.fit(x, y)
    scores = {
        cid: float(clf.predict_proba(f.double().numpy())[:, 1].max()) for cid, f in observed.items()
    }

    def auc(score: dict[int, float]) -> float:
        return roc_auc(
            torch.tensor([score[c] for c in score if truth[c]]),
            torch.tensor([score[c] for c in score if not truth[c]]),
        )

    from_activations = auc(scores)
    # The step messages carry the batch's labels in the clear (as in the paper), and the property
    # is a function of the labels: an edge server that reads them knows it exactly. The attack
    # uses everything the adversary observes; the activations-only figure says what the
    # released values alone give (what hiding the labels would leave).
    labelled = all(v is not None for v in seen_labels.values())
    from_labels = (
        auc({c: float(bool((v == prop).any())) for c, v in seen_labels.items() if v is not None})
        if labelled
        else None
    )
    return {
        "attack": "property inference at the edge server (the labels it receives; a per-sample classifier on "
        "released activations, max over the batch)",
        "method": built.config.method.name,
        "property_class": prop,
        "chance_auc": 0.5,
        "auc": from_labels if from_labels is not None else from_activations,
        "auc_activations": from_activations,
        "labels_in_clear": labelled,
        "uploads": len(scores),
        "with_property": sum(truth.values()),
        "aux_updates": aux_updates,
        "train_accuracy": float(clf.score(x, y)),
        "masked": False,
        "epsilon": mcfg.dp.epsilon if mcfg.dp is not None else None,
    }


def one_batch_clients(built: BuiltRun, seed: int = 0) -> BuiltRun:
    """``built`` with each client's local set cut to the samples one upload is computed on
    (the method's batch, drawn by a seeded permutation), so that "class c is in the batch"
    varies between clients and is known for each upload (the attack-instrumented run of
    ``fedge attack --attack pia``)."""
    from fedge.core.context import ClientData  # noqa: PLC0415

    cut: list[ClientData] = []
    for c in built.clients:
        b = _batch(built.method_config, c.num_samples)
        keep = c.indices[
            torch.randperm(c.num_samples, generator=generator(seed, "pia-cut", len(cut)))[:b]
        ]
        cut.append(ClientData(c.x, c.y, keep))
    return replace(built, clients=cut)


def pia_attack(
    run: ObservedRun,
    *,
    prop: int = 0,
    aux_updates: int = 64,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Property inference (:func:`fedge.attacks.property.property_inference`) on every observed
    upload: "does class ``prop`` occur in the data the upload was computed on" (each client's
    local set), auxiliary data = the run's test split (disjoint from every client's data)."""
    from fedge.attacks.property import property_inference  # noqa: PLC0415

    built = run.built

    def truth(v: ServerView) -> tuple[bool, int]:
        data = built.clients[v.cid]
        y = data.y[data.indices]
        return bool((y == prop).any()), _batch(built.method_config, len(y))

    views = run.views
    held = {truth(v)[0] for v in views}
    if len(held) == 1:
        size = truth(views[0])[1] if views else 0
        raise ConfigError(
            f"property inference needs uploads with and without class {prop}; every one of the {len(views)} observed "
            f"uploads was computed on {size} samples {'with' if held == {True} else 'without'} it. Use small batches "
            "(method.batch_size, and for baffle method.delta_loss_on=batch), more uploads (--samples), "
            "or another --property-class"
        )
    ds = built.dataset
    r = property_inference(
        views,
        built.method.program,
        truth,
        (ds.x_test, ds.y_test),
        prop=prop,
        aux_updates=aux_updates,
        seed=seed,
        progress=progress,
    )
    return {
        "attack": "property inference (Melis et al. 2019), class present in the batch",
        "method": built.config.method.name,
        "property_class": prop,
        "chance_auc": 0.5,
        **r.__dict__,
    }


def attack_config(
    method: dict[str, Any],
    *,
    clients: int,
    per_client: int,
    seed: int = 0,
    model: str = "lenet-dlg",
    dataset: str = "fashion-mnist",
    test: int = 10,
    rounds: int = 1,
    privacy: dict[str, Any] | None = None,
) -> RunConfig:
    """A short run whose clients each hold exactly ``per_client`` samples; ``test`` test
    samples (the attacker's auxiliary data and non-members come from there); ``privacy``: the
    run's ``privacy:`` section (None: no DP)."""
    return load_config(
        {
            **({"privacy": privacy} if privacy else {}),
            "seed": seed,
            "rounds": rounds,
            "eval_every": rounds,
            "clients": {"num": clients, "per_round": clients},
            "dataset": {"name": dataset, "limit_train": clients * per_client, "limit_test": test},
            "partition": {"name": "iid"},
            "model": {"name": model},
            "method": method,
        }
    )


# The leakage table of docs/benchmarks.md ("Privacy leakage"): label -> (method section, batch).
LEAKAGE_ROWS: dict[str, tuple[dict[str, Any], int]] = {
    "fedsgd, batch 1": ({"name": "fedsgd", "batch_size": 1}, 1),
    "fedsgd, batch 8": ({"name": "fedsgd", "batch_size": 8}, 8),
    "fedavg, 1 local SGD step, batch 1": (
        {
            "name": "fedavg",
            "local_epochs": 1,
            "batch_size": 1,
            "client_optimizer": {"name": "sgd", "lr": 0.1},
        },
        1,
    ),
    "fedsgd, batch 1, secure aggregation": (
        {"name": "fedsgd", "batch_size": 1, "secure_aggregation": True},
        1,
    ),
    "baffle batch, K=10, no secure aggregation": (
        {"name": "baffle", "mode": "batch", "k": 10, "ema": None, "secure_aggregation": False},
        1,
    ),
    "baffle batch, K=100, no secure aggregation": (
        {"name": "baffle", "mode": "batch", "k": 100, "ema": None, "secure_aggregation": False},
        1,
    ),
    "baffle batch, K=1000, no secure aggregation": (
        {"name": "baffle", "mode": "batch", "k": 1000, "ema": None, "secure_aggregation": False},
        1,
    ),
    "baffle batch, K=100, secure aggregation (default)": (
        {"name": "baffle", "mode": "batch", "k": 100, "ema": None},
        1,
    ),
}


def leakage_table(
    *,
    clients: int = 4,
    iterations: int = 300,
    dataset: str = "fashion-mnist",
    rows: list[str] | None = None,
    optimizer: str = "dlg",
) -> list[dict[str, Any]]:
    """One line per (row, attack): median/mean MSE, label accuracy and the baselines."""
    import warnings  # noqa: PLC0415

    out = []
    for label in rows or list(LEAKAGE_ROWS):
        method, per_client = LEAKAGE_ROWS[label]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = observe_run(
                attack_config(method, clients=clients, per_client=per_client, dataset=dataset)
            )
        s = reconstruction_attack(run, iterations=iterations, optimizer=optimizer)
        for attack, a in s["attacks"].items():
            out.append(
                {
                    "row": label,
                    "attack": attack,
                    "masked": s["masked"],
                    "median_mse": a["median_mse"],
                    "mean_mse": a["mean_mse"],
                    "label_accuracy": a["label_accuracy"],
                    "mean_image": s["baseline_mean_image_mse"],
                    "mid_gray": s["baseline_mid_gray_mse"],
                    "upload_bytes": statistics.median(v.reply_bytes for v in run.views),
                }
            )
    return out
