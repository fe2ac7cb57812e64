"""The model registry: ``build_model``, ``model_names``, ``model_info``, ``list_models`` and
:func:`register_model`, with the :class:`Network` layout every model follows. Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
from pydantic import AllowInfNan, BeforeValidator, ConfigDict, Strict, create_model
from torch import nn

from fedge.core.config import ConfigModel
from fedge.core.errors import ConfigError
from fedge.core.registry import Registry, validate_options
from fedge.core.rng import Draws, check_draws
from fedge.models.initialization import portable_reset_parameters, reset_parameters
from fedge.models.layers import ACTIVATIONS, NORMS, InputTooSmallError, output_shape

__all__ = [
    "Flag",
    "Int",
    "ModelInfo",
    "ModelOptions",
    "ModelSpec",
    "Network",
    "Number",
    "Widths",
    "build_model",
    "count_parameters",
    "list_models",
    "model_info",
    "model_names",
    "register_model",
]

Shape = tuple[int, ...]  # (C, H, W) for images; (F,) for tabular features (models that flatten)
Builder = Callable[..., tuple[nn.Sequential, nn.Sequential]]

_MAX_SIDE = 4096  # the largest square side the minimum-size search tries


def _positive_ints(value: Any) -> tuple[int, ...]:
    ok = isinstance(value, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    )
    if not ok:
        raise ValueError("expected a sequence of positive ints")
    return tuple(value)


#: Option types with the registry's strictness: no bool for an int, no string for a bool,
#: finite floats (ints accepted), and lists of positive ints read from YAML become tuples.
Flag = Annotated[bool, Strict()]
Int = Annotated[int, Strict()]
Number = Annotated[
    float,
    AllowInfNan(False),
    BeforeValidator(
        lambda v: (
            v
            if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool))
            else _raise_number(v)
        )
    ),
]
Widths = Annotated[tuple[int, ...], BeforeValidator(_positive_ints)]


def _raise_number(value: Any) -> float:
    raise ValueError("expected a float")


class ModelOptions(ConfigModel):
    """Base of a model's options config: one field per model-specific option, with its default.

    Subclass it next to the builder (``class LeNetOptions(ModelOptions): channels: Widths =
    (16, 64)``) and pass it to :func:`register_model`; ``activation``/``norm`` are common and
    not declared here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def options_config(name: str, defaults: Mapping[str, Any]) -> type[ModelOptions]:
    """An options config built from ``{option: default}`` (types follow the defaults)."""

    def typ(default: Any) -> Any:
        if isinstance(default, bool):
            return Flag
        if isinstance(default, int):
            return Int
        if isinstance(default, float):
            return Number
        if isinstance(default, tuple):
            return Widths
        return type(default)

    fields: dict[str, Any] = {k: (typ(v), v) for k, v in defaults.items()}
    return create_model(f"{name}Options", __base__=ModelOptions, **fields)


@dataclass(frozen=True)
class ModelInfo:
    """What ``fedge models`` shows about a registered model."""

    name: str
    description: str
    reference: str  # the paper (seed file and section) and/or code it follows
    activations: tuple[str, ...]  # accepted values of ``activation``; () = takes none
    norms: tuple[str, ...]  # accepted values of ``norm``
    default_activation: str | None
    default_norm: str
    options: dict[str, Any]  # model-specific option -> default
    input_shapes: tuple[Shape, ...]  # shapes it is documented (and tested) to build for
    flat_inputs: bool = False  # also takes tabular inputs of shape (F,)

    @property
    def defaults(self) -> dict[str, Any]:
        """Every default in one dict: activation, norm and the model's own options."""
        return {"activation": self.default_activation, "norm": self.default_norm, **self.options}


@dataclass(frozen=True)
class ModelSpec:
    """Everything that determines a built architecture; ``build_model(**spec.kwargs())`` rebuilds it.

    Plain data (str, int, tuple, dict), so a model carrying it deep-copies and pickles.
    """

    name: str
    input_shape: Shape
    num_classes: int
    activation: str | None
    norm: str
    options: dict[str, Any] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "input_shape": self.input_shape,
            "num_classes": self.num_classes,
            "activation": self.activation,
            "norm": self.norm,
            **self.options,
        }


