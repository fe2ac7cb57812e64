"""The composer: cross-cutting mechanisms applied once, outside the methods, by capability.

A method's build returns its bare strategy and client program
(:class:`~fedge.methods.base.MethodBuild`); :func:`compose` applies the mechanisms a run's
config asks for, in one fixed order, wherever the method's
:class:`~fedge.methods.spec.Capabilities` allow them:

1. **freeze** (``method.freeze``, needs ``freezable``): the model the method is built from has
   the frozen parameters' ``requires_grad`` off (:class:`~fedge.methods.base.FreezeOption`);
   then **train_mask** (``method.train_mask``, needs ``coordinate_mask``): the build environment
   carries the data-free mask of the coordinates to train (:mod:`fedge.methods.sparse`), and the
   server restores every other coordinate after each round (over DP, secure aggregation and
   compression);
2. the method's own build (its bare strategy and program);
3. **DP** (``privacy.*``, needs ``sums_replies``): clients clip, the server adds noise to the
   sum (:class:`~fedge.methods.private.DifferentialPrivacy`);
4. **secure aggregation** (``method.secure_aggregation``, ``method.secagg_*``, needs
   ``sums_replies``): over DP, so the noise goes on the securely aggregated sum
   (:class:`~fedge.methods.secure.SecureAggregation`);
5. **uplink compression** (``method.compress``, needs ``dense_upload``): over DP, so clients
   compress their clipped contribution and the server decodes it before re-clipping and noising
   (:mod:`fedge.methods.compress`); refused with secure aggregation and where the uplink is
   scalars (:func:`check_compression`);
6. the method's own ``over_protection`` layers (NTK-Ori's pruning exchanges);
7. **EMA evaluation** (``method.ema``, ``method.ema_*``, needs ``global_model``)
   (:class:`~fedge.methods.ema.EMAEvaluation`);
8. the method's own ``outermost`` layers.

Each mechanism's options are declared once (one pydantic model per mechanism, :data:`MECHANISMS`)
and attached to a method's config section by :func:`section_model` from its capabilities, with
the method's own defaults (``MethodSpec.defaults``: BAFFLE's ``ema: 0.995``). An option of a
mechanism a method cannot take is refused when the section is validated
(:func:`refuse_unsupported`), with the reason its capability gives. Persistent client state
(the error-feedback residuals, SCAFFOLD's c_i) lives in ``ctx.state``, which the engine
checkpoints for every method.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

from pydantic import create_model
from pydantic.fields import FieldInfo

from fedge.core.errors import ConfigError
from fedge.methods.base import FreezeOption, MethodBuild, MethodConfigBase, MethodEnv
from fedge.methods.compress import CompressOptions, compressed
from fedge.methods.ema import EMAOptions
from fedge.methods.private import protect
from fedge.methods.secure import SecureAggregationOptions, Summable
from fedge.methods.sparse import KeepOffMask, TrainMaskOption, masks_digest
from fedge.methods.spec import MethodSpec

__all__ = [
    "MECHANISMS",
    "Mechanism",
    "check_compression",
    "check_privacy",
    "check_secure_aggregation",
    "compose",
    "refuse_unsupported",
    "section_model",
]


@dataclass(frozen=True)
class Mechanism:
    """A cross-cutting mechanism: what it is called in errors, the capability it needs, and its
    ``method.*`` options (None: its keys live in their own section, as ``privacy.*``)."""

    name: str
    what: str
    needs: str
    options: type[MethodConfigBase] | None


#: every mechanism, in the order :func:`compose` applies them
MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism("freeze", "freezing", "freezable", FreezeOption),
    Mechanism("train_mask", "a sparse trainable mask", "coordinate_mask", TrainMaskOption),
    Mechanism("dp", "differential privacy", "sums_replies", None),
    Mechanism("secure_aggregation", "secure aggregation", "sums_replies", SecureAggregationOptions),
    Mechanism("compress", "uplink compression", "dense_upload", CompressOptions),
    Mechanism("ema", "EMA evaluation", "global_model", EMAOptions),
)


def _supported(spec: MethodSpec) -> list[Mechanism]:
    return [m for m in MECHANISMS if getattr(spec.capabilities, m.needs)]


def section_model(spec: MethodSpec) -> type[MethodConfigBase]:
    """The model of ``spec``'s ``method.*`` section: its own config plus the options of every
    mechanism its capabilities support, with its own defaults for them (built once)."""
    options = [m.options for m in _supported(spec) if m.options is not None]
    options = [o for o in options if not set(o.model_fields) & set(spec.config.model_fields)]
    fields: dict[str, Any] = {}
    for key, value in spec.defaults.items():
        owner = next((o for o in options if key in o.model_fields), None)
        if owner is None:
            raise ConfigError(
                f"method {spec.name!r} declares a default for {key!r}, which is no option of a mechanism "
                f"it supports ({', '.join(m.name for m in _supported(spec)) or 'none'}); drop it from its defaults"
            )
        base = owner.model_fields[key]
        annotation = base.annotation if value is not None else base.annotation | None  # type: ignore[operator]
        fields[key] = (annotation, FieldInfo.merge_field_infos(base, default=value))
    model = cast(
        "type[MethodConfigBase]",
        create_model(
            spec.config.__name__,
            __base__=(spec.config, *options),
            __module__=spec.config.__module__,
            **fields,
        ),
    )
    model.__doc__ = spec.config.__doc__
    return model


def refuse_unsupported(spec: MethodSpec, data: dict[str, Any]) -> None:
    """Refuse ``method.*`` keys of a mechanism ``spec`` cannot take, naming the key and the
    reason its capabilities give (before validation, which would only call them unknown)."""
    own = set(spec.config.model_fields)
    for m in MECHANISMS:
        if m.options is None or getattr(spec.capabilities, m.needs):
            continue
        for key in sorted(set(m.options.model_fields) - own):
            if key in data:
                raise ConfigError(
                    f"method.{key}: method {spec.name!r} cannot take {m.what}: "
                    f"{spec.capabilities.reason(m.needs)}; remove method.{key}"
                )


def check_privacy(spec: MethodSpec, privacy: Any) -> None:
    """Refuse DP (``privacy.mechanism``) for a method whose server does not sum client replies."""
    if privacy is not None and privacy.enabled and not spec.capabilities.sums_replies:
        raise ConfigError(
            f"privacy.mechanism={privacy.mechanism}: method {spec.name!r} cannot take differential privacy: "
            f"{spec.capabilities.reason('sums_replies')}, so DP-FedAvg/DP-FTRL does not apply to it; use a "
            "method whose server averages client contributions, or set privacy.mechanism=none"
        )


def check_secure_aggregation(spec: MethodSpec, cfg: Any, env: MethodEnv) -> None:
    """Refuse secure aggregation over fewer than 2 clients per round (a sum of one client's
    reply is that reply: its masks cannot cancel), before anything of the run is written."""
    if spec.capabilities.sums_replies and getattr(cfg, "secure_aggregation", False):
        if env.per_round < 2:
            raise ConfigError(
                f"method.secure_aggregation=true needs at least 2 clients per round, got "
                f"clients.per_round={env.per_round} (of clients.num={len(env.client_sizes)}): the "
                "sum of one client's reply is that reply; set clients.per_round (and clients.num) "
                "to 2 or more, or method.secure_aggregation=false"
            )


def check_compression(spec: MethodSpec, cfg: Any) -> None:
    """Refuse ``method.compress`` where this configuration's uplink is scalars (K loss
    differences), and together with secure aggregation (module docstring of
    :mod:`fedge.methods.compress`), before anything of the run is written."""
    options = getattr(cfg, "compress", None) if spec.capabilities.dense_upload else None
    if options is None:
        return
    if spec.upload(cfg) == "loss_differences":
        raise ConfigError(
            f"method.compress.name={options.name}: method {spec.name!r} uploads K loss differences in this "
            "configuration, K float32 scalars with nothing dense to compress; compression applies where the "
            "clients upload a model delta or gradient (BAFFLE: method.mode=epoch); remove method.compress"
        )
    if getattr(cfg, "secure_aggregation", False):
        raise ConfigError(
            f"method.compress.name={options.name} with method.secure_aggregation=true: secure aggregation "
            "masks each client's vector dense in a fixed-point ring shared by all clients, and a compressed "
            "message (its own indices, its own scales, packed bits) does not add up there; masking the "
            "decoded vector would send as many bytes as no compression. Set method.secure_aggregation=false "
            "to compress, or remove method.compress to aggregate securely"
        )


def compose(spec: MethodSpec, cfg: Any, env: MethodEnv) -> MethodBuild:
    """Build method ``spec`` from its validated section ``cfg`` (:func:`section_model`) and
    apply the mechanisms the config asks for, in the module's order."""
    caps, applied = spec.capabilities, []
    check_privacy(spec, env.privacy)
    check_secure_aggregation(spec, cfg, env)
    check_compression(spec, cfg)
    if caps.freezable and cfg.freeze:
        env, applied = cfg.frozen_env(env), ["freeze"]
    if caps.coordinate_mask and cfg.train_mask is not None:
        env = cfg.masked_env(env)
        applied.append("train_mask")
    built = spec.build(cfg, env)
    strategy, program = built.strategy, built.program
    if caps.sums_replies:
        if not isinstance(strategy, Summable):
            raise ConfigError(
                f"method {spec.name!r} declares sums_replies, but its strategy {type(strategy).__name__} is not a "
                "Summable (summands(), apply_mean(), weighted); implement them or drop the capability"
            )
        if env.privacy is not None and env.privacy.enabled:
            applied.append("dp")
        if cfg.secure_aggregation:
            applied.append("secure_aggregation")
        strategy, program = protect(
            strategy, program, cfg, **env.protection(weighted=strategy.weighted)
        )
    if caps.dense_upload and cfg.compress is not None:
        strategy, program = compressed(
            strategy, program, cfg.compress, seed=env.seed, draws=env.draws
        )
        applied.append("compress")
    if env.train_masks is not None:
        strategy = KeepOffMask(strategy, env.train_masks, dict(env.model_fn().named_parameters()))
    for layer in (x for x in built.layers if x.at == "over_protection"):
        strategy = layer.strategy(strategy) if layer.strategy else strategy
        program = layer.program(program) if layer.program else program
    if caps.global_model and cfg.ema:
        strategy = cfg.evaluation(strategy)
        applied.append("ema")
    for layer in (x for x in built.layers if x.at == "outermost"):
        strategy = layer.strategy(strategy) if layer.strategy else strategy
        program = layer.program(program) if layer.program else program
    return dataclasses.replace(
        built,
        strategy=strategy,
        program=program,
        layers=[],
        applied=tuple(applied),
        bare=built.strategy,
        rebuilt=(
            {**built.rebuilt, "train_mask": masks_digest(env.train_masks)}
            if env.train_masks is not None
            else built.rebuilt
        ),
    )
