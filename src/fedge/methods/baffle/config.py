"""BAFFLE's configuration: the ``method.*`` keys of either mode, the zeroth-order estimate they
describe (:meth:`BaffleConfig.zo_spec`: K, σ, scheme and directions of Eq. (6), seed 000), and what
the method declares to the registry (capabilities, mechanism defaults, divergence advice, what a
client uploads). The choices behind the defaults (clip 0.3, shared perturbations, the EMA schedule):
``docs/methods/baffle.md``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, model_validator

from fedge.core.errors import ConfigError
from fedge.core.rng import Draws
from fedge.estimators import ZerothOrderSpec
from fedge.estimators.directions import Directions, layer_scaled, layer_scales, make_directions
from fedge.methods.base import MethodConfigBase, MethodEnv, ServerOptimizerConfig
from fedge.methods.local import ClientOptimizerConfig
from fedge.methods.spec import Capabilities

__all__ = [
    "CAPABILITIES",
    "DEFAULTS",
    "BaffleConfig",
    "advice",
    "perturbation_threads",
    "round_spec",
    "upload",
]

_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


# The server optimizer each mode defaults to: BAFFLE's Adam on the estimate (batch), FedAvg (epoch).
_BATCH_SERVER_OPTIMIZER: dict[str, Any] = {"name": "adam", "lr": 0.01, "b1": 0.9, "b2": 0.99}
_EPOCH_SERVER_OPTIMIZER: dict[str, Any] = {"name": "sgd", "lr": 1.0}


class BaffleConfig(MethodConfigBase):
    """BAFFLE's own keys; the composer (:mod:`fedge.methods.compose`) attaches the mechanism
    options its capabilities allow (``secure_aggregation``/``secagg_*``, ``ema``/``ema_*``,
    ``freeze``), with BAFFLE's defaults (:data:`DEFAULTS`)."""

    if TYPE_CHECKING:  # attached by the composer; read by the consistency rules below
        secure_aggregation: bool | None
        secagg_dropout: float

    name: Literal["baffle"] = "baffle"
    mode: Literal["batch", "epoch"] = Field(
        "epoch", description="batch-level (FedSGD) or epoch-level (FedAvg)"
    )
    k: int = Field(100, ge=1, description="K: loss differences per estimate")
    sigma: float = Field(1e-4, gt=0, description="perturbation scale σ")
    scheme: Literal["central", "forward"] = Field(
        "forward", description="central or twice-FD (forward)"
    )
    estimator: Literal["lean", "fast", "jvp", "activity"] = Field(
        "fast",
        description="activity (epoch mode): activity perturbation (Ren et al. 2023), K seeded perturbations of each "
        "linear/conv layer's output per sample, each sample's loss differences from forwards of the layers after it, "
        "the layer's weight gradient formed locally from its input (fedge.estimators.activity; scored by the global "
        "loss, or by block-local heads with method.local_heads); jvp: forward-mode differentiation (NOT inference-only: exact directional derivatives by "
        "torch.func.jvp, one pass per direction, uploaded as c·σ·∇L·z_k so the server is unchanged; rounds log "
        "forward_mode_ad=1); lean (least memory) or fast (a forward of the batch of at most ~90 MFLOP, e.g. LeNet-5 up to "
        "159 samples, BAFFLE's LeNet up to 8: perturbations batched; more: perturbations split over "
        "`perturbation_threads`, one model copy per thread; at epoch level it keeps up to 64 MiB of the forwards' "
        "perturbations so the client's own estimate does not draw them again)",
    )
    perturbation_threads: int | None = Field(
        None,
        ge=1,
        description="fast estimator: threads the K perturbations are split over, one torch thread each "
        "(null: every usable core when clients run in the engine's process, 1 with clients.workers > 0)",
    )
    chunk: int | None = Field(
        None, ge=1, description="perturbations per batched pass (fast estimator)"
    )
    local_heads: list[str] = Field(
        default_factory=list,
        description="estimator=activity: names of modules (as model.named_modules() names them, e.g. "
        "features.conv1) whose output closes a block scored by a local head (Ren et al. 2023, local losses: "
        "average pooling and a linear classifier, estimated forward-only beside the model, sent with it and "
        "averaged by the server); a block's layers are scored by its head's loss, their perturbed forwards "
        "stopping there (a greedy per-block objective); empty: every layer scored by the global loss",
    )
    head_pool: int = Field(
        1,
        ge=1,
        description="with local_heads: the spatial size a head average-pools a block's output to before its "
        "linear classifier (1: global average pooling; a flat output goes to the classifier as it is)",
    )
    head_groups: int = Field(
        1,
        ge=1,
        description="with local_heads: channel groups per head (Ren et al. 2023's group-wise local losses): a "
        "head holds one classifier per group of a block's output channels, each scored by a loss in which only "
        "its group's features move, and the block's last layer weights each channel's perturbation by its own "
        "group's loss (less variance at the same K); must divide every head block's channel count; 1: one loss a head",
    )
    head_patches: int = Field(
        1,
        ge=1,
        description="with local_heads and head_pool=1: patches per side (Ren et al. 2023's patch-wise local losses): "
        "a head block's 2-d output split into head_patches x head_patches equal patches, a loss per patch (and "
        "channel group) in which only its patch's share of the pooled features moves, the block's last layer "
        "weighting each position's perturbation by its own patch's loss; must divide the output's height and width; "
        "1: none",
    )
    directions: Literal["gaussian", "orthogonal", "block"] = Field(
        "gaussian",
        description="perturbation directions: gaussian (BAFFLE's i.i.d.), orthogonal (randomized Hadamard per "
        "tensor) or block (per-layer, K split ∝ sqrt(layer size)); see fedge.estimators.directions",
    )
    perturb: list[str] | None = Field(
        None,
        description="shell-style patterns of the parameters to perturb and train (null: all trainable)",
    )
    batch_size: int = Field(
        64,
        ge=1,
        description="samples per loss evaluation (with delta_loss_on=local_set: per forward chunk)",
    )
    delta_loss_on: Literal["batch", "local_set"] = Field(
        "local_set",
        description="batch mode: ΔL over the client's whole local set D_c (Algorithm 1, line 12; forwards run "
        "in chunks of batch_size) or over one mini-batch of batch_size drawn each round (cheaper, noisier)",
    )
    local_epochs: int = Field(1, ge=1, description="epoch-level: local epochs per round")
    max_steps: int | None = Field(
        None, ge=1, description="epoch-level: cap on local steps per round"
    )
    clip: float | None = Field(
        0.3, gt=0, description="inf-norm clip of each estimate (reference code); null: off"
    )
    client_optimizer: ClientOptimizerConfig = ClientOptimizerConfig(
        name="adam", lr=0.01, b1=0.9, b2=0.99
    )
    server_optimizer: ServerOptimizerConfig | None = Field(
        None,
        description="default: adam lr 0.01 betas (0.9, 0.99) for batch mode, sgd lr 1 (FedAvg) for epoch mode",
    )
    shared_perturbations: bool = True
    downlink: Literal["model", "seeds"] = Field(
        "model",
        description="batch mode: send the model every round, or only the round seeds and aggregated loss "
        "differences a client missed (it rebuilds the model; the full model and optimizer state when smaller)",
    )
    precision: Literal["float32", "bfloat16", "float16"] = "float32"
    sigma_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="σ schedule: round t perturbs with σ·sigma_decay^(t−1) (client and server alike); 1: constant",
    )
    k_final: int | None = Field(
        None,
        ge=1,
        description="epoch mode: K schedule, K ramped linearly from k (round 1) to k_final (the last round), "
        "rounded; null: constant K",
    )
    sigma_scale: Literal["global", "layer"] = Field(
        "global",
        description="global: one σ for every coordinate (BAFFLE); layer: layer l perturbed by σ·s_l, s_l its "
        "weight RMS normalised to a mean s² of 1 (fedge.estimators.directions.layer_scales), so every layer is "
        "perturbed by the same fraction of its weights; the estimate is then of S²∇L, the gradient "
        "preconditioned per layer by s_l²",
    )
    guided_rank: int = Field(
        0,
        ge=0,
        description="batch mode: r, the last r global updates whose span guided directions lie in (sent with the "
        "model: r more model-sized arrays down a round); 0: off (every direction fresh)",
    )
    guided_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="with guided_rank > 0: the share of the K directions drawn in that span (the rest fresh "
        "Gaussians); the estimate is then biased by −share·(I − P)g, P the projection on the span",
    )
    prefix_once: bool = Field(
        False,
        description="run the leading layers that hold no perturbed coordinate (method.freeze, method.perturb) "
        "once per batch and the K perturbed forwards through the rest only (lean and threaded estimators; the "
        "fast estimator's batched pass always shares them): the same losses, fewer FLOPs",
    )

    @model_validator(mode="before")
    @classmethod
    def _partial_server_optimizer(cls, data: Any) -> Any:
        """``method.server_optimizer.lr=0.03`` alone tunes the mode's default optimizer (batch mode's
        Adam), rather than building an SGD from the class defaults; naming ``name`` starts afresh."""
        if (
            isinstance(data, dict)
            and isinstance(data.get("server_optimizer"), dict)
            and "name" not in data["server_optimizer"]
        ):
            base = (
                _BATCH_SERVER_OPTIMIZER
                if data.get("mode", "epoch") == "batch"
                else _EPOCH_SERVER_OPTIMIZER
            )
            data = {**data, "server_optimizer": {**base, **data["server_optimizer"]}}
        return data

    @model_validator(mode="after")
    def _defaults_and_consistency(self) -> BaffleConfig:
        if self.server_optimizer is None:
            self.server_optimizer = ServerOptimizerConfig(
                **(_BATCH_SERVER_OPTIMIZER if self.mode == "batch" else _EPOCH_SERVER_OPTIMIZER)
            )
        if (
            self.mode == "batch"
            and self.client_optimizer != type(self).model_fields["client_optimizer"].default
        ):
            raise ValueError(
                "method.client_optimizer is not used in batch mode: clients send loss differences and the server "
                "steps with method.server_optimizer; set method.server_optimizer.* instead (or method.mode=epoch)"
            )
        if "secure_aggregation" in type(self).model_fields:  # the composed section
            if self.secure_aggregation is None:  # BAFFLE's default: on where Eq. (7) sums
                self.secure_aggregation = self.mode == "batch" and self.shared_perturbations
            if self.secagg_dropout and not self.secure_aggregation:
                raise ValueError("secagg_dropout only applies with secure_aggregation=true")
            if self.secure_aggregation and self.mode == "batch" and not self.shared_perturbations:
                raise ValueError(
                    "secure_aggregation needs shared_perturbations=true: the server only learns "
                    "the sum of the loss differences, so every client must use the same perturbations"
                )
        if self.guided_rank and (
            self.mode != "batch" or self.downlink != "model" or self.directions != "gaussian"
        ):
            raise ValueError(
                f"guided_rank={self.guided_rank} needs mode=batch, downlink=model and directions=gaussian (the "
                "server sends the last global updates with the model and rebuilds the estimate from them); got "
                f"mode={self.mode}, downlink={self.downlink}, directions={self.directions}"
            )
        if self.estimator == "activity":
            self._check_activity()
        elif self.local_heads:
            raise ValueError(
                f"local_heads={self.local_heads} scores blocks of activity-perturbed layers; set "
                "method.estimator=activity (with method.mode=epoch), or method.local_heads=[]"
            )
        if self.head_patches > 1 and (not self.local_heads or self.head_pool != 1):
            raise ValueError(
                f"head_patches={self.head_patches} splits the local heads' losses by patch, which needs "
                f"local_heads (got {self.local_heads}) and heads that pool globally, head_pool=1 (got "
                f"{self.head_pool}); set them, or method.head_patches=1"
            )
        if self.head_groups > 1 and not self.local_heads:
            raise ValueError(
                f"head_groups={self.head_groups} splits the local heads' losses by channel group, but "
                "local_heads is empty; name the blocks (e.g. method.local_heads=[features.conv1]) or set "
                "method.head_groups=1"
            )
        if self.k_final is not None and self.mode != "epoch":
            raise ValueError(
                f"k_final={self.k_final} (a K schedule) needs mode=epoch: in batch mode every reply's K scalars are "
                "summed (secure aggregation, DP) with one shape for the run; schedule sigma (sigma_decay) instead"
            )
        if self.sigma_scale == "layer" and self.estimator == "activity":
            raise ValueError(
                "sigma_scale=layer scales weight perturbations, but estimator=activity perturbs activations; "
                "set method.sigma_scale=global (or a weight estimator: method.estimator=fast)"
            )
        if self.sigma_scale == "layer" and self.downlink == "seeds":
            raise ValueError(
                "sigma_scale=layer with downlink=seeds: the client's replay of missed rounds uses one σ for every "
                "layer; use downlink=model with layer-scaled σ"
            )
        if self.sigma_decay != 1.0 and self.downlink == "seeds":
            raise ValueError(
                f"sigma_decay={self.sigma_decay} with downlink=seeds: the client's replay of missed rounds uses one σ; "
                "use downlink=model with a σ schedule"
            )
        if self.downlink == "seeds" and (self.mode != "batch" or not self.shared_perturbations):
            raise ValueError(
                "downlink=seeds rebuilds the model from the round seed and the K aggregated loss differences: "
                "it needs mode=batch and shared_perturbations=true"
            )
        return self

    def _check_activity(self) -> None:
        """``estimator: activity`` perturbs the client's own activations: only a client that
        applies its own update (epoch mode) can use them, along Gaussian directions, in float32."""
        if self.mode != "epoch":
            raise ValueError(
                f"estimator=activity needs mode=epoch, got mode={self.mode}: batch mode uploads K loss "
                "differences along seeded weight directions the server regenerates, but activity "
                "perturbation's directions live in the client's own activations, which the server cannot "
                "rebuild, so the client must apply its own estimate and upload the delta; set method.mode=epoch "
                "(or method.estimator=fast for batch mode)"
            )
        if self.directions != "gaussian":
            raise ValueError(
                f"estimator=activity draws Gaussian activation perturbations, got directions={self.directions}; "
                "set method.directions=gaussian"
            )
        if self.precision != "float32":
            raise ValueError(
                f"estimator=activity runs its forwards in float32, got precision={self.precision}; set "
                "method.precision=float32"
            )

    @property
    def dtype(self) -> torch.dtype | None:
        return _DTYPES[self.precision]

    def zo_spec(
        self,
        workers: int | None = None,
        *,
        draws: Draws = "torch",
        device: torch.device | None = None,
    ) -> ZerothOrderSpec:
        """The zeroth-order estimate this config describes (BAFFLE Eq. 6: ``k``, ``sigma``,
        ``scheme``, ``directions``; ``estimator`` as the mode, ``chunk``, ``precision``,
        ``prefix_once``), its
        fast mode split over ``workers`` threads (:func:`perturbation_threads`), its directions
        drawn by ``draws`` (the run's ``draws``, from :class:`~fedge.methods.base.MethodEnv`:
        a run-level choice, not a method key) on ``device`` (the run's ``device``, likewise)."""
        mode = self.estimator
        if mode == "activity":
            raise ConfigError(
                "estimator=activity perturbs activations, not weights: it has no zeroth-order weight "
                "spec (fedge.methods.baffle.epoch.activity_gradient_fn runs it)"
            )
        return ZerothOrderSpec(
            k=self.k,
            sigma=self.sigma,
            scheme=self.scheme,
            directions=self.directions,
            mode=mode,
            chunk=self.chunk,
            dtype=self.dtype,
            workers=workers,
            draws=draws,
            prefix_once=self.prefix_once,
            device=device,
        )


