"""Typed run configuration, validated at the edge.

A run is described by one nested mapping (YAML preset or file, plus ``--set key=value``
overrides). The fixed sections are pydantic models with ``extra="forbid"``; the sections
whose keys depend on a choice (``partition``, ``model``, ``method``) are validated by the
chosen partitioner, model or method. Every problem becomes one :class:`ConfigError` that
names the dotted key, the bad value and the valid choices.

Example:
    >>> cfg = load_config("quickstart", overrides=["rounds=5", "method.local_epochs=2"])
    >>> cfg.rounds
    5
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from importlib import resources
from pathlib import Path, PurePath
from typing import Any, ClassVar, Literal

import torch
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from fedge.core.errors import ConfigError
from fedge.core.rng import generator

__all__ = [
    "ClientsConfig",
    "ConfigModel",
    "DatasetConfig",
    "MeasureConfig",
    "RunConfig",
    "apply_overrides",
    "check_finite",
    "check_positive_int",
    "describe_yaml_error",
    "format_validation_error",
    "load_config",
    "preset_names",
    "preset_path",
    "read_yaml",
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
    (``Strategy.eligible``: e.g. PPFL needs an enclave large enough for a layer)."""

    name: str
    fraction: float = Field(gt=0, le=1, description="share of the clients with this profile")
    memory_mb: float | None = Field(None, gt=0, description="device memory for training")
    enclave_mb: float | None = Field(
        None, ge=0, description="trusted-execution-environment memory (0: none)"
    )
    uplink_kbps: float | None = Field(None, gt=0)
    downlink_kbps: float | None = Field(None, gt=0)


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
    name: str = "iid"


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


class RunConfig(_Strict):
    """The whole run. Field order is the order keys are written to ``config.yaml``."""

    seed: int = 0
    rounds: int = Field(10, ge=1)
    eval_every: int = Field(
        1, ge=1, description="evaluate on the test set every N rounds (and after the last)"
    )
    eval_batch_size: int = Field(1000, ge=1)
    threads: int | None = Field(
        1,
        ge=1,
        description="torch intra-op threads of the engine's process (null: torch's default). 1 by default: "
        "two torch threads collapse 10-25x when the machine is shared, and the zeroth-order estimator "
        "uses the cores through its own perturbation threads",
    )
    clients: ClientsConfig = ClientsConfig()
    dataset: DatasetConfig = DatasetConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    method: MethodConfig = MethodConfig()
    measure: MeasureConfig = MeasureConfig()
    privacy: PrivacySection = PrivacySection()
    on_divergence: Literal["stop", "continue"] = Field(
        "stop",
        description="a round whose loss is non-finite or above 100·ln(classes): stop with an error naming the "
        "round and the keys to lower (stop), or log it and go on (continue)",
    )

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int) -> int:
        if not 0 <= v < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {v}")
        return v

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (the resolved config written to ``config.yaml``)."""
        return self.model_dump(mode="json")


# ---------------------------------------------------------------- presets and overrides


def _preset_dir() -> Path:
    return Path(str(resources.files("fedge") / "configs"))


def preset_names() -> list[str]:
    """Names of the YAML presets shipped with fedge."""
    return sorted(p.stem for p in _preset_dir().glob("*.yaml"))


def looks_like_path(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` was written as a path rather than a preset name: it has a
    directory separator (``runs/x``, ``./x``, ``x/``) or starts with a dot (``.x``, ``..``).
    Preset names are plain words. Read the text the user typed: a ``Path`` has already dropped a
    leading ``./`` and a trailing ``/``."""
    s = str(name_or_path)
    return "/" in s or os.sep in s or s.startswith(".")


