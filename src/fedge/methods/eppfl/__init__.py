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

from collections.abc import Callable
from functools import partial

from torch import nn

from fedge.core.protocols import PartySpec
from fedge.methods.base import MethodBuild, MethodEnv
from fedge.methods.eppfl.config import (
    FIXED_POINT,
    EppflConfig,
    EppflDpConfig,
    warn_batch_coupling,
    warn_unprotected,
)
from fedge.methods.eppfl.device import DeviceProgram, float_keys
from fedge.methods.eppfl.parties import EdgeServer, MaskKeys, RandomnessServer
from fedge.methods.eppfl.server import AggregationServer
from fedge.methods.eppfl.split import Split, split_model
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities

__all__ = ["EppflConfig", "EppflDpConfig", "FIXED_POINT", "build"]


def _split(model_fn: Callable[[], nn.Module], cut: str | None) -> Split:
    return split_model(model_fn(), cut)


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
    warn_unprotected(cfg)
    warn_batch_coupling(cfg, split)
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