def round_spec(spec: ZerothOrderSpec, cfg: BaffleConfig, rnd: int, rounds: int) -> ZerothOrderSpec:
    """``spec`` with round ``rnd``'s K and σ (of ``rounds``): σ·sigma_decay^(rnd−1) and, with
    ``k_final``, K = round(k + (k_final − k)·(rnd − 1)/(rounds − 1)); ``spec`` itself when no
    schedule is set (so a run without one is unchanged)."""
    if cfg.sigma_decay == 1.0 and cfg.k_final is None:
        return spec
    k = cfg.k
    if cfg.k_final is not None and rounds > 1:
        k = round(cfg.k + (cfg.k_final - cfg.k) * (min(rnd, rounds) - 1) / (rounds - 1))
    return dataclasses.replace(spec, k=k, sigma=cfg.sigma * cfg.sigma_decay ** (rnd - 1))


def layer_scaled_spec(
    spec: ZerothOrderSpec,
    cfg: BaffleConfig,
    params: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor] | None,
) -> ZerothOrderSpec:
    """``spec`` with its directions scaled per layer by the weights of ``params`` (the perturbed
    parameters as they are when the estimate runs: the round's model in batch mode, on client
    and server alike) when ``sigma_scale: layer``; ``spec`` itself otherwise."""
    if cfg.sigma_scale == "global":
        return spec
    dirs = spec.directions
    if not isinstance(dirs, Directions):
        shapes = {n: p.shape for n, p in params.items()}
        dirs = make_directions(dirs, shapes, spec.k, masks, draws=spec.draws, device=spec.device)
    return dataclasses.replace(spec, directions=layer_scaled(dirs, layer_scales(params, masks)))