def preset_path(name_or_path: str | Path) -> Path:
    """Resolve a preset name (``quickstart``) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if p.is_dir():
            run = (
                f" (to continue the run in it: fedge run --resume {p})"
                if (p / "config.yaml").is_file()
                else ""
            )
            raise ConfigError(f"config file {str(p)!r} is a directory; give a YAML file{run}")
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        return p
    if looks_like_path(name_or_path):
        raise ConfigError(
            f"config file {str(name_or_path)!r} does not exist; give a YAML file or a preset name "
            f"({', '.join(preset_names())})"
        )
    cand = _preset_dir() / f"{name_or_path}.yaml"
    if cand.is_file():
        return cand
    close = difflib.get_close_matches(str(name_or_path), preset_names(), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(
        f"unknown preset {str(name_or_path)!r}{hint}; expected a YAML file path or one of: "
        + ", ".join(preset_names())
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: PyYAML
    keeps the last silently, so a second ``method:`` section would replace the first whole."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if (
                key_node.tag == "tag:yaml.org,2002:merge"
            ):  # '<<: *base' merges; its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader names it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice, first on line {first}",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str) -> Any:
    """Parse config text: YAML as :func:`yaml.safe_load` reads it, but a repeated key is a
    :class:`yaml.YAMLError` (see :func:`describe_yaml_error`)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """``at line L, column C (problem)``: a YAML error on one line."""
    mark = getattr(exc, "problem_mark", None)
    where = f"at line {mark.line + 1}, column {mark.column + 1} " if mark is not None else ""
    return f"{where}({getattr(exc, 'problem', None) or exc.__class__.__name__})"


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


CHOICE_SECTIONS = ("partition", "model", "method")


