"""From a validated :class:`RunConfig` to a ready-to-run :class:`Simulation`.

Everything that can fail on bad input (method keys, model options, dataset files,
partition parameters) fails here, before anything is written to disk.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic_core import PydanticSerializationError

from fedge.core.config import RunConfig, validate_section
from fedge.core.context import ClientData
from fedge.core.device import full_float32, resolve_device
from fedge.core.errors import ConfigError, PrivacyWarning, UnknownNameError
from fedge.core.rng import derive_seed, numpy_rng
from fedge.core.threads import torch_threads
from fedge.data import Dataset, load_dataset
from fedge.data.dataset import stratified_subset
from fedge.data.federated import LazyClients, SyntheticFederated
from fedge.data.partition import PARTITIONERS, partition, partition_summary
from fedge.data.partition.holdout import split_local_tests
from fedge.data.registry import resolve_dataset_options
from fedge.experiment.warm_start import WarmStart, warm_start
from fedge.methods import get_method
from fedge.methods.base import MethodBuild, MethodEnv
from fedge.methods.compose import check_privacy, compose, refuse_unsupported
from fedge.models import build_model
from fedge.privacy.dp.config import PrivacyConfig
from fedge.runtime.engine import EngineConfig, Simulation
from fedge.runtime.spec import Runtime

__all__ = [
    "BuiltRun",
    "build_run",
    "client_shard",
    "configured_client_app",
    "model_factory",
    "node_app_for",
    "resolved_config",
]

FEDERATED = (
    "synthetic-fed"  # the dataset whose clients are generated on demand (fedge.data.federated)
)


def model_factory(cfg: RunConfig, dataset: Dataset) -> Callable[[], torch.nn.Module]:
    """A function building the run's initial global model: same weights on every call
    (initialized from a generator derived from the run seed, never the global RNG)."""
    m = cfg.model
    opts = m.options()
    init_seed = derive_seed(cfg.seed, "model-init")

    def make() -> torch.nn.Module:
        return build_model(
            m.name,
            input_shape=tuple(dataset.input_shape),
            num_classes=dataset.num_classes,
            seed=init_seed,
            draws=cfg.draws,
            **opts,
        )

    return make


def on_device(
    model_fn: Callable[[], torch.nn.Module], device: torch.device
) -> Callable[[], torch.nn.Module]:
    """``model_fn`` building its model on ``device`` (itself on the CPU): built on the CPU,
    where its seeded initialization is drawn, then moved, so a GPU run starts from the CPU
    run's weights."""
    if device.type == "cpu":
        return model_fn

    def make() -> torch.nn.Module:
        return model_fn().to(device)

    return make


def check_device_support(cfg: RunConfig, device: torch.device, *, accelerators: bool) -> None:
    """Refuse a run on a device other than the CPU that cannot run there yet: a method whose
    tensors do not all follow ``device`` (:attr:`Capabilities.accelerators`), or forked client
    workers (CUDA does not survive a fork). The composed mechanisms run where they did: secure
    aggregation and DP on the uploads and aggregates, which are CPU tensors (the clients' uploads
    leave the device when made), freezing and the EMA with the model."""
    if device.type == "cpu":
        return
    fix = "set device=cpu"
    if not accelerators:
        raise ConfigError(
            f"device={cfg.device!r} ({device}): method {cfg.method.name!r} runs on the CPU only "
            "for now (its tensors are not yet placed on the run's device everywhere); fedavg, "
            f"fedsgd and baffle run on a GPU; {fix}"
        )
    if cfg.clients.workers:
        raise ConfigError(
            f"device={cfg.device!r} ({device}) with clients.workers={cfg.clients.workers}: "
            "forked worker processes cannot use CUDA; set clients.workers=0 (the GPU runs the "
            f"clients one after another in this process), or {fix}"
        )