class Network(nn.Sequential):
    """A model: ``features`` (named blocks) followed by ``classifier``; see the module docstring.

    Attributes:
        spec: the :class:`ModelSpec` it was built from (name, shapes, resolved options).
    """

    features: nn.Sequential
    classifier: nn.Sequential

    def __init__(self, features: nn.Sequential, classifier: nn.Sequential, spec: ModelSpec) -> None:
        super().__init__(OrderedDict(features=features, classifier=classifier))
        self.spec = spec

    def blocks(self) -> list[tuple[str, nn.Module]]:
        """The trainable/cuttable units in forward order: each feature block, then the classifier."""
        return [(f"features.{n}", m) for n, m in self.features.named_children()] + [
            ("classifier", self.classifier)
        ]


@dataclass(frozen=True)
class _Entry:
    info: ModelInfo
    builder: Builder
    config: type[ModelOptions]  # the model's options: types, defaults and checks


_REGISTRY: Registry[_Entry] = Registry("model")


def register_model(
    name: str,
    *,
    description: str,
    reference: str,
    activations: tuple[str, ...] = tuple(sorted(ACTIVATIONS)),
    norms: tuple[str, ...] = NORMS,
    default_activation: str | None = "relu",
    default_norm: str = "none",
    options: type[ModelOptions] | Mapping[str, Any] | None = None,
    input_shapes: tuple[Shape, ...] = ((1, 28, 28), (3, 32, 32)),
    flat_inputs: bool = False,
) -> Callable[[Builder], Builder]:
    """Decorator registering ``builder`` under ``name`` (see the module docstring for the contract).

    Args:
        options: the model's options config (a :class:`ModelOptions` subclass), or a mapping
            ``{option: default}`` from which one is made (types follow the defaults).
        flat_inputs: the model also builds for tabular inputs of shape ``(F,)``.

    Raises:
        ConfigError: ``name`` is already registered.
    """
    if options is None:
        config: type[ModelOptions] = ModelOptions
    elif isinstance(options, type) and issubclass(options, ModelOptions):
        config = options
    else:
        config = options_config(name, dict(options))
    defaults = {k: f.default for k, f in config.model_fields.items()}

    def deco(builder: Builder) -> Builder:
        if not callable(builder):
            raise ConfigError(
                f"register_model({name!r}) decorates a builder function; got {builder!r} ({type(builder).__name__})"
            )
        _REGISTRY.register(
            name,
            _Entry(
                ModelInfo(
                    name=name,
                    description=description,
                    reference=reference,
                    activations=activations,
                    norms=norms,
                    default_activation=default_activation,
                    default_norm=default_norm,
                    options=defaults,
                    input_shapes=input_shapes,
                    flat_inputs=flat_inputs,
                ),
                builder,
                config,
            ),
        )
        return builder

    return deco


def model_names() -> list[str]:
    """Registered model names, sorted."""
    return _REGISTRY.names()


def _entry(name: str) -> _Entry:
    return _REGISTRY.get(name)


