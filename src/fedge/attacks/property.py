"""Property inference from client uploads (Melis, Song, De Cristofaro, Shmatikov 2019,
"Exploiting Unintended Feature Leakage in Collaborative Learning", Sec. 5.3 batch property
inference; PPFL seed 001, Table 2 "PIA").

The honest-but-curious server holds auxiliary data from the task's distribution. For the
model (and seed, for BAFFLE) it broadcast, it computes the uploads that the *public client
protocol* would produce on auxiliary batches with the property (here: "class c occurs in the
batch") and without it, trains a binary classifier (logistic regression on the standardized
flattened upload) on those, and scores every observed client upload. The metric is the AUC
of those scores against the truth (whether class c occurs in the data the client's upload was
computed on); 0.5 is chance.

The server simulates the client by running the method's own client program on the broadcast
message (:attr:`~fedge.methods.base.MethodBuild.program`): a FedSGD gradient, a FedAvg or FedPT
delta, BAFFLE's K loss differences along the seed's directions. Under secure aggregation it
simulates the plaintext (the wrapped program) — that is what it would like to see — and then
classifies what it does see, the masked vector laid out as the plaintext
(:func:`~fedge.attacks.observe.server_views`): the attack runs and lands where it lands.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedge.attacks.membership import roc_auc
from fedge.attacks.observe import ServerView
from fedge.core.context import ClientContext, ClientData
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.core.rng import generator

__all__ = ["PropertyResult", "aux_batch", "plaintext_program", "property_inference"]


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