@dataclass
class BuiltRun:
    config: RunConfig
    dataset: Dataset
    parts: list[np.ndarray]
    partition_summary: dict[str, Any]
    method: MethodBuild
    method_config: Any
    clients: Sequence[ClientData]
    model_fn: Callable[[], torch.nn.Module]
    validation: tuple[torch.Tensor, torch.Tensor] | None = None
    #: where the simulation runs (``config.device`` resolved); ``model_fn`` still builds on the CPU
    device: torch.device = torch.device("cpu")
    # per client, its local test split (partition.local_test); None: no client holds one out
    local_tests: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None
    #: the server's pretrained start (``warm_start``; ``model_fn`` builds it); None: no warm start
    warm_start: WarmStart | None = None

    def engine_config(self) -> EngineConfig:
        c = self.config
        return EngineConfig(
            seed=c.seed,
            rounds=c.rounds,
            per_round=c.clients.sampled(),
            eval_every=c.eval_every,
            local_eval_every=c.local_eval_every,
            eval_batch_size=c.eval_batch_size,
            workers=c.clients.workers,
            measure_flops=c.measure.flops,
            measure_memory=c.measure.memory,
            dropout=c.clients.dropout,
            min_replies=c.clients.min_replies,
            draws=c.draws,
            time_model=c.clients.time_model(),
            deadline_s=c.clients.deadline_s,
            keep_first=c.clients.count() if c.clients.sampled() > c.clients.count() else None,
            device=self.device,
        )

    def simulation(self, on_round: Any = None, runtime: Runtime | str = "engine") -> Simulation:
        """The engine for this run on ``runtime`` (:class:`~fedge.runtime.spec.Runtime`, or its
        name): the built-in one (``engine``), or the same rounds with client steps sent through
        Flower (``flower-sim``: simulated Flower nodes, run by its backend; ``flower``: its
        Grid, inside a deployed ServerApp; :mod:`fedge.runtime.flower`)."""
        rt = Runtime.of(runtime).ready()
        cl = self.config.clients
        if rt.name != "engine" and (cl.deadline_s is not None or cl.over_select > 1):
            raise ConfigError(
                f"clients.deadline_s / clients.over_select drop stragglers by undoing their steps, which "
                f"only the engine can (on {rt.name} the client states live on the nodes); run with "
                "--runtime engine, or remove them (simulated time is still logged)"
            )
        if rt.name != "engine" and self.device.type != "cpu":
            raise ConfigError(
                f"device={self.config.device!r} ({self.device}) runs on the engine runtime only for "
                f"now: Flower nodes ({rt.name}) run their clients on the CPU; use --runtime "
                "engine, or set device=cpu"
            )
        cls: Any = Simulation
        extra: dict[str, Any] = {}
        if rt.name != "engine":
            from fedge.runtime.flower import flower_simulation

            cls = flower_simulation
            extra.update(
                grid=rt.grid,
                backend=rt.backend,
                timeout=self.config.clients.reply_timeout,
                rebuilt=self.method.rebuilt,
            )
            if rt.backend == "ray":
                import json  # the actors build their clients from the config (a small pickle)

                extra["node_app"] = configured_client_app(json.dumps(self.config.to_dict()))
        return cls(
            **extra,
            strategy=self.method.strategy,
            program=self.method.program,
            clients=self.clients,
            test=(self.dataset.x_test, self.dataset.y_test),
            validation=self.validation,
            local_tests=self.local_tests,
            num_classes=self.dataset.num_classes,
            config=self.engine_config(),
            parties=self.method.parties,
            profiles=self.config.clients.assign_profiles(self.config.seed),
            on_round=on_round,
        )


