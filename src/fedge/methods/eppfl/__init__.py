"""EPPFL (seed 003: "Efficient and Privacy-Preserving Federated Learning on the edge"): split
learning between each device and its own edge server, Laplace DP on the cut-layer activations,
activation/gradient selection, and aggregation with a third party's additive masks.

Four roles, each seeing only the messages it is sent (Fig. 1):

==================  =====================================  ===================================
role                 here                                   sees
==================  =====================================  ===================================
device c_i           :class:`~.device.DeviceProgram`         its data, the global M_c
edge server S_e      :class:`~.parties.EdgeServer`           released activations, labels, M_s
                     (side party ``edge``, one per device)
aggregation S_a      :class:`~.server.AggregationServer`     masked M_c uploads, every W_s
random numbers S_r   :class:`~.parties.RandomnessServer`     which devices were aggregated
                     (side party ``sr``, shared)
==================  =====================================  ===================================

Bytes are counted per link by the engine: ``bytes.client->edge`` / ``bytes.edge->client``
(activations up, gradients down), ``bytes_up`` / ``bytes_down`` (device ↔ S_a),
``bytes.server->edge`` / ``bytes.edge->server`` (M_s down / W_s up), ``bytes.client->sr`` /
``bytes.sr->client`` (the device's request; its mask seed and Σ r_j), ``bytes.server->sr`` /
``bytes.sr->server`` (the aggregated ids; S_r's acknowledgement). The device's FLOPs and
memory are the client's (``client_flops``); the edge servers' are ``flops.edge``.

**Differences from the paper, and why.**

- *DP*. The paper scales Laplace noise by a data-dependent sensitivity (Eq. 6-7), which is
  not a DP guarantee. Here each sample's released activations (after selection) are clipped
  to L1 norm ``dp.clip`` and every coordinate gets ``Lap(2·clip/ε)`` (replace-one adjacency,
  Δ₁ = 2·clip): one release is ε-DP for that sample's input. Each sample is released once per
  local epoch of every round its device joins; ``dp-accounting`` composes those Laplace events
  (RDP and PLD) and the worst device's cumulative ε is logged each round. The labels travel
  in the clear, as in the paper: the guarantee covers the inputs, with labels public. What ε
  does not cover (as in the paper's own accounting): a release depends on its sample through
  the device half that computed it, which SGD trains on the raw samples between releases, so
  later releases carry traces of earlier samples; and batch statistics (BatchNorm in the device
  half, which the build warns about) make a batch's rows depend on each other. The noise comes
  from the run's generators (reproducible, so the edge server could subtract it if it knew the
  seed) unless ``method.dp.secure_noise``, which draws it from the OS CSPRNG.
- *Masks*. ``W_c + r_i`` in floats hides nothing exactly. Here W_c is encoded in the
  fixed-point ring Z_{2^64} (32 fractional bits) and masked with r_i = PRG(HKDF(secret, t, i))
  (AES-256-CTR), so a single upload is uniformly distributed whatever W_c is, and
  (Σ uploads − Σ r_j) / n is exactly the fixed-point mean: it differs from the float mean
  by at most 2^-33 per coordinate (each encoding rounds by ≤ 2^-33), plus float32 rounding.
  S_r sends Σ r_j rather than r̄ (the device divides after unmasking).
- *Weights*. Both halves are averaged with equal weights, Eq. (9)-(10) (the paper's devices
  hold equal data), not Eq. (1)'s η_i = |d_i|/Σ|d_j|: with unequal local datasets a device's
  update counts as much as any other's, unlike FedAvg. (Weighting under the masks would need
  each device to scale W_c by |d_i| before encoding, and S_a to learn the sizes.)
- *Optimizer*. SGD with momentum on both halves (lr 0.01, momentum 0.5, batch 16, as Sec. 3),
  restarted every round on both, like FedAvg's client optimizer.

**Threat model.** S_a and S_r must not collude (together they unmask the global M_c; with a
device's id S_r's secret also unmasks that device's upload), nor S_a and a device (S_r gives
Σ r_j over whatever set S_a registers; see :mod:`.parties`). S_r's secret is derived from the run
seed, so this holds only against parties that do not know the seed: a simulation, as the
reproducible DP noise. S_a sees masked M_c uploads and, in the clear, the edge servers' W_s
(as the paper, which argues M_s is DP by post-processing); also in the clear, M_c's integer
buffers (BatchNorm's ``num_batches_tracked`` in the device half: how many batches it trained,
so |d_i| to within a batch) and each device's mean training loss (a metric, sent for the
run's log; the paper's S_a receives neither). S_r sees only ids. A device learns the global
M_c (it must, to train). An edge server sees its device's DP-released activations and labels.
Devices that drop out are handled without recovery: S_r's Σ r_j covers exactly the devices
S_a reports as aggregated.

**Simulation shortcut.** S_a cannot evaluate M_c; the run's test evaluation reads it through
an evaluation-only copy of S_r's keys (:class:`~.server.AggregationServer` ``oracle``),
which is what any device computes after step ⑨. Nothing it computes travels or is charged.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Literal

from pydantic import Field
from torch import nn

from fedge.core.errors import PrivacyWarning
from fedge.core.protocols import PartySpec
from fedge.methods.base import MethodBuild, MethodConfigBase, MethodEnv
from fedge.methods.eppfl.device import DeviceProgram, float_keys
from fedge.methods.eppfl.parties import EdgeServer, MaskKeys, RandomnessServer
from fedge.methods.eppfl.server import AggregationServer
from fedge.methods.eppfl.split import Split, split_model
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities
from fedge.privacy.secagg import FixedPoint

__all__ = ["EppflConfig", "EppflDpConfig", "FIXED_POINT", "build"]

FIXED_POINT = FixedPoint(bits=64, frac_bits=32)


class EppflDpConfig(MethodConfigBase):
    """``method.dp``: Laplace DP on the released activations (omit or null: no DP)."""

    epsilon: float = Field(gt=0, description="ε of one release of one sample's activations")
    clip: float = Field(
        gt=0, description="per-sample L1 bound C of the released activations (Δ₁ = 2C)"
    )
    delta: float = Field(
        1e-5, gt=0, lt=1, description="δ at which the cumulative ε is reported (RDP, PLD)"
    )
    secure_noise: bool = Field(
        False,
        description="draw the Laplace noise from the OS CSPRNG (a deployment; not reproducible). Off: from "
        "the run's generators, so anyone who knows the seed, the edge server included, can subtract it",
    )


class EppflConfig(MethodConfigBase):
    name: Literal["eppfl"] = "eppfl"
    cut: str | None = Field(None, description="module to cut after (null: first conv + activation)")
    local_epochs: int = Field(2, ge=1, description="E_loc")
    batch_size: int = Field(16, ge=1)
    lr: float = Field(0.01, gt=0, description="SGD learning rate, device and edge server")
    momentum: float = Field(0.5, ge=0, lt=1)
    theta_a: float = Field(
        1.0, gt=0, le=1, description="fraction of each channel's activations sent"
    )
    theta_g: float = Field(
        1.0,
        gt=0,
        le=1,
        description="fraction of each channel's released activations whose gradient is returned (largest |dA|)",
    )
    dp: EppflDpConfig | None = None
    masks: bool = Field(True, description="third-party additive masks on the uploaded M_c")
    upload_dropout: float = Field(
        0.0, ge=0, lt=1, description="simulated fraction of uploads lost each round"
    )


def _split(model_fn: Callable[[], nn.Module], cut: str | None) -> Split:
    return split_model(model_fn(), cut)


def _warn_unprotected(cfg: EppflConfig) -> None:
    """A :class:`PrivacyWarning` for each of EPPFL's two protections that is off (its paper
    relies on both; the preset ``eppfl-fmnist-vgg`` has both on)."""
    if cfg.dp is None:
        warnings.warn(
            "method.dp is not set: each device's edge server receives its cut-layer activations without noise "
            "(EPPFL releases them under Laplace DP), and activations this close to the input can be inverted to it "
            "(fedge attack --attack dlg on an EPPFL run measures that); set method.dp (e.g. {epsilon: 5.0, clip: "
            "100.0}, as configs/eppfl-fmnist-vgg.yaml) unless you are measuring exactly this",
            PrivacyWarning,
            stacklevel=3,
        )
    if not cfg.masks:
        warnings.warn(
            "method.masks=false: the aggregation server sees each device's model half M_c in the clear (EPPFL hides "
            "it under a third party's additive masks), from which a device's update, and its data, can be attacked; "
            "keep the masks unless you are measuring exactly this",
            PrivacyWarning,
            stacklevel=3,
        )


def _warn_batch_coupling(cfg: EppflConfig, split: Split) -> None:
    """A :class:`PrivacyWarning` when DP is on and the device half normalizes with batch
    statistics: each released row then depends on every sample of its batch, so the logged ε
    (a sample's own releases, ε each) understates what one sample's batch releases reveal."""
    norms = sorted(
        {
            type(m).__name__
            for m in split.device.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        }
    )
    if cfg.dp is None or not norms:
        return
    warnings.warn(
        f"method.dp with {'/'.join(norms)} in the device half (cut {cfg.cut or 'default'}): batch statistics make every "
        f"released row depend on all {cfg.batch_size} samples of its batch, so a sample's privacy loss per batch can "
        f"reach {cfg.batch_size}·ε, not the ε each release is accounted at; use a model whose device half has no batch "
        "statistics (e.g. model.norm: group) or cut before the norm, for the logged ε to bound it",
        PrivacyWarning,
        stacklevel=3,
    )


@declare_method(
    "eppfl",
    "EPPFL: device/edge split learning, Laplace DP on cut activations, selection, third-party masks",
    config=EppflConfig,
    capabilities=Capabilities(),  # its own masks and DP; the server sums no plain replies
    upload=lambda cfg: "edge_activations",
)
def build(cfg: EppflConfig, env: MethodEnv) -> MethodBuild:
    """Build EPPFL: the device program, S_a, and the side parties ``edge`` and ``sr``."""
    split_fn = partial(_split, env.model_fn, cfg.cut)
    split = split_fn()  # validates the cut now (ConfigError naming it)
    _warn_unprotected(cfg)
    _warn_batch_coupling(cfg, split)
    length = sum(split.device.state_dict()[split.device_keys[k]].numel() for k in float_keys(split))
    keys = MaskKeys.from_run_seed(env.seed, length, FIXED_POINT)
    strategy = AggregationServer(
        env.model_fn(),
        split_fn,
        cfg,
        seed=env.seed,
        num_clients=len(env.client_sizes),
        fp=FIXED_POINT,
        oracle=keys if cfg.masks else None,
    )
    program = DeviceProgram(split_fn, cfg, FIXED_POINT)
    edge = EdgeServer(split_fn, theta_g=cfg.theta_g, lr=cfg.lr, momentum=cfg.momentum)
    sr = RandomnessServer(keys)
    parties = {"edge": PartySpec("edge", edge, scope="client")}
    if cfg.masks:
        parties["sr"] = PartySpec("sr", lambda: sr, scope="shared")
    return MethodBuild(strategy, program, parties)