def perturbation_threads(cfg: BaffleConfig, env: MethodEnv) -> int:
    """Threads the fast estimator splits the K perturbations over (see ``perturbation_threads``)."""
    if cfg.perturbation_threads is not None:
        return cfg.perturbation_threads
    return 1 if env.workers else len(os.sched_getaffinity(0))


#: what BAFFLE can do, in both modes: its server averages the replies (K loss differences or
#: model deltas) into one global model, trained only where it is not frozen; epoch mode's dense
#: delta can be compressed (batch mode's K scalars are refused by their ``upload``)
CAPABILITIES = Capabilities(
    sums_replies=True, global_model=True, freezable=True, client_optimizer=True, dense_upload=True
)


def advice(cfg: BaffleConfig) -> list[str]:
    """What else tames a diverging BAFFLE run: its inf-norm clip of the estimate."""
    if cfg.clip is not None:
        return [f"set a smaller method.clip (now {cfg.clip})"]
    return ["turn on method.clip (now null; the reference code uses 0.3)"]


def upload(cfg: BaffleConfig) -> Literal["loss_differences", "estimate_delta"]:
    """Batch mode: K loss differences (with the seed broadcast); epoch mode: a model delta."""
    return "loss_differences" if cfg.mode == "batch" else "estimate_delta"


#: BAFFLE's own defaults for mechanism options: EMA 0.995 (Section 4.1); secure aggregation
#: null, i.e. on in batch mode, whose K loss differences Eq. (7) sums (resolved by the config)
DEFAULTS: dict[str, Any] = {"ema": 0.995, "secure_aggregation": None}