def hold_out_validation(
    dataset: Dataset, size: float | int, *, seed: int
) -> tuple[Dataset, tuple[torch.Tensor, torch.Tensor]]:
    """Split a class-stratified, seeded validation set off the training data: the clients are
    partitioned from what remains, and the engine evaluates the model on it every round, so
    tuning choices can be made without looking at the test set."""
    n = len(dataset.y_train)
    count = round(size * n) if isinstance(size, float) else int(size)
    if not 1 <= count < n:
        raise ConfigError(
            f"dataset.validation={size!r} holds out {count} of {n} training samples; "
            "it must leave at least one for training and take at least one"
        )
    held = stratified_subset(dataset.y_train.numpy(), count, numpy_rng(seed, "validation"))
    keep = np.ones(n, dtype=bool)
    keep[held] = False
    idx_keep, idx_held = torch.from_numpy(np.flatnonzero(keep)), torch.from_numpy(held)
    domains = None if dataset.train_domains is None else dataset.train_domains[keep]
    train = dataclasses.replace(
        dataset,
        x_train=dataset.x_train[idx_keep],
        y_train=dataset.y_train[idx_keep],
        train_domains=domains,
    )
    return train, (dataset.x_train[idx_held], dataset.y_train[idx_held])


def with_dataset_options(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the dataset's own options resolved (defaults filled in, paths absolute):
    config.yaml records them, so `fedge run --resume` reloads a user's files (or function) in a
    fresh process, and a config compares equal to the run directory it produced."""
    d = cfg.dataset
    if d.name == FEDERATED:
        return cfg
    try:
        data_options = resolve_dataset_options(d.name, d.options())
    except UnknownNameError as exc:  # the generated population is a dataset name too
        raise UnknownNameError(exc.kind, exc.name, [*exc.choices, FEDERATED]) from None
    if data_options == d.options():
        return cfg
    fixed = d.model_dump(exclude=set(d.options()))
    return cfg.model_copy(update={"dataset": type(d).model_validate({**fixed, **data_options})})


def privacy_config(cfg: RunConfig) -> PrivacyConfig:
    """The ``privacy`` section validated by :class:`~fedge.privacy.dp.PrivacyConfig`."""
    return validate_section(PrivacyConfig, cfg.privacy.model_dump(), prefix="privacy.")  # type: ignore[return-value]


def method_config(cfg: RunConfig) -> Any:
    """The ``method`` section validated by its method's section model (its own config plus the
    options of the mechanisms it supports: :func:`fedge.methods.compose.section_model`), every
    default filled in; a mechanism's key the method cannot take is refused with the reason."""
    spec = get_method(cfg.method.name)
    data = cfg.method.model_dump()
    refuse_unsupported(spec, data)
    assert spec.section is not None  # filled in by the registry
    return validate_section(spec.section, data, prefix="method.")


def resolved_config(built: BuiltRun | RunConfig) -> dict[str, Any]:
    """The config with every default filled in (what ``config.yaml`` holds); from a built run, or
    from a config alone (validating its method section, without loading data)."""
    if isinstance(built, BuiltRun):
        cfg, method_cfg = built.config, built.method_config
    else:
        cfg, method_cfg = with_dataset_options(built), method_config(built)
    try:
        out = cfg.to_dict()
        out["method"] = method_cfg.model_dump(mode="json")
        out["privacy"] = privacy_config(cfg).model_dump(mode="json")
    except (
        PydanticSerializationError
    ) as exc:  # e.g. a registered function's default of a numpy type
        raise ConfigError(
            f"the run's config cannot be written to config.yaml ({exc}); give plain values (int, "
            "float, str, bool, lists and mappings of them), e.g. float(x) for a numpy number"
        ) from None
    return out


def _synthetic_federated(cfg: RunConfig) -> SyntheticFederated:
    d = cfg.dataset
    # DatasetConfig fills the defaults of these keys for synthetic-fed, so none is None here
    assert d.alpha is not None and d.beta is not None and d.max_samples is not None
    return SyntheticFederated(
        cfg.clients.num, cfg.seed, alpha=d.alpha, beta=d.beta, max_samples=d.max_samples
    )


