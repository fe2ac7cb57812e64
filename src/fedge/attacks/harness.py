"""One short instrumented run of a config and what its server observes: :func:`observe_run`
builds the run, wraps its strategy in an :class:`~fedge.attacks.observe.Observer` (its side
parties, e.g. an edge server, in :func:`~fedge.attacks.observe.observe_parties`) and runs its
rounds through the real engine; :attr:`ObservedRun.views` reads each client's upload as a
server that knows the public protocol would, and :func:`upload_of` says from the method's
registration what that upload is, so that attacks choose their target by it, never by a
method's name. :func:`attack_config` is the tiny run the attacks measure and
:func:`one_batch_clients` cuts a built run's local sets to one upload's batch. See
docs/privacy/attacks.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fedge.attacks.observe import Observer, PartyObserved, ServerView, observe_parties, server_views
from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ConfigError, PrivacyWarning
from fedge.core.rng import generator
from fedge.experiment.build import BuiltRun, build_run, method_config
from fedge.methods import get_method
from fedge.methods.spec import Upload

__all__ = [
    "attack_config",
    "check_seed_scalars_readable",
    "eppfl_server_views",
    "observe_run",
    "ObservedRun",
    "one_batch_clients",
    "seed_scalar_views",
    "os_random",
    "upload_batch",
    "upload_of",
    "warn_if_not_replayable",
]


def upload_of(run: BuiltRun | RunConfig) -> Upload | None:
    """What an observer of a run's uploads sees (its method's
    :attr:`~fedge.methods.spec.MethodSpec.upload`), from the built run or its config."""
    if isinstance(run, BuiltRun):
        return get_method(run.config.method.name).upload(run.method_config)
    return get_method(run.method.name).upload(method_config(run))


@dataclass
class ObservedRun:
    """A built run whose rounds ran with every exchange recorded (:func:`observe_run`)."""

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
        if upload == "seed_scalars":
            return seed_scalar_views(self)
        if upload == "edge_activations":
            return eppfl_server_views(self)
        sealed = None
        if upload == "ciphertext":  # the public protocol says the upload is a ciphertext
            sealed = {n: p.shape for n, p in self.built.model_fn().named_parameters()}
        return server_views(self.observer.records, layout, sealed)


def check_seed_scalars_readable(built: BuiltRun | RunConfig) -> None:
    """Refuse to read a ``seed_scalars`` upload under secure aggregation: the server then sees
    only the masked inputs, whose sum alone it can open, so no client's scalars (and no
    client's update) can be rebuilt; the attacks read them with ``method.secure_aggregation:
    false``, the observer of the table's unprotected rows."""
    cfg = built.config if isinstance(built, BuiltRun) else built
    mcfg = built.method_config if isinstance(built, BuiltRun) else method_config(built)
    if getattr(mcfg, "secure_aggregation", False):
        raise ConfigError(
            f"method {cfg.method.name!r} runs with secure aggregation (method.secure_aggregation, on by "
            "default): the server sees only the sum of the clients' scalars, not any one client's, so there "
            "is no client update to rebuild and attack; set method.secure_aggregation=false to measure what "
            "an unprotected client's scalars leak"
        )


def observe_run(
    cfg: RunConfig,
    rounds: int = 1,
    prepare: Callable[[BuiltRun], BuiltRun] | None = None,
    parties: tuple[str, ...] = (),
) -> ObservedRun:
    """Build ``cfg`` (then ``prepare`` it, e.g. to cut clients' local sets) and run ``rounds``
    rounds with every exchange recorded, and every message to the side ``parties`` named
    (e.g. EPPFL's ``edge``)."""
    if upload_of(cfg) == "seed_scalars":
        check_seed_scalars_readable(cfg)
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


def seed_scalar_views(run: ObservedRun) -> list[ServerView]:
    """A seeds downlink's clients (FedKSeed, DeComFL, FeedSign) receive scalars, not the model:
    each upload of the first round (its scalars, read with the message's public seeds by the
    method's :attr:`~fedge.methods.spec.MethodSpec.seed_scalars`), whose model is the seeded
    initial one every client builds itself (``model`` is the message as sent: no model). A
    later round's model is the replay of the rounds before, which the attacks (round 1) do not
    rebuild. Refused under secure aggregation (:func:`check_seed_scalars_readable`)."""
    check_seed_scalars_readable(run.built)
    first = min((r.rnd for r in run.observer.records), default=1)
    return [v for v in server_views(run.observer.records) if v.rnd == first]


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


def upload_batch(mcfg: Any, local: int) -> int:
    """How many samples the upload depends on: fedsgd's batch, fedavg's batch (one step),
    BAFFLE's mini-batch or whole local set (``delta_loss_on``)."""
    size = getattr(mcfg, "batch_size", 0) or local
    if getattr(mcfg, "delta_loss_on", "batch") == "local_set":
        size = local
    return min(size, local)


def one_batch_clients(built: BuiltRun, seed: int = 0) -> BuiltRun:
    """``built`` with each client's local set cut to the samples one upload is computed on
    (the method's batch, drawn by a seeded permutation), so that "class c is in the batch"
    varies between clients and is known for each upload (the attack-instrumented run of
    ``fedge attack --attack pia``)."""
    from fedge.core.context import ClientData  # noqa: PLC0415

    cut: list[ClientData] = []
    for c in built.clients:
        b = upload_batch(built.method_config, c.num_samples)
        keep = c.indices[
            torch.randperm(c.num_samples, generator=generator(seed, "pia-cut", len(cut)))[:b]
        ]
        cut.append(ClientData(c.x, c.y, keep))
    return replace(built, clients=cut)


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
    draws: str | None = None,
) -> RunConfig:
    """A short run whose clients each hold exactly ``per_client`` samples; ``test`` test
    samples (the attacker's auxiliary data and non-members come from there); ``privacy``: the
    run's ``privacy:`` section (None: no DP); ``draws``: the run's generator (None: the
    config's default)."""
    return load_config(
        {
            **({"privacy": privacy} if privacy else {}),
            **({"draws": draws} if draws is not None else {}),
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


def os_random(raw: dict[str, Any]) -> str | None:
    """The config key that makes the run draw from the OS CSPRNG (so a re-run from its config
    is another run of the same protocol, not this one), or None."""
    if (raw.get("privacy") or {}).get("secure_noise"):
        return "privacy.secure_noise"
    dp = (raw.get("method") or {}).get("dp")
    if isinstance(dp, dict) and dp.get("secure_noise"):
        return "method.dp.secure_noise"
    return None


def warn_if_not_replayable(raw: dict[str, Any]) -> None:
    """These attacks re-run the run from its config (same seed, so the same uploads and
    models): not so when it drew its noise (and client sample) from the OS CSPRNG."""
    key = os_random(raw)
    if key is not None:
        warnings.warn(
            f"the run drew its noise from the OS CSPRNG ({key}: true), so re-running it from its config, as "
            "this attack does, gives another run of the same protocol and seed, not the saved one: the "
            "figures describe that re-run (its uploads, its intermediate models), not the run's exact "
            "messages",
            PrivacyWarning,
            stacklevel=2,
        )
