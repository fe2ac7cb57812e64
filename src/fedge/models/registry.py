"""The model registry: ``build_model``, ``model_names``, ``model_info``, ``list_models``.

Each model module registers a *builder* with :func:`register_model`. A builder takes
``input_shape``, ``num_classes``, the resolved ``activation`` and ``norm`` and its own options,
and returns two ``nn.Sequential``s, ``features`` and ``classifier``; :func:`build_model` validates
everything at the edge, assembles them into a :class:`Network` on the ``meta`` device (no memory,
no random draws), materialises it and initialises it with :func:`reset_parameters` from an
explicit generator.

Layout every model follows (relied on by greedy layer-wise training (PPFL) and split learning
(EPPFL))::

    Network (nn.Sequential)
      features    nn.Sequential of named blocks, in forward order, e.g. conv1, conv2 or stem,
                  s1b1, ...; a block is the unit one trains or cuts after (conv -> norm -> act
                  -> pooling that follows it -> dropout); residual units are one block each
      classifier  nn.Sequential ending in the ``out`` Linear; it starts with ``flatten`` or a
                  global average ``pool`` when the last block outputs a (B, C, H, W) map

``model(x) == model.classifier(model.features(x))`` and ``model.features[:k]`` is the first k
blocks. State-dict keys are therefore stable: ``features.conv1.conv.weight``, ``classifier.out.bias``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.models.initialization import reset_parameters
from fedge.models.layers import ACTIVATIONS, NORMS, InputTooSmallError, output_shape

__all__ = [
    "ModelInfo",
    "ModelSpec",
    "Network",
    "build_model",
    "count_parameters",
    "list_models",
    "model_info",
    "model_names",
    "register_model",
]

Shape = tuple[int, int, int]
Builder = Callable[..., tuple[nn.Sequential, nn.Sequential]]

_MAX_SIDE = 4096  # the largest square side the minimum-size search tries


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


_REGISTRY: dict[str, _Entry] = {}


def register_model(
    name: str,
    *,
    description: str,
    reference: str,
    activations: tuple[str, ...] = tuple(sorted(ACTIVATIONS)),
    norms: tuple[str, ...] = NORMS,
    default_activation: str | None = "relu",
    default_norm: str = "none",
    options: Mapping[str, Any] | None = None,
    input_shapes: tuple[Shape, ...] = ((1, 28, 28), (3, 32, 32)),
) -> Callable[[Builder], Builder]:
    """Decorator registering ``builder`` under ``name`` (see the module docstring for the contract)."""

    def deco(builder: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is registered twice")
        _REGISTRY[name] = _Entry(
            ModelInfo(
                name=name,
                description=description,
                reference=reference,
                activations=activations,
                norms=norms,
                default_activation=default_activation,
                default_norm=default_norm,
                options=dict(options or {}),
                input_shapes=input_shapes,
            ),
            builder,
        )
        return builder

    return deco


def model_names() -> list[str]:
    """Registered model names, sorted."""
    return sorted(_REGISTRY)


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownNameError("model", str(name), list(_REGISTRY)) from None


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


#: Models that flatten their input first, so they take tabular features (F,) as well as images.
TABULAR_MODELS = frozenset({"mlp", "logreg"})


def _check_shape(input_shape: Any, name: str = "") -> Shape:
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    if len(shape) == 1 and name in TABULAR_MODELS and _positive_int(shape[0]):
        return shape  # type: ignore[return-value]
    if len(shape) != 3 or not all(_positive_int(d) for d in shape):
        tabular = f"; tabular features (F,) work with {sorted(TABULAR_MODELS)}" if len(shape) == 1 else ""
        raise ConfigError(
            f"input_shape must be (channels, height, width) of positive ints, got {input_shape!r}; "
            f"e.g. (1, 28, 28) for MNIST or (3, 32, 32) for CIFAR-10{tabular}"
        )
    return shape  # type: ignore[return-value]


def _check_choice(info: ModelInfo, kind: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value in allowed and isinstance(value, str):
        return
    if not allowed:
        raise ConfigError(
            f"model {info.name!r} takes no {kind} (got {kind}={value!r}); leave {kind} unset"
        )
    raise ConfigError(
        f"model {info.name!r} does not support {kind}={value!r}; "
        f"expected one of: {', '.join(allowed)}"
    )


def _check_option(info: ModelInfo, key: str, value: Any) -> Any:
    """Type-check ``value`` against the option's default; returns it normalised (list -> tuple)."""
    default = info.options[key]
    bad = ConfigError(
        f"option {key!r} of model {info.name!r} expects a {type(default).__name__} "
        f"like {default!r}, got {value!r}"
    )
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise bad
        value = float(value)
    elif isinstance(default, tuple):
        if not isinstance(value, (tuple, list)) or not all(_positive_int(v) for v in value):
            raise ConfigError(
                f"option {key!r} of model {info.name!r} expects a sequence of positive ints "
                f"like {default!r}, got {value!r}"
            )
        value = tuple(value)
    return value


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
    shape = _check_shape(input_shape, name)
    if not _positive_int(num_classes):
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    act = info.default_activation if activation is None else activation
    if act is not None:
        _check_choice(info, "activation", act, info.activations)
    nrm = info.default_norm if norm is None else norm
    _check_choice(info, "norm", nrm, info.norms)
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        valid = [*sorted(info.options), "activation", "norm", "seed"]
        raise ConfigError(
            f"model {info.name!r} has no option {', '.join(map(repr, unknown))}; "
            f"valid options: {', '.join(valid)}"
        )
    opts = {k: _check_option(info, k, options.get(k, d)) for k, d in info.options.items()}
    return entry, ModelSpec(name, shape, num_classes, act, nrm, opts)