def rebuild_run(cfg: RunConfig) -> BuiltRun:
    """:func:`build_run` for a recorded run (resume, export, ``.model``): a name it cannot find
    may be one registered from Python in the process that trained it, so the error says so."""
    try:
        return build_run(cfg)
    except UnknownNameError as exc:
        raise UnknownNameError(
            exc.kind,
            exc.name,
            exc.choices,
            hint=f"if the run used a {exc.kind} registered from Python, register it again in this "
            "process first (fedge.register_model, fedge.register_dataset, ...)",
        ) from None


def build_run(cfg: RunConfig) -> BuiltRun:
    """Validate the choice-dependent sections and build data, partition, model and method, under
    ``cfg.threads`` torch threads: what the build computes (warm start, pruning masks) must not
    depend on the calling process's thread count (:mod:`fedge.core.threads`)."""
    with torch_threads(cfg.threads):
        return _build_run(cfg)


def _build_run(cfg: RunConfig) -> BuiltRun:
    spec = get_method(cfg.method.name)
    method_cfg = method_config(cfg)
    privacy = privacy_config(cfg)
    check_privacy(spec, privacy)
    device = resolve_device(cfg.device)

    d = cfg.dataset
    clients: Sequence[ClientData]
    if d.name == FEDERATED:  # clients generated on demand: nothing per client is built up front
        fed = _synthetic_federated(cfg)
        x_test, y_test = fed.test_set()
        dataset = Dataset(
            FEDERATED,
            x_test[:0],
            y_test[:0],
            x_test,
            y_test,
            fed.num_classes,
            fed.input_shape,
            tuple(str(c) for c in range(fed.num_classes)),
            source="generated",
        )
        if cfg.partition.local_test is not None:
            raise ConfigError(
                f"partition.local_test={cfg.partition.local_test} holds out part of each client's shard, "
                f"but {FEDERATED} generates its clients on demand and evaluates on fresh draws from "
                "its devices (its test set); remove partition.local_test"
            )
        lazy = LazyClients(fed)
        clients, sizes, parts, summary = lazy, lazy.sizes(), [], fed.summary()
    else:
        cfg = with_dataset_options(cfg)
        d = cfg.dataset
        dataset = load_dataset(
            d.name,
            root=d.root,
            resize=d.resize,
            limit_train=d.limit_train,
            limit_test=d.limit_test,
            seed=cfg.seed,
            **d.options(),
        )
    validation = None
    local_tests: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None
    if d.validation is not None:
        dataset, validation = hold_out_validation(dataset, d.validation, seed=cfg.seed)
    model_fn = model_factory(cfg, dataset)
    model_fn()  # validates model name and options now, before any data is split or written
    warm: WarmStart | None = None
    if cfg.warm_start is not None:
        if d.name == FEDERATED:
            raise ConfigError(
                f"warm_start needs a training set to take its public split from, but {FEDERATED} "
                "generates its clients on demand and has none; remove warm_start"
            )
        # the clients are partitioned from what the public split leaves
        dataset, warm = warm_start(cfg, dataset, model_fn, device)
        model_fn = warm.model_fn(model_fn)

    if d.name != FEDERATED:
        labels = dataset.y_train.numpy()
        p = cfg.partition
        pspec = PARTITIONERS.get(p.name)
        if cfg.draws == "portable" and pspec is not None and not pspec.portable:
            warnings.warn(
                f"draws=portable with partition.name={p.name!r}: this partitioner is drawn with numpy's "
                "generator, not portably (Dirichlet proportions need gamma variates, whose log/exp "
                "are not exactly rounded), so the split may differ between machines; the model init, "
                "perturbations, masks and graphs are still portable. Use partition.name=shards (or "
                "iid) for a split that is the same everywhere",
                UserWarning,
                stacklevel=2,
            )
        parts = partition(
            p.name,
            labels,
            cfg.clients.num,
            seed=cfg.seed,
            domains=dataset.train_domains,
            draws=cfg.draws,
            **p.options(),
        )
        held: list[np.ndarray] = []
        if p.local_test is not None:
            parts, held = split_local_tests(parts, p.local_test, seed=cfg.seed, draws=cfg.draws)
            local_tests = [
                (dataset.x_train[t], dataset.y_train[t]) if len(t) else None
                for t in (torch.as_tensor(h, dtype=torch.int64) for h in held)
            ]
        summary = {
            "name": p.name,
            "params": p.options(),
            **partition_summary(parts, labels, dataset.num_classes),
        }
        if held:  # the training shards above; what each client holds out beside them
            summary["local_test"] = {
                "fraction": p.local_test,
                "num_samples": int(sum(len(h) for h in held)),
                "clients": [int(len(h)) for h in held],
            }
        # on a GPU the clients share one copy of the training set there (moved once, not per step)
        x_train, y_train = dataset.x_train.to(device), dataset.y_train.to(device)
        clients = [
            ClientData(x_train, y_train, torch.as_tensor(np.asarray(idx), dtype=torch.int64))
            for idx in parts
        ]
        sizes = tuple(len(idx) for idx in parts)
    env = MethodEnv(
        seed=cfg.seed,
        model_fn=on_device(model_fn, device),
        num_classes=dataset.num_classes,
        input_shape=tuple(dataset.input_shape),
        client_sizes=sizes,
        rounds=cfg.rounds,
        workers=cfg.clients.workers,
        per_round=cfg.clients.count(),
        privacy=privacy,
        draws=cfg.draws,
        device=device,
        profiles=cfg.clients.assign_profiles(cfg.seed),
        seeded_start=warm is None,
    )
    # before anything is built on the device
    check_device_support(cfg, device, accelerators=spec.capabilities.accelerators)
    full_float32(device)
    method = compose(spec, method_cfg, env)
    if cfg.clients.min_replies is not None and not method.strategy.partial_replies:
        # name the strategy that needs every reply: the method's own, unless a mechanism does
        inner = (
            method.bare
            if method.bare is not None and not method.bare.partial_replies
            else method.strategy
        )
        raise ConfigError(
            f"clients.min_replies={cfg.clients.min_replies}: method {cfg.method.name!r} with this configuration needs "
            f"every addressed client's reply ({type(inner).__name__} cannot aggregate a subset), so a round "
            "cannot go on without the failed clients; set clients.min_replies=null and clients.dropout=0"
        )
    check_profile_fields(cfg, method)
    if privacy.enabled and privacy.sampling == "poisson" and cfg.clients.min_replies is not None:
        warnings.warn(
            f"privacy.sampling=poisson with clients.min_replies={cfg.clients.min_replies}: whether a round is skipped "
            "depends on how many clients it sampled, which one client's presence changes; the accountant counts a "
            "skipped round as no release and does not cover that. Use privacy.sampling=fixed or shuffle (a round's "
            "size does not depend on any one client), or set clients.min_replies=null",
            PrivacyWarning,
            stacklevel=2,
        )
    return BuiltRun(
        cfg,
        dataset,
        parts,
        summary,
        method,
        method_cfg,
        clients,
        model_fn,
        validation,
        device,
        local_tests,
        warm,
    )


