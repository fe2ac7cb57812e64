"""What every method shares: its config base, the build environment, what a build returns,
the server's global model, and the conversions between a model and the named arrays that
travel in messages."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field, model_validator
from torch.utils._pytree import tree_map

from fedge.core import transforms as T
from fedge.core.config import ConfigModel
from fedge.core.errors import MessageError, PrivacyWarning
from fedge.core.messages import Message
from fedge.core.protocols import ClientProgram, PartySpec, Strategy
from fedge.core.rng import Draws

__all__ = [
    "warn_scalars_unprotected",
    "GlobalModel",
    "Layer",
    "MethodBuild",
    "MethodConfigBase",
    "MethodEnv",
    "ServerOptimizerConfig",
    "check_reply_arrays",
    "check_scalar_reply",
    "load_arrays",
    "model_arrays",
    "model_message_arrays",
    "split_trainable",
    "unpack_model_arrays",
]

MASK_PREFIX = "mask/"


class MethodConfigBase(ConfigModel):
    """Base of every method's config section (``method.*`` keys); unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class FreezeOption(MethodConfigBase):
    """``method.freeze``: parameters kept at their seeded initial values for the whole run
    (FedPT's partially trainable networks, composed with other methods): zeroth-order methods
    then perturb only the trainable coordinates (n shrinks, so the estimate's cosine with the
    true gradient grows), backprop methods compute and send no gradient for them."""

    freeze: str | list[str] = Field(
        default_factory=list,
        description="'largest' | 'largest:N' | module-name patterns such as [classifier.fc1]; [] freezes nothing",
    )

    def frozen_env(self, env: MethodEnv) -> MethodEnv:
        """``env`` whose models come with the frozen parameters' ``requires_grad`` off."""
        if not self.freeze:
            return env
        from fedge.models.blocks import freeze_, resolve_freeze

        frozen = resolve_freeze(env.model_fn(), self.freeze)
        base = env.model_fn

        def model_fn() -> torch.nn.Module:
            return freeze_(base(), frozen)

        return dataclasses.replace(env, model_fn=model_fn)