def model_info(name: str) -> ModelInfo:
    """Description, defaults and supported options of model ``name`` (a copy: safe to mutate)."""
    info = _entry(name).info
    return dataclasses.replace(info, options=dict(info.options))


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of scalar parameters (only those with ``requires_grad`` if ``trainable_only``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ---------------------------------------------------------------------------------------------
# validation at the edge


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _check_shape(input_shape: Any, info: ModelInfo | None = None) -> Shape:
    """``(C, H, W)`` of positive ints, or ``(F,)`` for a model taking tabular features."""
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    flat = info is None or info.flat_inputs
    if len(shape) not in ((1, 3) if flat else (3,)) or not all(_positive_int(d) for d in shape):
        if len(shape) == 1 and info is not None and all(_positive_int(d) for d in shape):
            flat_models = ", ".join(n for n in _REGISTRY.names() if _REGISTRY[n].info.flat_inputs)
            raise ConfigError(
                f"model {info.name!r} takes images (channels, height, width), got tabular "
                f"input_shape {shape!r}; for tabular features use one of: {flat_models}"
            )
        raise ConfigError(
            f"input_shape must be (channels, height, width) of positive ints, got {input_shape!r}; "
            "e.g. (1, 28, 28) for MNIST or (3, 32, 32) for CIFAR-10"
            + (" (or (features,) for tabular data)" if flat else "")
        )
    return shape


def _check_choice(info: ModelInfo, kind: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value in allowed and isinstance(value, str):
        return
    if not allowed:
        raise ConfigError(
            f"model {info.name!r} takes no {kind} (got {kind}={value!r}); leave {kind} unset"
        )
    raise ConfigError(
        f"model {info.name!r} does not support {kind}={value!r}; expected one of: {', '.join(allowed)}"
    )


def _resolve(
    name: str,
    input_shape: Any,
    num_classes: Any,
    activation: str | None,
    norm: str | None,
    options: Mapping[str, Any],
) -> tuple[_Entry, ModelSpec]:
    entry = _entry(name)
    info = entry.info
    shape = _check_shape(input_shape, info)
    if not _positive_int(num_classes):
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    act = info.default_activation if activation is None else activation
    if act is not None:
        _check_choice(info, "activation", act, info.activations)
    nrm = info.default_norm if norm is None else norm
    _check_choice(info, "norm", nrm, info.norms)
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        valid = [*sorted(info.options), "activation", "norm", "seed", "draws"]
        raise ConfigError(
            f"model {info.name!r} has no option {', '.join(map(repr, unknown))}; valid options: {', '.join(valid)}"
        )
    opts = validate_options(entry.config, options, what=f"model {info.name!r}").model_dump()
    return entry, ModelSpec(name, shape, num_classes, act, nrm, opts)


def _assemble(entry: _Entry, spec: ModelSpec) -> Network:
    """Build the network for ``spec`` on the ``meta`` device: shapes only, no data, no RNG."""
    contract = (
        "a builder takes (input_shape, num_classes, activation, norm, **options) and returns "
        "(features, classifier), two torch modules"
    )
    with torch.device("meta"):
        try:
            built = entry.builder(
                input_shape=spec.input_shape,
                num_classes=spec.num_classes,
                activation=spec.activation,
                norm=spec.norm,
                **spec.options,
            )
        except TypeError as exc:  # a registered builder with another signature
            raise ConfigError(
                f"model {spec.name!r}: its builder cannot be called ({exc}); {contract}"
            ) from None
        if not (
            isinstance(built, tuple)
            and len(built) == 2
            and all(isinstance(m, torch.nn.Module) for m in built)
        ):
            raise ConfigError(
                f"model {spec.name!r}: its builder returned {type(built).__name__}; {contract}"
            )
        net = Network(built[0], built[1], spec)
        out = output_shape(net, spec.input_shape)
    if out != (spec.num_classes,):  # a registered builder's mistake (a built-in one's is a bug)
        raise ConfigError(
            f"model {spec.name!r} outputs shape {out} for num_classes={spec.num_classes}; its classifier "
            f"must end in {spec.num_classes} outputs"
        )
    odd = sorted({str(t.dtype) for t in net.parameters() if t.dtype != torch.float32})
    if odd:
        raise ConfigError(
            f"model {spec.name!r} has {', '.join(odd)} parameters; fedge trains float32 models "
            "(build its layers with the default dtype)"
        )
    return net


def _fits(entry: _Entry, spec: ModelSpec, side: int) -> bool:
    shape = (spec.input_shape[0], side, side)
    try:
        _assemble(entry, dataclasses.replace(spec, input_shape=shape))
    except InputTooSmallError:
        return False
    return True


def _too_small(entry: _Entry, spec: ModelSpec, err: InputTooSmallError) -> ConfigError:
    """The ConfigError for an input too small for ``spec``, naming the minimum square size."""
    if len(spec.input_shape) != 3:  # tabular input: no side length to search
        return err
    hi = 1
    while not _fits(entry, spec, hi):
        hi *= 2
        if hi > _MAX_SIDE:
            return err
    lo = hi // 2  # does not fit (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _fits(entry, spec, mid) else (mid, hi)
    h, w = spec.input_shape[-2:]
    return ConfigError(
        f"model {spec.name!r} needs inputs of at least {hi}x{hi} pixels, got {h}x{w}; "
        f"resize or pad the inputs, or pick a model that takes small inputs (lenet, mlp, logreg)"
    )


def build_model(
    name: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    activation: str | None = None,
    norm: str | None = None,
    seed: int | None = None,
    draws: Draws = "torch",
    **options: Any,
) -> Network:
    """Build and initialise a registered model.

    Args:
        name: a name from :func:`model_names` (e.g. ``"lenet"``, ``"wrn-10-2"``).
        input_shape: one sample's ``(C, H, W)``, or ``(F,)`` for tabular features (models
            registered with ``flat_inputs``: ``mlp``, ``logreg``); flattened sizes derive from it.
        num_classes: output logits.
        activation: ``"relu" | "hardswish" | "selu"``; None = the model's default.
        norm: ``"none" | "batch" | "group"``; None = the model's default.
        seed: initialise every parameter from ``torch.Generator().manual_seed(seed)`` — same
            seed, bit-identical weights, and torch's global RNG is neither used nor advanced.
            None draws from torch's global generator, so ``torch.manual_seed(s)`` followed by
            ``build_model(..., seed=None)`` equals ``build_model(..., seed=s)``.
        draws: ``"torch"`` (the above: torch's default init, bit-identical only for one CPU
            kernel family and torch version) or ``"portable"``: the same distributions drawn by
            :func:`~fedge.models.initialization.portable_reset_parameters` from ``seed``
            (required), the same bits on every machine (what FedPT's clients rebuilding frozen
            weights on different hardware need).
        **options: model-specific options, see ``model_info(name).options``.

    Returns:
        a :class:`Network` on CPU in float32, in train mode.

    Raises:
        UnknownNameError: ``name`` is not registered.
        ConfigError: an unsupported option or value, or an input smaller than the architecture's
            minimum (the message gives the minimum size).

    Example:
        >>> net = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0)
        >>> count_parameters(net)
        26730
    """
    entry, spec = _resolve(name, input_shape, num_classes, activation, norm, options)
    check_draws(draws)
    generator = None
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ConfigError(f"seed must be an int in [0, 2**64), got {seed!r}")
        if draws == "torch":
            generator = torch.Generator().manual_seed(seed)
    elif draws == "portable":
        raise ConfigError(
            "build_model(draws='portable') needs a seed (portable draws have no global "
            "generator); pass seed=<int>"
        )
    try:
        net = _assemble(entry, spec)
    except InputTooSmallError as e:
        raise _too_small(entry, spec, e) from None
    net.to_empty(device="cpu")
    if draws == "portable":
        assert seed is not None
        portable_reset_parameters(net, seed)
    else:
        reset_parameters(net, generator)
    return net


def list_models(
    input_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10
) -> list[dict[str, Any]]:
    """One row per model for ``fedge models``: name, params, description, defaults, error.

    ``params`` is counted on the model actually built (on the meta device, so this is cheap) for
    ``input_shape``/``num_classes`` with default options; it is None, with ``error`` saying why,
    when the model cannot take that input.
    """
    _check_shape(input_shape)
    rows = []
    for name in model_names():
        entry = _REGISTRY[name]
        params: int | None = None
        error: str | None = None
        try:
            _, spec = _resolve(name, input_shape, num_classes, None, None, {})
            try:
                params = count_parameters(_assemble(entry, spec))
            except InputTooSmallError as e:
                raise _too_small(entry, spec, e) from None
        except ConfigError as e:
            error = str(e)
        rows.append(
            {
                "name": name,
                "params": params,
                "description": entry.info.description,
                "defaults": entry.info.defaults,
                "error": error,
            }
        )
    return rows
