"""The run configuration: typed models of its sections, and :func:`load_config`, the one place a
:class:`RunConfig` is made from a preset name, a YAML path or a mapping plus overrides.
Design notes: docs/decisions.md#core.

Example:
    >>> cfg = load_config("quickstart", overrides=["rounds=5", "method.local_epochs=2"])
    >>> cfg.rounds
    5
"""

from __future__ import annotations

import copy
import math
import os
import types
import typing
import warnings
from pathlib import Path, PurePath
from typing import Any, ClassVar, Literal

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from fedge.core.device import DEVICE_FORMS, check_device
from fedge.core.device_profiles import DEVICES, TIME_FIELDS, device_fields
from fedge.core.errors import ConfigError
from fedge.core.overrides import apply_overrides, override_strings
from fedge.core.presets import preset_path, read_config_file
from fedge.core.rng import Draws, generator
from fedge.core.validation import check_finite, check_positive_int, validate_section

__all__ = [
    "ClientsConfig",
    "ConfigModel",
    "DatasetConfig",
    "MAX_ROUNDS",
    "MeasureConfig",
    "RunConfig",
    "WarmStartConfig",
    "available_cores",
    "load_config",
    # re-exported for the modules that import them from here (experiment.build, experiment.run,
    # estimators.zeroth_order, pruning.saliency); their home is fedge.core.validation
    "check_finite",
    "check_positive_int",
    "validate_section",
]


def _takes_a_number(annotation: Any) -> bool:
    """Whether a field annotated so holds an int or float (alone or in a union), and no bool."""
    args = typing.get_args(annotation)
    kinds = (
        set(args)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else {annotation}
    )
    return bool(kinds & {int, float}) and bool not in kinds