class ServerOptimizerConfig(MethodConfigBase):
    """Server optimizer applied to the aggregated pseudo-gradient (Reddi et al., arXiv:2003.00295v5).

    ``eps`` defaults to 1e-8 for adam and to Reddi et al.'s τ = 1e-3 for yogi/adagrad.
    """

    name: Literal["sgd", "adam", "yogi", "adagrad", "zo_sgdm", "zo_adamm"] = Field(
        "sgd",
        description="zo_sgdm: averaged momentum (beta = b1); zo_adamm: ZO-AdaMM (fedge.core.transforms)",
    )
    lr: float = Field(1.0, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    b1: float = Field(0.9, ge=0, lt=1)
    b2: float = Field(0.99, ge=0, lt=1)
    eps: float | None = Field(None, gt=0)
    bias_correction: bool = True
    weight_decay: float = Field(
        0.0, ge=0, description="L2 weight decay added to the gradient (sgd, adam)"
    )
    lr_decay: float = Field(
        1.0, gt=0, le=1, description="learning rate multiplied by this after each round (sgd, adam)"
    )

    @model_validator(mode="after")
    def _decay_needs_sgd_or_adam(self) -> ServerOptimizerConfig:
        if self.name in ("zo_sgdm", "zo_adamm") and self.weight_decay:
            raise ValueError(
                f"weight_decay is not supported by {self.name}; leave it at 0 or use sgd or adam"
            )
        if self.name in ("yogi", "adagrad") and (self.weight_decay or self.lr_decay != 1.0):
            raise ValueError(
                f"weight_decay and lr_decay are supported for sgd and adam, not {self.name}; "
                "leave them at 0 and 1, or use sgd or adam"
            )
        return self

    def build(self) -> T.Transform:
        if self.name == "sgd":
            return T.sgd(
                self.lr,
                momentum=self.momentum,
                weight_decay=self.weight_decay,
                lr_decay=self.lr_decay,
            )
        if self.name == "adam":
            return T.adam(
                self.lr,
                b1=self.b1,
                b2=self.b2,
                eps=self.eps or 1e-8,
                bias_correction=self.bias_correction,
                weight_decay=self.weight_decay,
                lr_decay=self.lr_decay,
            )
        if self.name == "zo_sgdm":
            return T.zo_sgdm(self.lr, beta=self.b1, lr_decay=self.lr_decay)
        if self.name == "zo_adamm":
            return T.zo_adamm(
                self.lr, b1=self.b1, b2=self.b2, eps=self.eps or 1e-8, lr_decay=self.lr_decay
            )
        if self.name == "yogi":
            return T.yogi(self.lr, b1=self.b1, b2=self.b2, eps=self.eps or 1e-3)
        return T.adagrad(self.lr, b1=self.b1, eps=self.eps or 1e-3)


@dataclass(frozen=True)
class MethodEnv:
    """What a method's builder may use."""

    seed: int
    model_fn: Callable[[], torch.nn.Module]  # the initial global model, same weights on every call
    num_classes: int
    input_shape: tuple[int, ...]
    client_sizes: Sequence[int]  # lazy for generated populations
    rounds: int
    workers: int = 0
    per_round: int = 1
    privacy: Any = None  # the validated privacy section (fedge.privacy.dp.PrivacyConfig), or None
    draws: Draws = "torch"  # the run's generator of seeded draws (RunConfig.draws)
    # method.train_mask's kept coordinates (fedge.methods.sparse), name -> bool; None: all
    train_masks: dict[str, torch.Tensor] | None = None
    #: where the run's models and estimator tensors live (RunConfig.device, resolved); model_fn
    #: already builds its models there
    device: torch.device = torch.device("cpu")
    # each client's device profile (clients.profiles, as the engine assigns them), or None
    profiles: Sequence[Mapping[str, Any]] | None = None
    #: every client can build the initial model itself (``model_fn``'s seeded weights); False
    #: under ``warm_start``, whose pretrained start a client must download: a method whose
    #: downlink is seeds and scalars then sends a client the model on its first participation
    seeded_start: bool = True

    def protection(self, *, weighted: bool) -> dict[str, Any]:
        """Keyword arguments of :func:`fedge.methods.private.protect` for this run."""
        return dict(
            privacy=self.privacy,
            seed=self.seed,
            weighted=weighted,
            population=len(self.client_sizes),
            clients_per_round=self.per_round,
            draws=self.draws,
        )


@dataclass(frozen=True)
class Layer:
    """A method's own wrapper around its composed sides, placed by the composer at ``at`` in its
    order (:mod:`fedge.methods.compose`): ``over_protection`` over DP and secure aggregation but
    under the EMA (NTK-Ori's pruning exchanges), ``outermost`` over everything."""

    at: Literal["over_protection", "outermost"]
    strategy: Callable[[Strategy], Strategy] | None = None
    program: Callable[[ClientProgram], ClientProgram] | None = None


@dataclass
class MethodBuild:
    """A built method: its two sides, its side parties (by name) and its own outer layers.

    A method's build returns its bare sides; the composer applies the mechanisms and the
    ``layers`` and returns the composed build, whose ``applied`` names what it wrapped, in order
    (e.g. ``("dp", "secure_aggregation", "ema")``), ``bare`` the method's own strategy, and
    ``rebuilt`` a digest of each thing every party derives itself from the config and must
    derive alike (``{"train_mask": sha256}``), which the Flower handshake compares.
    """

    strategy: Strategy
    program: ClientProgram
    parties: dict[str, PartySpec] = field(default_factory=dict)
    layers: list[Layer] = field(default_factory=list)
    applied: tuple[str, ...] = ()
    bare: Strategy | None = None
    rebuilt: dict[str, str] = field(default_factory=dict)


def model_arrays(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state (parameters and buffers) as detached CPU tensors, by name (copies, also
    of a model on the CPU)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def model_message_arrays(
    model: torch.nn.Module, masks: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The model as message arrays: dense, or — with ``masks`` — sparse with its mask.

    A masked tensor travels as its kept values only (1-D, in row-major order of the kept
    coordinates) plus its mask under ``"mask/<name>"`` in the smaller of a bitmap and an
    index list (:func:`fedge.pruning.encode_masks`): DESIGN.md's "a sparse model travels
    with its mask". :func:`unpack_model_arrays` inverts it.
    """
    arrays = model_arrays(model)
    if not masks:
        return arrays
    from fedge.pruning import encode_masks

    for name, mask in masks.items():
        arrays[name] = arrays[name][mask]
    arrays.update({MASK_PREFIX + k: v for k, v in encode_masks(masks).items()})
    return arrays


def unpack_model_arrays(
    arrays: dict[str, torch.Tensor], template: dict[str, torch.Tensor], *, who: str = "message"
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """Dense arrays and masks (None if the model travelled dense) from message arrays;
    ``template`` (a state dict) gives the dense shapes and dtypes."""
    encoded = {k[len(MASK_PREFIX) :]: v for k, v in arrays.items() if k.startswith(MASK_PREFIX)}
    if not encoded:
        return arrays, None
    from fedge.pruning import decode_masks

    names = {k.split(":")[0] for k in encoded}
    unknown = sorted(names - set(template))
    if unknown:
        raise MessageError(f"{who}: masks for unknown arrays {unknown[:5]}")
    masks = decode_masks(encoded, {n: template[n].shape for n in names})
    dense = {k: v for k, v in arrays.items() if not k.startswith(MASK_PREFIX)}
    for name, mask in masks.items():
        values = dense.get(name)
        kept = int(mask.sum())
        if values is None or values.dim() != 1 or values.numel() != kept:
            got = None if values is None else tuple(values.shape)
            raise MessageError(
                f"{who}: sparse array {name!r} must hold its {kept} kept values, got shape {got}"
            )
        full = torch.zeros(template[name].shape, dtype=values.dtype)
        full[mask] = values
        dense[name] = full
    return dense, masks


def load_arrays(
    model: torch.nn.Module, arrays: dict[str, torch.Tensor], *, who: str = "message"
) -> None:
    """Copy ``arrays`` into ``model`` in place; every state entry must be present with its shape."""
    state = model.state_dict()
    missing = sorted(set(state) - set(arrays))
    if missing:
        raise MessageError(f"{who}: missing model arrays {missing[:5]}")
    with torch.no_grad():
        for k, v in state.items():
            a = arrays[k]
            if a.shape != v.shape:
                raise MessageError(
                    f"{who}: array {k!r} has shape {tuple(a.shape)}; expected {tuple(v.shape)}"
                )
            v.copy_(a)


def split_trainable(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """(trainable parameter names, float buffer names) in state-dict order.
    Integer buffers (BatchNorm's ``num_batches_tracked``) belong to neither."""
    params = [n for n, p in model.named_parameters() if p.requires_grad]
    buffers = [n for n, b in model.named_buffers() if b.is_floating_point()]
    return params, buffers


def check_reply_arrays(reply: Message, expected: dict[str, torch.Size], *, who: str) -> None:
    """Every expected array is present with its shape, and nothing else is."""
    got = set(reply.arrays)
    if got != set(expected):
        extra, missing = sorted(got - set(expected)), sorted(set(expected) - got)
        raise MessageError(f"{who}: unexpected arrays {extra[:5]}, missing arrays {missing[:5]}")
    for k, shape in expected.items():
        if reply.arrays[k].shape != shape:
            raise MessageError(
                f"{who}: array {k!r} has shape {tuple(reply.arrays[k].shape)}; expected {tuple(shape)}"
            )


def check_scalar_reply(reply: Message, key: str, k: int, *, who: str) -> tuple[torch.Tensor, int]:
    """The reply's K float32 scalars under ``key`` and its ``num_samples`` (an int >= 1), or a
    MessageError naming what is wrong (the uplink of BAFFLE's batch mode and FedKSeed)."""
    v, n = reply.arrays.get(key), reply.config.get("num_samples")
    if v is None or v.shape != (k,) or v.dtype != torch.float32:
        got = None if v is None else (tuple(v.shape), str(v.dtype))
        raise MessageError(f"{who}: expected {key} of shape ({k},) float32, got {got}")
    if not isinstance(n, int) or n < 1:
        raise MessageError(f"{who}: num_samples={n!r}; expected an int >= 1")
    return v, n


class GlobalModel:
    """The server's global model and the optimizer that moves it: the part every
    model-updating strategy shares (FedAvg/FedSGD, BAFFLE, ...).

    ``step(grads)`` applies the server optimizer to (pseudo-)gradients of the trainable
    parameters; ``add_to_buffers(deltas)`` adds averaged float-buffer deltas directly. Both
    take tensors on any device (replies arrive on the CPU) and move them to the model's.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tx: T.Transform,
        *,
        masks: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.model, self.tx = model, tx
        self.param_names, self.buffer_names = split_trainable(model)
        self.opt_state = tx.init(self.params())
        self.masks = masks
        self._apply_masks()

    def set_masks(self, masks: dict[str, torch.Tensor] | None) -> None:
        """Prune the global model from now on (e.g. after pruning rounds run in the federation)."""
        self.masks = masks
        self._apply_masks()

    def _apply_masks(self) -> None:
        """Pruned coordinates are exactly zero, whatever the optimizer did."""
        if self.masks:
            with torch.no_grad():
                state = self.model.state_dict()
                for k, m in self.masks.items():
                    state[k].mul_(m.to(state[k].device, state[k].dtype))

    def arrays(self) -> dict[str, torch.Tensor]:
        """The model as the server sends it (sparse with its mask when pruned)."""
        return model_message_arrays(self.model, self.masks)

    def params(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        return {k: state[k] for k in self.param_names}

    def step(self, grads: dict[str, torch.Tensor]) -> None:
        params = self.params()
        grads = {k: g.to(params[k].device) if k in params else g for k, g in grads.items()}
        updates, self.opt_state = self.tx.update(grads, self.opt_state, params)
        with torch.no_grad():
            state = self.model.state_dict()
            for k, u in updates.items():
                state[k].add_(u)
        self._apply_masks()

    def add_to_buffers(self, deltas: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            state = self.model.state_dict()
            for k in self.buffer_names:
                state[k].add_(deltas[k].to(state[k].device))

    def state_dict(self) -> dict[str, Any]:
        out = {"model": model_arrays(self.model), "opt": self.opt_state}
        if self.masks:
            out["masks"] = {k: m.clone() for k, m in self.masks.items()}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the model, the optimizer state and the masks the run was pruned with.

        A resumed run keeps the checkpoint's masks even where the method rebuilt others: a
        data-free pruning of many iterative rounds (NTK-BAFFLE's 50) can select a different mask
        on another CPU or torch build, its float roundoff deciding near-ties that then cascade
        (measured: an avx2 and an avx512 EPYC kept 0.547 and 0.487 of LeNet-5's conv1), and a
        run whose mask changed mid-way would be neither run. Checkpoints without masks (written
        before they were kept) leave the rebuilt masks in place."""
        load_arrays(self.model, state["model"], who="checkpoint")
        device = next(iter(self.params().values()), torch.empty(0)).device
        self.opt_state = (
            state["opt"]
            if device.type == "cpu"  # a checkpoint's tensors are read onto the CPU
            else tree_map(
                lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, state["opt"]
            )
        )
        saved = state.get("masks")
        if saved is None:
            return
        if self.masks and (
            saved.keys() != self.masks.keys()
            or any(not torch.equal(saved[k], self.masks[k]) for k in saved)
        ):
            warnings.warn(
                "the pruning masks rebuilt for this run differ from those its checkpoint was trained with "
                "(another CPU or torch build rounds an iterative pruning differently); the run continues "
                "with the checkpoint's masks, as it started",
                RuntimeWarning,
                stacklevel=2,
            )
        self.set_masks(saved)


def warn_scalars_unprotected(what: str, *, relies: str = "") -> None:
    """The :class:`PrivacyWarning` of a zeroth-order method run with
    ``method.secure_aggregation=false``: the server then sees ``what`` (each client's scalars),
    directional derivatives of the loss on that client's data along public directions."""
    warnings.warn(
        f"method.secure_aggregation=false: the server sees each client's {what}, directional "
        f"derivatives of the loss on that client's data along public directions{relies}; turn "
        "it on unless you are measuring exactly this",
        PrivacyWarning,
        stacklevel=3,
    )