def check_profile_fields(cfg: RunConfig, method: MethodBuild) -> None:
    """Refuse what ``clients.profiles`` give that this run cannot use: a field that neither
    the engine (the time model, ``memory_mb``) nor the method (:attr:`Strategy.profile_fields`,
    e.g. PPFL's ``enclave_mb``) reads, and a deadline or over-selection the method cannot
    honour (its own client draw, a shared side party whose state a straggler's step changes)."""
    clients = cfg.clients
    reads = method.strategy.profile_fields
    for p in clients.profiles or ():
        if p.enclave_mb is not None and "enclave_mb" not in reads:
            raise ConfigError(
                f"clients.profiles entry {p.name!r} gives enclave_mb={p.enclave_mb:g}, which nothing in this "
                f"run uses: method {cfg.method.name!r} reads no enclave size (ppfl does); remove enclave_mb"
            )
    if clients.deadline_s is None and clients.over_select <= 1:
        return
    key = "clients.over_select" if clients.over_select > 1 else "clients.deadline_s"
    if clients.over_select > 1 and cfg.privacy.mechanism != "none":
        raise ConfigError(
            f"clients.over_select={clients.over_select:g} with privacy.mechanism={cfg.privacy.mechanism!r}: the "
            "privacy accountant counts the clients sampled per round, which over-selection changes after the "
            "draw; remove clients.over_select (clients.deadline_s alone drops stragglers as dropouts)"
        )
    shared = [n for n, spec in method.parties.items() if spec.scope == "shared"]
    if shared:
        raise ConfigError(
            f"{key} drops stragglers by undoing their steps, but method {cfg.method.name!r} keeps shared side "
            f"party state ({', '.join(shared)}) that a straggler's step may have changed; remove {key}"
        )