class ConfigModel(BaseModel):
    """Base of every config model: pydantic's lax mode, except that a bool is not a number (it
    would pass as 1 or 0: ``rounds=True`` runs one round); numeric strings stay accepted (PyYAML
    reads ``1e-3`` as a string)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _takes_a_number(field.annotation):
            raise ValueError(f"expected a number, got {value!r} (a bool)")
        return value


class _Strict(ConfigModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class _Open(ConfigModel):
    """A section whose extra keys are checked later by the component it names."""

    model_config = ConfigDict(extra="allow")

    def options(self) -> dict[str, Any]:
        """The extra keys (everything but ``name`` and declared fields)."""
        return dict(self.model_extra or {})


class DeviceProfile(_Strict):
    """A kind of device in the population (``clients.profiles``): a share of the clients and
    what each such device offers. A method may sample only the devices that fit it
    (``Strategy.eligible``: e.g. PPFL needs an enclave large enough for a layer); the time
    model (``gflops``, ``uplink_kbps``, ``downlink_kbps``: :mod:`fedge.runtime.fleet`) turns
    each client's measured FLOPs and bytes into simulated seconds; ``memory_mb`` is checked
    against each client step's measured peak. ``device`` names one of
    :data:`fedge.core.device_profiles.DEVICES`, whose figures fill the fields not given here."""

    name: str = Field(description="the profile's name (default: its device's name)")
    device: str | None = Field(
        None,
        description="a named device (phone-high, phone-mid, phone-low, iot; figures and sources in "
        "docs/guide/scale.md): its gflops and link figures, each overridden by a field given here",
    )
    fraction: float = Field(gt=0, le=1, description="share of the clients with this profile")
    memory_mb: float | None = Field(
        None,
        gt=0,
        description="device memory for training in MiB: a client step whose measured tensor peak is "
        "larger warns, naming the profile (needs measure.memory=true)",
    )
    enclave_mb: float | None = Field(
        None,
        ge=0,
        description="trusted-execution-environment memory (0: none); read by methods that use an "
        "enclave (ppfl), refused by the others",
    )
    gflops: float | None = Field(
        None,
        gt=0,
        description="effective training speed in GFLOP/s: a client step's measured FLOPs over this is "
        "its simulated compute time (needs measure.flops=true)",
    )
    uplink_kbps: float | None = Field(
        None,
        gt=0,
        description="upload bandwidth in kbit/s (1 kbps = 1000 bit/s), for the time model",
    )
    downlink_kbps: float | None = Field(
        None, gt=0, description="download bandwidth in kbit/s, for the time model"
    )

    @model_validator(mode="before")
    @classmethod
    def _named_device(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("device") is not None:
            if not isinstance(data["device"], str) or data["device"] not in DEVICES:
                raise ValueError(
                    f"clients.profiles device={data['device']!r} is not a named device; "
                    f"give one of {sorted(DEVICES)} or the fields gflops, uplink_kbps, downlink_kbps"
                )
            figures = device_fields(data["device"])
            data = {**figures, **{k: v for k, v in data.items() if v is not None}}
            data.setdefault("name", data["device"])
        return data

    def gives_time(self) -> list[str]:
        """The time-model fields this profile gives."""
        return [f for f in TIME_FIELDS if getattr(self, f) is not None]


class ClientsConfig(_Strict):
    num: int = Field(10, ge=1, description="number of clients the data is split into")
    per_round: int | float = Field(
        10, description="clients sampled per round: a count, or a fraction in (0, 1]"
    )
    workers: int = Field(
        0, ge=0, description="client worker processes (0: run clients in this process)"
    )
    profiles: list[DeviceProfile] | None = Field(
        None,
        description="device kinds with their shares of the population (fractions summing to 1); null: all alike",
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="probability that a client addressed in an exchange drops out before replying (simulated, seeded)",
    )
    min_replies: int | None = Field(
        None,
        ge=1,
        description="replies an exchange needs to go on without the failed clients (null: every addressed client must reply)",
    )
    reply_timeout: float | None = Field(
        None,
        gt=0,
        description="Flower runtimes: seconds an exchange waits for its replies; a node not answering by then has failed (null: no limit)",
    )
    deadline_s: float | None = Field(
        None,
        gt=0,
        description="simulated seconds an exchange waits for replies (the time model of clients.profiles): "
        "a client finishing later is a straggler, its reply dropped through clients.min_replies (null: wait for all)",
    )
    over_select: float = Field(
        1.0,
        ge=1,
        description="sample ceil(over_select x clients.per_round) clients (at most clients.num) and aggregate "
        "the clients.per_round that finish first in simulated time; the rest are stragglers (1: no over-selection)",
    )

    @model_validator(mode="after")
    def _check_profiles(self) -> ClientsConfig:
        if self.profiles is not None:
            total = sum(p.fraction for p in self.profiles)
            if abs(total - 1) > 1e-9:
                raise ValueError(f"clients.profiles fractions sum to {total:g}; they must sum to 1")
            names = [p.name for p in self.profiles]
            if len(set(names)) != len(names):
                raise ValueError(f"clients.profiles names must be unique, got {names}")
        return self

    @model_validator(mode="after")
    def _check_time(self) -> ClientsConfig:
        on = self.time_model()
        if on:
            assert self.profiles is not None
            for p in self.profiles:
                missing = [f for f in TIME_FIELDS if getattr(p, f) is None]
                if missing:
                    raise ValueError(
                        f"clients.profiles entry {p.name!r} gives no {', '.join(missing)}: the time model "
                        "(on because a profile gives gflops, uplink_kbps or downlink_kbps) needs all three "
                        "of every profile; give them, or a named device (device: phone-mid)"
                    )
        for key, value, used in (
            ("deadline_s", self.deadline_s, self.deadline_s is not None),
            ("over_select", self.over_select, self.over_select > 1),
        ):
            if used and not on:
                raise ValueError(
                    f"clients.{key}={value:g} acts on simulated time, but no clients.profiles entry gives "
                    "the time model's gflops, uplink_kbps and downlink_kbps; give them (or a named device, "
                    f"device: phone-mid) or remove clients.{key}"
                )
            if used and self.min_replies is None:
                raise ValueError(
                    f"clients.{key}={value:g} drops stragglers' replies, but clients.min_replies is null "
                    "(every reply needed); set clients.min_replies, e.g. to half of clients.per_round"
                )
        return self

    def time_model(self) -> bool:
        """Whether the run simulates time: some profile gives a time-model field."""
        return any(p.gives_time() for p in self.profiles or ())

    def sampled(self) -> int:
        """Clients sampled per round: :meth:`count`, times ``over_select`` rounded up (at most
        ``num``)."""
        n = self.count()
        return min(self.num, max(n, math.ceil(self.over_select * n - 1e-9)))

    def assign_profiles(self, seed: int) -> list[dict[str, Any]] | None:
        """One profile per client id: counts by largest remainder, assigned by a seeded permutation."""
        if self.profiles is None:
            return None
        n = self.num
        exact = [p.fraction * n for p in self.profiles]
        counts = [int(x) for x in exact]
        for i in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[: n - sum(counts)]:
            counts[i] += 1
        kinds = [
            p.model_dump() for p, c in zip(self.profiles, counts, strict=True) for _ in range(c)
        ]
        order = torch.randperm(n, generator=generator(seed, "profiles")).tolist()
        return [kinds[order[c]] for c in range(n)]

    @model_validator(mode="after")
    def _check_per_round(self) -> ClientsConfig:
        m = self.per_round
        if isinstance(m, float):
            if not 0 < m <= 1:
                raise ValueError(
                    f"clients.per_round={m}: a float is a fraction and must be in (0, 1]; give an integer for a count"
                )
        elif not 1 <= m <= self.num:
            raise ValueError(
                f"clients.per_round={m} must be between 1 and clients.num={self.num}; "
                "lower clients.per_round or raise clients.num"
            )
        return self

    @model_validator(mode="after")
    def _check_failures(self) -> ClientsConfig:
        if self.dropout > 0 and self.min_replies is None:
            raise ValueError(
                f"clients.dropout={self.dropout:g} loses clients' replies, but clients.min_replies is null (every "
                "reply needed); set clients.min_replies, e.g. to half of clients.per_round"
            )
        if self.min_replies is not None and self.min_replies > self.count():
            raise ValueError(
                f"clients.min_replies={self.min_replies} exceeds the {self.count()} clients sampled per round "
                "(clients.per_round); lower clients.min_replies"
            )
        return self

    def count(self) -> int:
        """Clients per round as a count (a fraction rounds to the nearest count, at least 1)."""
        m = self.per_round
        return max(1, round(m * self.num)) if isinstance(m, float) else m


class DatasetConfig(_Open):
    """``dataset.*``: the fixed keys below, plus the chosen dataset's own options (``path``
    for ``npz``, ``split`` for ``emnist``, ...), checked by the dataset registry."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str = "digits"
    root: str | None = Field(None, description="directory holding the dataset's files")
    resize: int | None = Field(None, ge=4, description="resize images to resize x resize")
    limit_train: int | None = Field(
        None, ge=1, description="use a seeded subset of this many training samples"
    )
    limit_test: int | None = Field(
        None, ge=1, description="use a seeded subset of this many test samples"
    )
    validation: float | int | None = Field(
        None,
        description="hold out this fraction (0 < f < 1) or count of the training samples, class-stratified "
        "and seeded, as a validation set: evaluated every round (val_accuracy), never trained on; tune on it",
    )
    alpha: float | None = Field(
        None,
        ge=0,
        description="synthetic-fed: spread of the devices' models (FedProx's α; default 1)",
    )
    beta: float | None = Field(
        None,
        ge=0,
        description="synthetic-fed: spread of the devices' features (FedProx's β; default 1)",
    )
    max_samples: int | None = Field(
        None, ge=1, description="synthetic-fed: cap on one device's samples (default 2000)"
    )

    _FEDERATED_KEYS: ClassVar[tuple[str, ...]] = ("alpha", "beta", "max_samples")
    _FEDERATED_DEFAULTS: ClassVar[dict[str, Any]] = {"alpha": 1.0, "beta": 1.0, "max_samples": 2000}

    @model_validator(mode="after")
    def _validation_size(self) -> DatasetConfig:
        v = self.validation
        if v is not None and (
            isinstance(v, bool)
            or (isinstance(v, float) and not 0 < v < 1)
            or (isinstance(v, int) and v < 1)
        ):
            raise ValueError(
                f"dataset.validation={v!r}: give a fraction in (0, 1) or a count >= 1 of training samples"
            )
        return self

    @model_validator(mode="after")
    def _federated_keys(self) -> DatasetConfig:
        if self.name == "synthetic-fed":
            for k, v in self._FEDERATED_DEFAULTS.items():
                if getattr(self, k) is None:
                    object.__setattr__(self, k, v)
        else:
            given = [k for k in self._FEDERATED_KEYS if getattr(self, k) is not None]
            if given:
                raise ValueError(
                    f"dataset.{given[0]} applies to dataset.name=synthetic-fed only; remove it"
                )
        return self

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self.name != "synthetic-fed":
            for k in self._FEDERATED_KEYS:
                out.pop(k, None)
        return out


