"""Property inference from what a server observes (Melis, Song, De Cristofaro, Shmatikov,
S&P 2019, "Exploiting Unintended Feature Leakage in Collaborative Learning", Sec. 5.3 batch
property): "does class c occur in the batch an upload was computed on", learned by a logistic
regression on uploads the server computes itself by running the method's own client program
(secure aggregation looked through) on auxiliary batches with and without the property, scored
by AUC over the observed uploads (0.5 is chance): :func:`property_inference` on server views,
:func:`pia_attack` on an observed run, :func:`edge_pia_attack` on the activations EPPFL releases
to its edge server, :func:`property_attack` on a run re-run from its config. See
docs/privacy/attacks.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedge.attacks.edge_view import (
    dense_activations,
    device_as_run,
    edge_view,
    released_activations,
)
from fedge.attacks.harness import (
    ObservedRun,
    observe_run,
    one_batch_clients,
    upload_batch,
    upload_of,
)
from fedge.attacks.membership import roc_auc
from fedge.attacks.observe import ServerView
from fedge.core.config import load_config
from fedge.core.context import ClientContext, ClientData
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.core.rng import generator

__all__ = [
    "PropertyResult",
    "aux_batch",
    "edge_pia_attack",
    "pia_attack",
    "plaintext_program",
    "property_attack",
    "property_inference",
]


@dataclass
class PropertyResult:
    auc: float
    uploads: int  # observed uploads scored
    with_property: int  # of which the property held
    aux_updates: int  # simulated auxiliary uploads per classifier
    classifiers: int  # one per distinct broadcast (round, seed)
    train_accuracy: float  # the classifier on its own auxiliary uploads (median over classifiers)
    masked: bool


def plaintext_program(program: Any) -> Any:
    """The client program beneath secure aggregation's masking (what the server simulates)."""
    from fedge.methods.secure import SecureClient  # noqa: PLC0415

    while isinstance(program, SecureClient):
        program = program.inner
    return program


def aux_batch(y: torch.Tensor, size: int, prop: int, has: bool, g: torch.Generator) -> torch.Tensor:
    """Indices of ``size`` auxiliary samples: with class ``prop`` among them (at least one,
    the rest drawn from all classes) or without it (drawn from the other classes)."""
    pool_with, pool_without = (y == prop).nonzero().view(-1), (y != prop).nonzero().view(-1)
    if has:
        first = pool_with[torch.randint(len(pool_with), (1,), generator=g)]
        rest = torch.randperm(len(y), generator=g)[: size - 1]
        return torch.cat([first, rest])
    return pool_without[torch.randperm(len(pool_without), generator=g)[:size]]


def _features(arrays: dict[str, torch.Tensor], names: list[str]) -> np.ndarray:
    return torch.cat([arrays[n].detach().double().reshape(-1) for n in names]).numpy()


def _group_key(v: ServerView) -> tuple[Any, ...]:
    """Uploads comparable by one classifier: same round, same broadcast config (BAFFLE's seed)."""
    return (v.rnd, tuple(sorted((k, repr(x)) for k, x in v.config.items())))


