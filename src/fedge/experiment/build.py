"""From a validated :class:`RunConfig` to a ready-to-run :class:`Simulation`.

Everything that can fail on bad input (method keys, model options, dataset files,
partition parameters) fails here, before anything is written to disk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedge.core.config import RunConfig, validate_section
from fedge.core.context import ClientData
from fedge.core.rng import derive_seed
from fedge.data import Dataset, load_dataset
from fedge.data.partition import partition, partition_summary
from fedge.data.registry import resolve_dataset_options
from fedge.methods import get_method
from fedge.methods.base import MethodBuild, MethodEnv
from fedge.models import build_model
from fedge.runtime.engine import EngineConfig, Simulation

__all__ = ["BuiltRun", "build_run", "model_factory"]


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
            **opts,
        )

    return make


@dataclass
class BuiltRun:
    config: RunConfig
    dataset: Dataset
    parts: list[np.ndarray]
    partition_summary: dict[str, Any]
    method: MethodBuild
    method_config: Any
    clients: list[ClientData]
    model_fn: Callable[[], torch.nn.Module]

    def engine_config(self) -> EngineConfig:
        c = self.config
        return EngineConfig(
            seed=c.seed,
            rounds=c.rounds,
            per_round=c.clients.count(),
            eval_every=c.eval_every,
            eval_batch_size=c.eval_batch_size,
            workers=c.clients.workers,
            measure_flops=c.measure.flops,
            measure_memory=c.measure.memory,
        )

    def simulation(self, on_round: Any = None) -> Simulation:
        return Simulation(
            strategy=self.method.strategy,
            program=self.method.program,
            clients=self.clients,
            test=(self.dataset.x_test, self.dataset.y_test),
            num_classes=self.dataset.num_classes,
            config=self.engine_config(),
            parties=self.method.parties,
            on_round=on_round,
        )


def method_config(cfg: RunConfig) -> Any:
    """The ``method`` section validated by its method's config class (every default filled in)."""
    return validate_section(get_method(cfg.method.name).config, cfg.method.model_dump(), prefix="method.")


def build_run(cfg: RunConfig) -> BuiltRun:
    """Validate the choice-dependent sections and build data, partition, model and method."""
    spec = get_method(cfg.method.name)
    method_cfg = method_config(cfg)

    d = cfg.dataset
    # the dataset's own options, defaults filled in and paths absolute: config.yaml records
    # them, so `fedge run --resume` reloads a user's files (or function) in a fresh process
    data_options = resolve_dataset_options(d.name, d.options())
    dataset = load_dataset(
        d.name, root=d.root, resize=d.resize, limit_train=d.limit_train, limit_test=d.limit_test,
        seed=cfg.seed, **data_options,
    )
    if data_options != d.options():
        fixed = d.model_dump(exclude=set(d.options()))
        cfg = cfg.model_copy(update={"dataset": type(d).model_validate({**fixed, **data_options})})
    model_fn = model_factory(cfg, dataset)
    model_fn()  # validates model name and options now, before any data is split or written

    labels = dataset.y_train.numpy()
    p = cfg.partition
    parts = partition(
        p.name, labels, cfg.clients.num, seed=cfg.seed, domains=dataset.train_domains, **p.options()
    )
    summary = {
        "name": p.name,
        "params": p.options(),
        **partition_summary(parts, labels, dataset.num_classes),
    }
    clients = [
        ClientData(dataset.x_train, dataset.y_train, torch.as_tensor(np.asarray(idx), dtype=torch.int64))
        for idx in parts
    ]
    env = MethodEnv(
        seed=cfg.seed,
        model_fn=model_fn,
        num_classes=dataset.num_classes,
        input_shape=tuple(dataset.input_shape),
        client_sizes=tuple(len(idx) for idx in parts),
        rounds=cfg.rounds,
        workers=cfg.clients.workers,
    )
    method = spec.build(method_cfg, env)
    return BuiltRun(cfg, dataset, parts, summary, method, method_cfg, clients, model_fn)
