"""Warm start from public data: before round 1 the server takes a public set of training samples
that no client gets (:func:`split_public`: off the run's training set; :func:`unused_public`:
from the samples ``dataset.limit_train`` leaves out), trains the run's initial model on it with
backprop (:func:`pretrain`), and every method starts from the result, because the run's model
factory now builds it (:meth:`WarmStart.model_fn`): a cross-cutting option of the run, not of a
method (the composer's mechanisms act on a method's rounds; this one only changes the model
they start from). The server's pretraining FLOPs are metered apart and never counted as client
FLOPs; the public size and that cost go into ``summary.json`` (``warm_start``) and the report.

Deterministic: the split is a class-stratified draw from ``numpy_rng(seed, "warm-start",
"public")``, the batch order ``torch.randperm`` with ``generator(seed, "warm-start", "order")``
(only the server draws them, so they need not be portable), under the run's torch thread count;
a resumed run recomputes the same start (the last one built in this process is kept).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedge.core.config import RunConfig, WarmStartConfig
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.core.meter import FlopCounter
from fedge.core.rng import GlobalStream, generator, numpy_rng
from fedge.core.threads import torch_threads
from fedge.data import Dataset
from fedge.data.dataset import stratified_subset
from fedge.data.registry import limited_indices, load_dataset
from fedge.methods.base import model_arrays

__all__ = [
    "WarmStart",
    "pretrain",
    "restandardize",
    "split_public",
    "unused_public",
    "warm_start",
]


def split_public(
    dataset: Dataset, cfg: WarmStartConfig, *, seed: int, clients: int
) -> tuple[Dataset, np.ndarray, np.ndarray]:
    """``dataset`` without its public split, the public split's indices into ``dataset``'s
    training set and the indices of what stays (sorted, disjoint, together every sample).

    The public split is a class-stratified draw of ``cfg.public`` samples
    (``numpy_rng(seed, "warm-start", "public")``); it must leave at least one sample per client.
    """
    n = len(dataset.y_train)
    if cfg.public >= n:
        raise ConfigError(
            f"warm_start.public={cfg.public} takes every one of the {n} training samples left for the "
            f"clients (after dataset.validation); it must leave at least clients.num={clients}; lower "
            "warm_start.public or raise dataset.limit_train"
        )
    if n - cfg.public < clients:
        raise ConfigError(
            f"warm_start.public={cfg.public} leaves {n - cfg.public} of the {n} training samples for "
            f"clients.num={clients} clients, expected at least one each; lower warm_start.public to at "
            f"most {n - clients}, lower clients.num or raise dataset.limit_train"
        )
    public = stratified_subset(
        dataset.y_train.numpy(), cfg.public, numpy_rng(seed, "warm-start", "public")
    )
    keep = np.ones(n, dtype=bool)
    keep[public] = False
    kept = np.flatnonzero(keep)
    idx = torch.from_numpy(kept)
    domains = None if dataset.train_domains is None else dataset.train_domains[keep]
    rest = dataclasses.replace(
        dataset, x_train=dataset.x_train[idx], y_train=dataset.y_train[idx], train_domains=domains
    )
    return rest, public, kept


def unused_public(
    cfg: RunConfig, dataset: Dataset
) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """The public set drawn from the training samples ``dataset.limit_train`` leaves out of the
    run (``warm_start.source: unused``): its indices into the dataset's whole training split,
    the indices of the samples the run keeps (:func:`fedge.data.registry.limited_indices`), and
    its images and labels, normalized with the run's statistics (``dataset.mean``/``std``, those
    of the kept samples), as the clients' are. ``dataset`` is the run's (nothing of it changes)."""
    ws, d = cfg.warm_start, cfg.dataset
    assert ws is not None
    full = load_dataset(
        d.name, root=d.root, resize=d.resize, limit_test=1, seed=cfg.seed, **d.options()
    )
    n, limit = len(full.y_train), d.limit_train
    if limit is None or limit >= n:
        raise ConfigError(
            f"warm_start.source=unused takes the public set from the training samples dataset.limit_train "
            f"leaves out, but dataset.limit_train={limit} keeps all {n}; set dataset.limit_train to at most "
            f"{n - ws.public}, or warm_start.source=split"
        )
    labels = full.y_train.numpy()
    kept = limited_indices(d.name, "train", labels, limit, cfg.seed)
    rest = np.setdiff1d(np.arange(n), kept)
    if ws.public > len(rest):
        raise ConfigError(
            f"warm_start.public={ws.public} with warm_start.source=unused: dataset.limit_train={limit} "
            f"leaves only {len(rest)} of the {n} training samples out; lower warm_start.public to at most "
            f"{len(rest)}, or dataset.limit_train to at most {n - ws.public}"
        )
    public = rest[
        stratified_subset(labels[rest], ws.public, numpy_rng(cfg.seed, "warm-start", "public"))
    ]
    x = restandardize(full.x_train[torch.from_numpy(public)], full, dataset)
    return public, kept, x, full.y_train[torch.from_numpy(public)]


def restandardize(x: torch.Tensor, src: Dataset, dst: Dataset) -> torch.Tensor:
    """Samples ``x`` standardized with ``src``'s statistics, standardized with ``dst``'s
    instead (per channel, or per feature; the pixel scale cancels), in float64, as float32."""
    view = (1, -1) if x.ndim == 2 else (1, -1, 1, 1)

    def stat(v: tuple[float, ...]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.float64).view(view)

    out = (x.double() * stat(src.std) + stat(src.mean) - stat(dst.mean)) / stat(dst.std)
    return out.float()


def pretrain(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: WarmStartConfig,
    *,
    seed: int,
) -> dict[str, float | int]:
    """Train ``model`` in place with backprop on ``(x, y)``: ``cfg.epochs`` passes, each in the
    order of ``torch.randperm(len(y), generator=generator(seed, "warm-start", "order"))``
    (one generator, drawn once per epoch) in batches of ``cfg.batch_size`` (the last one
    smaller), mean cross-entropy, ``torch.optim.SGD(lr, momentum)`` or ``torch.optim.Adam(lr)``.
    Random layers (dropout) draw from a :class:`~fedge.core.rng.GlobalStream` of the same seed.

    Returns the cost: ``server_flops`` (torch's FLOP counter over the whole loop), ``steps``,
    ``seconds`` and ``final_loss`` (the mean loss of the last epoch's batches)."""
    if cfg.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum
        )
    else:
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    g = generator(seed, "warm-start", "order")
    stream = GlobalStream(generator(seed, "warm-start", "dropout"))
    counter, steps, start = FlopCounter(), 0, time.perf_counter()
    losses: list[float] = []
    model.train()
    with stream.active(), counter:
        for _ in range(cfg.epochs):
            order = torch.randperm(len(y), generator=g).to(y.device)
            losses = []
            for i in range(0, len(y), cfg.batch_size):
                idx = order[i : i + cfg.batch_size]
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                steps += 1
    model.eval()
    return {
        "server_flops": counter.flops,
        "steps": steps,
        "seconds": time.perf_counter() - start,
        "final_loss": sum(losses) / len(losses),
    }


@dataclass(frozen=True)
class WarmStart:
    """The server's pretrained start: its weights (every ``state_dict`` entry, on the CPU), the
    public set's indices and those of the samples the run keeps, both into one training set
    (``source: split``: the run's after ``dataset.validation``, ``kept`` what the clients are
    partitioned from; ``unused``: the dataset's whole training split, ``kept`` the
    ``limit_train`` subset), and the ``record`` ``summary.json`` carries."""

    state: dict[str, torch.Tensor]
    public: np.ndarray
    kept: np.ndarray
    record: dict[str, Any]

    def model_fn(self, base: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
        """``base`` (the seeded model factory) with the pretrained weights loaded: the same
        weights on every call, as a model factory promises."""
        state = self.state

        def make() -> torch.nn.Module:
            model = base()
            model.load_state_dict(state)
            return model

        return make


_LAST: dict[str, WarmStart] = {}  # fingerprint -> its start: the last one built in this process


def _fingerprint(cfg: RunConfig, x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> str:
    """What a start is a function of: the run's config, the public samples and the initial
    model's weights (a dataset or model registered anew under the same name gives another)."""
    h = hashlib.blake2b(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode())
    for t in (x, y, *model.state_dict().values()):
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def warm_start(
    cfg: RunConfig,
    dataset: Dataset,
    model_fn: Callable[[], torch.nn.Module],
    device: torch.device,
) -> tuple[Dataset, WarmStart]:
    """The clients' training set (``dataset`` without the public split) and the server's start
    for the run ``cfg`` (``cfg.warm_start`` set), pretrained on ``device`` from ``model_fn()``
    under ``cfg.threads`` torch threads."""
    ws = cfg.warm_start
    assert ws is not None
    if ws.source == "split":
        rest, public, kept = split_public(dataset, ws, seed=cfg.seed, clients=cfg.clients.num)
        idx = torch.from_numpy(public)
        x, y = dataset.x_train[idx], dataset.y_train[idx]
    else:
        rest = dataset
        public, kept, x, y = unused_public(cfg, dataset)
    model = model_fn()
    key = _fingerprint(cfg, x, y, model)
    if key in _LAST:
        return rest, _LAST[key]
    x, y, model = x.to(device), y.to(device), model.to(device)
    with torch_threads(cfg.threads):
        cost = pretrain(model, x, y, ws, seed=cfg.seed)
    state = model_arrays(model)
    record = {
        "public": len(public),
        "clients_samples": len(rest.y_train),
        **ws.model_dump(exclude={"public"}),
        **cost,
        # what a client whose method does not download the model every round (a seeds-only
        # downlink: FedKSeed, DeComFL, FeedSign, BAFFLE's) fetches once instead of rebuilding it
        # from the seed: its first message is the model (MethodEnv.seeded_start), in bytes down
        "model_bytes": len(Message(state).to_bytes()),
    }
    out = WarmStart(state, public, kept, record)
    _LAST.clear()
    _LAST[key] = out
    return rest, out
