"""EPPFL (seed 003: "Efficient and Privacy-Preserving Federated Learning on the edge"): split
learning between each device (:mod:`.device`, Algorithm 1 lines 5-26) and its own edge server
(:mod:`.parties`, Eq. (3)-(4)), Laplace DP on the cut-layer activations, activation and gradient
selection (:mod:`.split`, Sec. 2.3), and aggregation of the masked device halves by S_a
(:mod:`.server`, Eq. (9)-(10)) with a third party's additive masks; the keys are in :mod:`.config`,
and this module registers the method. Roles, bytes per link, the differences from the paper (DP,
masks, weights, optimizer), the threat model and the simulation shortcut: ``docs/methods/eppfl.md``.
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
    warn_paper_sensitivity,
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
    warn_paper_sensitivity(cfg)
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