class PartitionConfig(_Open):
    """``partition.*``: the partitioner's name and its own parameters (checked by the
    partition registry), plus ``local_test``, which every partitioner takes."""

    name: str = "iid"
    local_test: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="hold out this fraction of each client's samples (round(f·n), at least 1 of a client "
        "with 2 or more, seeded per client) as its local test split, never trained on: the global model "
        "is evaluated on each every local_eval_every rounds, giving per-client accuracies and their "
        "mean, worst 10%, best 10% and variance (null: off)",
    )


class ModelConfig(_Open):
    name: str = "lenet"


class MethodConfig(_Open):
    name: str = "fedavg"


class PrivacySection(_Open):
    """``privacy.*``: differential privacy for methods that average client contributions;
    the keys besides ``mechanism`` are validated by :class:`fedge.privacy.dp.PrivacyConfig`."""

    mechanism: str = "none"


class MeasureConfig(_Strict):
    flops: bool = Field(True, description="count client FLOPs with torch's flop counter")
    memory: bool = Field(
        False, description="measure client peak memory (tensor accounting + peak RSS)"
    )


class WarmStartConfig(_Strict):
    """``warm_start.*``: the server pretrains the initial global model with backprop on a
    public split of the training set that no client gets, and federated training starts from
    it (:mod:`fedge.experiment.warm_start`); every method takes it, as its initial model."""

    public: int = Field(
        ge=1,
        description="training samples the server takes as its public set (class-stratified, seeded)",
    )
    source: Literal["split", "unused"] = Field(
        "split",
        description="where the public set comes from: split (off the run's training set, after "
        "dataset.validation; the clients are partitioned from the rest) or unused (from the training "
        "samples dataset.limit_train leaves out: the clients' data and the validation set stay "
        "exactly those of the run without warm_start)",
    )
    epochs: int = Field(1, ge=1, description="server pretraining epochs over the public set")
    lr: float = Field(0.01, gt=0, description="server pretraining learning rate")
    batch_size: int = Field(32, ge=1, description="server pretraining batch size")
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd",
        description="server pretraining optimizer: sgd (with momentum) or adam (betas 0.9, 0.999)",
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd's momentum (unused by adam)")