def property_inference(
    views: list[ServerView],
    program: Any,
    truth: Callable[[ServerView], tuple[bool, int]],
    aux: tuple[torch.Tensor, torch.Tensor],
    *,
    prop: int,
    aux_updates: int = 64,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> PropertyResult:
    """Melis et al.'s batch property inference against observed uploads.

    Args:
        views: the observed uploads (:func:`~fedge.attacks.observe.server_views`).
        program: the method's client program (secure aggregation is looked through).
        truth: view -> (whether the property holds for the data behind it, that data's size).
        aux: the attacker's auxiliary (x, y), disjoint from every client's data.
        prop: the class whose presence is inferred.
        aux_updates: simulated uploads per classifier (half with the property).
    """
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

    if not views:
        raise ConfigError("property inference: no upload was observed; nothing to attack")
    x_aux, y_aux = aux
    if not bool((y_aux == prop).any()) or not bool((y_aux != prop).any()):
        raise ConfigError(
            f"property class {prop}: the auxiliary data needs samples with and without it"
        )
    inner = plaintext_program(program)
    groups: dict[tuple[Any, ...], list[ServerView]] = {}
    for v in views:
        groups.setdefault(_group_key(v), []).append(v)
    scores: list[float] = []
    labels: list[bool] = []
    train_acc: list[float] = []
    for gi, group in enumerate(groups.values()):
        ref = group[0]
        size = truth(ref)[1]
        msg = Message(dict(ref.model), config=dict(ref.config))
        feats, ys = [], []
        for j in range(aux_updates):
            has = j % 2 == 0
            g = generator(seed, "pia", ref.rnd, gi, j)
            idx = aux_batch(y_aux, size, prop, has, g)
            ctx = ClientContext(
                cid=-1,
                rnd=ref.rnd,
                data=ClientData(x_aux, y_aux, idx),
                generator=g,
                meter=Meter(flops=False),
            )
            reply = inner.run(msg, ctx)
            names = sorted(n for n in reply.arrays if n in ref.upload)
            feats.append(_features(dict(reply.arrays), names))
            ys.append(int(has))
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
        clf.fit(np.stack(feats), np.array(ys))
        train_acc.append(float(clf.score(np.stack(feats), np.array(ys))))
        names = sorted(n for n in ref.upload if n in reply.arrays)
        test = np.stack([_features(v.upload, names) for v in group])
        test = np.nan_to_num(test, nan=0.0, posinf=0.0, neginf=0.0)
        scores += clf.predict_proba(test)[:, 1].tolist()
        labels += [truth(v)[0] for v in group]
        if progress is not None:
            progress(gi + 1, len(groups))
    s, t = torch.tensor(scores), torch.tensor(labels)
    pos, neg = s[t], s[~t]
    auc = roc_auc(pos, neg) if len(pos) and len(neg) else float("nan")
    return PropertyResult(
        auc,
        len(scores),
        int(t.sum()),
        aux_updates,
        len(groups),
        statistics.median(train_acc),
        any(v.masked for v in views),
    )


def edge_pia_attack(
    run: ObservedRun, *, prop: int = 0, aux_updates: int = 64, seed: int = 0
) -> dict[str, Any]:
    """Property inference at EPPFL's edge server (Melis et al. 2019's batch property, "class
    ``prop`` occurs in the batch", against the split-learning view): S_e sees each device's
    released kept activations (noisy under DP) and knows the round's M_c. It simulates the
    public device pipeline — M_c, the kept positions (θ_a), the per-sample L1 clip and
    Laplace noise Lap(2C/ε) — on ``aux_updates`` auxiliary batches (the test split), half
    with the property and half without (:func:`aux_batch`), trains a
    per-sample classifier "is this sample of class ``prop``" (logistic regression on the
    released values scattered back to their positions, zeros elsewhere), and scores each
    observed device by its most confident sample (the batch has the property iff some
    sample has it). Metric: AUC over the observed devices (chance 0.5)."""
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

    from fedge.methods.eppfl.split import activation_positions, kept  # noqa: PLC0415
    from fedge.privacy.dp.laplace import LaplaceMechanism  # noqa: PLC0415

    built = run.built
    mcfg, ds = built.method_config, built.dataset
    steps, split = edge_view(run, "edge property inference")
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
        feats.append(dense_activations(flat, seed_pos, (b, c, n)))
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


def pia_attack(
    run: ObservedRun,
    *,
    prop: int = 0,
    aux_updates: int = 64,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Property inference (:func:`property_inference`) on every observed
    upload: "does class ``prop`` occur in the data the upload was computed on" (each client's
    local set), auxiliary data = the run's test split (disjoint from every client's data)."""
    built = run.built

    def truth(v: ServerView) -> tuple[bool, int]:
        data = built.clients[v.cid]
        y = data.y[data.indices]
        return bool((y == prop).any()), upload_batch(built.method_config, len(y))

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


def property_attack(
    raw: dict[str, Any],
    *,
    samples: int,
    seed: int = 0,
    prop: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Property inference against a run re-run from its config ``raw``: ⌈samples / clients a
    round⌉ rounds with each client's local set cut to the one batch its upload is computed on
    (:func:`~fedge.attacks.harness.one_batch_clients`), every upload attacked
    (:func:`pia_attack`). A method whose clients release activations to an edge server (their
    upload to the server masked): round 1 with ``min(samples, clients.num)`` devices, each cut
    to its first batch, attacked at the edge server (:func:`edge_pia_attack`; the edge server
    knows round 1's M_c, broadcast in the clear)."""
    cfg = load_config(raw)
    if upload_of(cfg) == "edge_activations":
        devices = min(samples, int(cfg.clients.num))
        cfg = load_config(
            {**raw, "rounds": 1, "clients": {**raw.get("clients", {}), "per_round": devices}}
        )
        run = observe_run(cfg, 1, prepare=lambda b: one_batch_clients(b, seed), parties=("edge",))
        result = edge_pia_attack(run, prop=prop, seed=seed)
        if progress is not None:
            progress(1, 1)
        result["rounds_observed"] = 1
        result["note"] = (
            f"the edge server's view of round 1: {devices} devices (raise clients.num to attack more), "
            "each cut to the one batch of its first step"
        )
        return result
    rounds = -(-samples // cfg.clients.count())
    cfg = load_config({**raw, "rounds": rounds})
    run = observe_run(cfg, rounds, prepare=lambda b: one_batch_clients(b, seed))
    result = pia_attack(run, prop=prop, seed=seed, progress=progress)
    result["rounds_observed"] = rounds
    result["note"] = "each client's local set cut to the one batch its upload is computed on"
    return result