def override_strings(overrides: Any) -> list[str]:
    """``KEY=VALUE`` strings from the overrides a caller gives: a list of such strings (``--set``),
    or a mapping (``{"rounds": 5, "method.client_optimizer.lr": 0.05}``, where a nested mapping
    such as ``{"method": {"local_epochs": 2}}`` sets the keys it names and keeps the section's
    others); values may be paths and numpy scalars. Anything else is a :class:`ConfigError`."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError(
            f"overrides={overrides!r} is one string; give a list of 'KEY=VALUE' strings "
            f"([{overrides!r}]) or a mapping ({{'rounds': 5}})"
        )
    if isinstance(overrides, Mapping):
        out: list[str] = []

        def add(prefix: str, mapping: Mapping[Any, Any]) -> None:
            for k, v in mapping.items():
                if not isinstance(k, str) or not k:
                    raise ConfigError(
                        f"overrides: key {k!r} is not a config key name; give keys such as 'rounds' or 'method.lr'"
                    )
                key = f"{prefix}{k}"
                if isinstance(v, Mapping) and v:
                    add(f"{key}.", v)
                    continue
                try:
                    text = json.dumps(v, default=_plain_value)  # JSON is YAML
                except (TypeError, ValueError):
                    raise ConfigError(
                        f"overrides: {key}={v!r} ({type(v).__name__}) is not a config value; give a "
                        "number, string, bool, None, or a list or mapping of them"
                    ) from None
                out.append(f"{key}={text}")

        add("", overrides)
        return out
    if isinstance(overrides, (list, tuple)) and all(isinstance(o, str) for o in overrides):
        return list(overrides)
    raise ConfigError(
        f"overrides={overrides!r}: expected a list of 'KEY=VALUE' strings or a mapping of keys to "
        "values, e.g. {'rounds': 5}"
    )


def path_argument(name: str, value: Any, *, what: str = "a path") -> Path:
    """``value`` (a caller's argument ``name``) as a path: a non-empty str or path-like, else a
    :class:`ConfigError` naming the argument."""
    if isinstance(value, (str, PurePath)) and str(value):
        return Path(value)
    raise ConfigError(
        f"{name}={value!r} ({type(value).__name__}): expected {what}, as a str or pathlib.Path"
    )


def _plain_value(v: Any) -> Any:
    """A path as its string, a numpy scalar or 0-d array as its Python value (for JSON)."""
    if isinstance(v, PurePath):
        return str(v)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "shape", None) == ():
        return item()
    raise TypeError(type(v).__name__)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML scalars) to a nested dict.

    Overriding the ``name`` of a choice section (``method.name=fedavg`` on a BAFFLE preset)
    switches to another component: the section's other keys from the file belong to the old
    choice and are dropped; the section's keys given as overrides are kept, in any order.
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, sub = key.strip().partition(".")
        if section in CHOICE_SECTIONS and sub == "name" and isinstance(out.get(section), dict):
            if out[section].get("name") != _parse_value(value):
                out[section] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set rounds=20")
        parts = key.strip().split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(
                    f"--set {item!r}: {'.'.join(parts[: i + 1])!r} is a value ({nxt!r}), not a section"
                )
            node = nxt
        node[parts[-1]] = _parse_value(value)
    return out


_NON_FINITE_TEXT = re.compile(r"^[+-]?(inf|infinity|nan)$", re.IGNORECASE)
#: Keys where +inf is a meaningful setting (DP's "no clipping", for the no-privacy oracle).
_INF_ALLOWED = frozenset({"privacy.clip"})


def check_finite(raw: Any, prefix: str = "") -> None:
    """Raise :class:`ConfigError` at the first non-finite number anywhere in a config mapping.

    Floats that are inf or nan, and strings a float field would read as such (``"inf"``,
    ``"-Infinity"``, ``"nan"``), are refused with the dotted key: no learning rate, sigma,
    clip or partition parameter can be non-finite, and catching it here (before any section
    is validated by its component) means no run directory is ever created for it."""
    if isinstance(raw, dict):
        for k, v in raw.items():
            check_finite(v, f"{prefix}{k}.")
    elif isinstance(raw, list | tuple):
        for i, v in enumerate(raw):
            check_finite(v, f"{prefix}{i}.")
    elif (isinstance(raw, float) and not math.isfinite(raw)) or (
        isinstance(raw, str) and _NON_FINITE_TEXT.match(raw.strip())
    ):
        key = prefix.rstrip(".") or "<root>"
        text = str(raw).strip().lower()
        if key in _INF_ALLOWED and text in ("inf", "+inf", "infinity", "+infinity"):
            return
        raise ConfigError(
            f"config key {key!r}: {raw!r} is not a finite number; give a finite value"
        )


def check_positive_int(what: str, value: object) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an int >= 1 (a bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (sub)model a validation error location points into."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return sorted(model.model_fields)


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], *, prefix: str = ""
) -> str:
    """One line per problem: ``config key 'a.b': <what is wrong> (got <value>)``."""
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        key = prefix + ".".join(str(p) for p in loc) if loc else prefix.rstrip(".") or "<root>"
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = (
                f" (did you mean {prefix}{'.'.join(map(str, loc[:-1] + (close[0],)))}?)"
                if close
                else ""
            )
            lines.append(f"unknown config key {key!r}{hint}; valid keys here: {', '.join(valid)}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            # a check of a whole section names its values itself, as do checks that say "got ...":
            # echoing the value again would be noise
            named = isinstance(got, dict) or f"got {got!r}" in msg or f"got {got}" in msg
            lines.append(f"config key {key!r}: {msg}" + ("" if named else f" (got {got!r})"))
    return "\n".join(lines)


def validate_section(model: type[BaseModel], data: dict[str, Any], *, prefix: str) -> BaseModel:
    """Validate ``data`` against ``model``; raise :class:`ConfigError` with dotted keys."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, prefix=prefix)) from None


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
        path = preset_path(source)
        try:
            raw = read_yaml(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {str(path)!r} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 YAML"
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"config file {str(path)!r} is not valid YAML {describe_yaml_error(exc)}; fix it"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"config file {str(path)!r} cannot be read: {exc.strerror or exc}"
            ) from None
        if raw is None:  # nothing but blanks and comments: a truncated or unsaved file, most likely
            raise ConfigError(
                f"config file {str(path)!r} holds no settings (empty, or only comments); write the "
                "keys to change, or '{}' to run every default on purpose"
            )
        if not isinstance(raw, dict):
            raise ConfigError(
                f"config file {str(path)!r} must hold a mapping, got {type(raw).__name__}"
            )
    raw = apply_overrides(raw, override_strings(overrides))
    check_finite(raw)
    cfg = validate_section(RunConfig, raw, prefix="")
    assert isinstance(cfg, RunConfig)
    return cfg