MAX_ROUNDS = 10_000_000


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


class RunConfig(_Strict):
    """The whole run. Field order is the order keys are written to ``config.yaml``."""

    seed: int = 0
    draws: Draws = Field(
        "portable",
        description="generator of every seeded draw another party rebuilds (model init, FedPT's frozen "
        "tensors, perturbation directions, NTK pruning's draws, the secure-aggregation graph, iid/shards/"
        "domain partitions): portable (Philox and exact arithmetic, the same bits on every CPU, OS and "
        "library version; dirichlet partitions stay numpy's) or torch (torch's and numpy's generators, "
        "bit-identical only on the same hardware and library versions; what every record made before "
        "portable became the default used, and what a recorded config without this key means)",
    )
    rounds: int = Field(
        10,
        ge=1,
        description=f"rounds to train, 1 to {MAX_ROUNDS:.0e}: that many rounds of a fast 0.1 s each "
        "take 12 days and write a ~5 GB metrics.jsonl, so a larger value is a typo (rounds=1e23)",
    )
    eval_every: int = Field(
        1, ge=1, description="evaluate on the test set every N rounds (and after the last)"
    )
    local_eval_every: int | None = Field(
        None,
        ge=1,
        description="evaluate the global model on every client's local test split (partition.local_test) "
        "every N rounds and after the last (null: on the rounds the test set is evaluated, eval_every)",
    )
    eval_batch_size: int = Field(1000, ge=1)
    threads: int | None = Field(
        1,
        ge=1,
        description="torch intra-op threads while the run builds (warm start, pruning masks) and trains, "
        "whatever the calling process uses; results may depend on it, since float sums add in another "
        "order (null: the caller's). 1 by default: two torch threads collapse 10-25x when the machine is "
        "shared, and the zeroth-order estimator uses the cores through its own perturbation threads",
    )
    device: str = Field(
        "cpu",
        description=f"where the simulation's models, batches and estimator tensors live: {DEVICE_FORMS}; "
        "messages still travel as CPU bytes. cuda needs a visible CUDA device (docs/guide/gpu.md)",
    )
    clients: ClientsConfig = ClientsConfig()
    dataset: DatasetConfig = DatasetConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    method: MethodConfig = MethodConfig()
    measure: MeasureConfig = MeasureConfig()
    privacy: PrivacySection = PrivacySection()
    warm_start: WarmStartConfig | None = Field(
        None,
        description="server pretraining on a public split before round 1 (null: the clients start "
        "from the seeded initial model)",
    )
    on_divergence: Literal["stop", "continue"] = Field(
        "stop",
        description="a round whose loss is non-finite or above 100·ln(classes): stop with an error naming the "
        "round and the keys to lower (stop), or log it and go on (continue)",
    )

    @field_validator("rounds")
    @classmethod
    def _rounds_bound(cls, v: int) -> int:
        if v > MAX_ROUNDS:
            raise ValueError(
                f"rounds must be at most {MAX_ROUNDS:,}, got {v}: that many rounds of even 0.1 s each "
                "would take over 12 days (a typo such as rounds=1e23?); give the rounds to train, "
                "e.g. rounds=100"
            )
        return v

    @field_validator("threads")
    @classmethod
    def _threads_within_cores(cls, v: int | None) -> int | None:
        cores = available_cores()
        if v is not None and v > cores:
            warnings.warn(
                f"threads={v} is more than the {cores} cores this process may use: torch threads "
                f"beyond the cores wait on each other and slow every round; set threads to at most "
                f"{cores} (1, the default, is the fastest on a shared machine)",
                UserWarning,
                stacklevel=2,
            )
        return v

    @field_validator("device")
    @classmethod
    def _device_visible(cls, v: str) -> str:
        return check_device(v)

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int) -> int:
        if not 0 <= v < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {v}")
        return v

    @model_validator(mode="after")
    def _profile_fields_measured(self) -> RunConfig:
        """A profile field whose check needs a measurement the run does not make is unused:
        refused, naming it (the time model needs FLOPs; ``memory_mb`` the memory peak)."""
        if self.clients.time_model() and not self.measure.flops:
            raise ValueError(
                "clients.profiles give the time model's gflops, but measure.flops=false counts no FLOPs "
                "to turn into compute time; set measure.flops=true or remove gflops, uplink_kbps and "
                "downlink_kbps (and any device) from clients.profiles"
            )
        for p in self.clients.profiles or ():
            if p.memory_mb is not None and not self.measure.memory:
                raise ValueError(
                    f"clients.profiles entry {p.name!r} gives memory_mb={p.memory_mb:g}, which nothing uses: "
                    "it is checked against each client step's measured peak, and measure.memory=false "
                    "measures none; set measure.memory=true or remove memory_mb"
                )
        return self

    @model_validator(mode="after")
    def _local_eval_read(self) -> RunConfig:
        """``local_eval_every`` is read only when clients hold out local test splits."""
        if self.local_eval_every is not None and self.partition.local_test is None:
            raise ValueError(
                f"local_eval_every={self.local_eval_every} sets how often each client's local test split "
                "is evaluated, but partition.local_test is null (no client holds one out); set "
                "partition.local_test=0.2 (say) or remove local_eval_every"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_no_warm_start(self, handler: Any) -> dict[str, Any]:
        # a run without a warm start writes no warm_start key: its config.yaml, and every record
        # made before the key existed, compare equal to what this version resolves
        out: dict[str, Any] = handler(self)
        if self.warm_start is None:
            out.pop("warm_start", None)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (the resolved config written to ``config.yaml``)."""
        return self.model_dump(mode="json")


def load_config(source: str | Path | dict[str, Any], *, overrides: Any = None) -> RunConfig:
    """Load a preset name, YAML path or dict, apply overrides and validate the fixed sections.

    The choice-dependent sections (partition, model, method) are validated by
    :func:`fedge.experiment.build.build_run`, which knows the registries.
    """
    if isinstance(source, dict):
        raw = copy.deepcopy(source)
    elif not isinstance(source, (str, PurePath)) or not str(source):
        raise ConfigError(
            f"config {source!r} ({type(source).__name__}): expected a preset name, a YAML path or a "
            "mapping of config keys"
        )
    else:
        raw = read_config_file(preset_path(source))
    raw = apply_overrides(raw, override_strings(overrides))
    check_finite(raw)
    cfg = validate_section(RunConfig, raw, prefix="")
    assert isinstance(cfg, RunConfig)
    return cfg