def _assemble(entry: _Entry, spec: ModelSpec) -> Network:
    """Build the network for ``spec`` on the ``meta`` device: shapes only, no data, no RNG."""
    with torch.device("meta"):
        features, classifier = entry.builder(
            input_shape=spec.input_shape,
            num_classes=spec.num_classes,
            activation=spec.activation,
            norm=spec.norm,
            **spec.options,
        )
        net = Network(features, classifier, spec)
        out = output_shape(net, spec.input_shape)
    if out != (spec.num_classes,):  # a builder bug, not a user error
        raise RuntimeError(f"model {spec.name!r} outputs {out}, expected ({spec.num_classes},)")
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
    hi = 1
    while not _fits(entry, spec, hi):
        hi *= 2
        if hi > _MAX_SIDE:
            return err
    lo = hi // 2  # does not fit (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _fits(entry, spec, mid) else (mid, hi)
    _, h, w = spec.input_shape
    return ConfigError(
        f"model {spec.name!r} needs inputs of at least {hi}x{hi} pixels, got {h}x{w}; "
        f"resize or pad the inputs, or pick a model that takes small inputs (lenet, mlp, logreg)"
    )


def build_model(
    name: str,
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    activation: str | None = None,
    norm: str | None = None,
    seed: int | None = None,
    **options: Any,
) -> Network:
    """Build and initialise a registered model.

    Args:
        name: a name from :func:`model_names` (e.g. ``"lenet"``, ``"wrn-10-2"``).
        input_shape: one sample's ``(C, H, W)``; flattened sizes are derived from it.
        num_classes: output logits.
        activation: ``"relu" | "hardswish" | "selu"``; None = the model's default.
        norm: ``"none" | "batch" | "group"``; None = the model's default.
        seed: initialise every parameter from ``torch.Generator().manual_seed(seed)`` — same
            seed, bit-identical weights, and torch's global RNG is neither used nor advanced.
            None draws from torch's global generator, so ``torch.manual_seed(s)`` followed by
            ``build_model(..., seed=None)`` equals ``build_model(..., seed=s)``.
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
    generator = None
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ConfigError(f"seed must be an int in [0, 2**64), got {seed!r}")
        generator = torch.Generator().manual_seed(seed)
    try:
        net = _assemble(entry, spec)
    except InputTooSmallError as e:
        raise _too_small(entry, spec, e) from None
    net.to_empty(device="cpu")
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