def client_shard(cfg: RunConfig, cid: int) -> dict[str, Any]:
    """One client's shard of a run's population: its sample count and label histogram (for a
    lazily generated population, made from (seed, client) without building any other client)."""
    if not 0 <= cid < cfg.clients.num:
        raise ConfigError(f"client {cid} is outside the population [0, {cfg.clients.num})")
    d = cfg.dataset
    if d.name == FEDERATED:
        fed = _synthetic_federated(cfg)
        _, y = fed.client(cid)
        num_classes = fed.num_classes
    else:
        built = build_run(cfg)
        y = built.clients[cid].tensors()[1]
        num_classes = built.dataset.num_classes
    counts = torch.bincount(y, minlength=num_classes).tolist()
    return {"client": cid, "samples": int(y.numel()), "label_counts": counts}


# ---- Flower nodes that build their client from the run's config ----------------------------------

_NODE_APPS: dict[str, Any] = {}  # config text -> (built run, ClientApp), one per process


def node_app_for(config_text: str) -> Any:
    """The Flower ClientApp (:func:`fedge.runtime.flower.client_app`) of the run whose config is
    ``config_text`` (JSON of ``cfg.to_dict()``): its data, partition and method are built once
    per process, the same as the server's (everything derives from the config and seed)."""
    if config_text not in _NODE_APPS:
        import json

        from fedge.core.config import load_config
        from fedge.runtime.flower import client_app

        built = build_run(load_config(json.loads(config_text)))
        c = built.config
        if c.threads is not None:
            # this node process is the run's client side: the run's torch threads, as the engine
            # uses (2 threads sum conv gradients in another order)
            torch.set_num_threads(c.threads)
        app = client_app(
            built.method.program,
            built.clients.__getitem__,
            seed=c.seed,
            measure_flops=c.measure.flops,
            measure_memory=c.measure.memory,
            parties=built.method.parties,
            rebuilt=built.method.rebuilt,
        )
        _NODE_APPS.clear()
        _NODE_APPS[config_text] = (built, app)
    return _NODE_APPS[config_text][1]


class _Configured:
    """A ClientApp handler for one run's config: small to pickle (the config text; the class by
    reference), and it builds the run's data and method once per process (:func:`node_app_for`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, msg: Any, context: Any) -> Any:
        return node_app_for(self.text)(msg, context)


def configured_client_app(config_text: str) -> Any:
    """A Flower ClientApp for the run whose config is ``config_text``, for nodes whose
    ``run_config`` does not carry it, e.g. Flower's simulation engine, which pickles the
    ClientApp to its Ray actors with every message (this one pickles to the config text)."""
    from flwr.clientapp import ClientApp

    from fedge.runtime.flower.adapter import STATE_GET, STATE_SET

    app = ClientApp()
    handler = _Configured(config_text)
    app.query()(handler)
    app.query(STATE_GET)(handler)
    app.query(STATE_SET)(handler)
    app.train()(handler)
    return app
