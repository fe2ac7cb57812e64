"""PPFL (seed 001: "PPFL: Privacy-preserving Federated Learning with Trusted Execution
Environments", Mo et al., MobiSys 2021): greedy layer-wise (or block-wise) federated learning with
the layer under training inside attested, memory-budgeted enclaves on the clients and the server
(Algorithm 1-2). The stage plan is :mod:`.stages`, the keys :mod:`.config`, the server REE
:mod:`.strategy`, the client REE :mod:`.client` and both enclaves :mod:`.enclaves`; this module
registers the method. Parties, attestation, selection by enclave memory, evaluation, the last layer
kept in the enclaves and the simulation's limits: ``docs/methods/ppfl.md``.
"""

from __future__ import annotations

import warnings
from functools import partial

from fedge.core.errors import ConfigError, PrivacyWarning
from fedge.core.protocols import PartySpec
from fedge.methods.base import MethodBuild, MethodEnv
from fedge.methods.ppfl.client import PpflClient
from fedge.methods.ppfl.config import PpflConfig, PpflTeeConfig, init_arrays
from fedge.methods.ppfl.enclaves import ClientEnclave, EnclaveSpec, ServerEnclave
from fedge.methods.ppfl.stages import plan_stages
from fedge.methods.ppfl.strategy import PpflStrategy
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities
from fedge.privacy.tee import MiB

__all__ = [
    "PpflClient",
    "PpflConfig",
    "PpflStrategy",
    "PpflTeeConfig",
    "build",
    "schedule_shortfall",
]


def schedule_shortfall(cfg: PpflConfig, n_stages: int, rounds: int) -> str | None:
    """Why ``rounds`` cannot train every stage the schedule plans (None when they can): a fixed
    schedule (``rounds_per_stage`` alone) needs that many rounds for each stage left to train; an
    adaptive one (``patience``, ``stage_patience``, ``target_accuracy``) at least one round per stage."""
    first = cfg.freeze_from_init
    left = n_stages - first
    if left <= 0:
        return None  # the strategy refuses this by name
    fixed = cfg.patience is None and cfg.target_accuracy is None and cfg.stage_patience is None
    per = cfg.rounds_per_stage if fixed and cfg.rounds_per_stage is not None else 1
    need = per * left
    if rounds >= need:
        return None
    full, rem = divmod(rounds, per)  # stages trained to the end of their schedule, and the rest

    def span(a: int, b: int) -> str:
        return f"stage {a}" if a == b else f"stages {a}-{b}"

    what = [f"only {span(first, first + full - 1)} will train"] if full else []
    if rem:
        what.append(f"stage {first + full} gets {rem} of its {per} rounds")
    after = first + full + (rem > 0)
    if after < n_stages:
        what.append(f"{span(after, n_stages - 1)} never train" + "s" * (after == n_stages - 1))
    schedule = f"method.rounds_per_stage={per}" if fixed else "at least 1 round per stage"
    return (
        f"ppfl: rounds={rounds} cannot train all {left} stage(s) (stages {first}-{n_stages - 1}; "
        f"{left} x {per} round(s) by {schedule} = {need} rounds needed): {', '.join(what)}; "
        f"set rounds={need}"
        + (" or lower method.rounds_per_stage" if fixed and per > 1 else "")
        + (" or raise method.block_layers" if n_stages > 1 else "")
    )


@declare_method(
    "ppfl",
    "PPFL: greedy layer-wise FL, the layer under training inside attested, memory-budgeted, sealed enclaves",
    config=PpflConfig,
    capabilities=Capabilities(),  # layer-wise aggregation inside its own enclave
    upload=lambda cfg: "ciphertext",
)
def build(cfg: PpflConfig, env: MethodEnv) -> MethodBuild:
    """Build PPFL: the strategy, the client REE program, and the enclaves ``tee`` and ``server_tee``."""
    if env.workers:
        raise ConfigError(
            f"ppfl needs clients.workers=0 (got {env.workers}): its enclaves' device keys live in one process"
        )
    stages = plan_stages(env.model_fn(), tuple(env.input_shape), cfg.block_layers)
    spec = EnclaveSpec(
        env.model_fn,
        stages,
        env.seed,
        init_arrays(cfg, env),
        cfg.model_dump(exclude={"init_from"}),
        cfg.tee.server_mb,
    )
    if not cfg.keep_last_in_tee:
        warnings.warn(
            "method.keep_last_in_tee=false: when training ends the REE and model.safetensors get every layer, the last "
            "one included, so whoever holds the model can run membership inference on it (PPFL keeps the last layer in "
            "the client enclaves against exactly this, Sec. 3); keep it unless you are measuring that risk",
            PrivacyWarning,
            stacklevel=2,
        )
    short = schedule_shortfall(cfg, len(stages), env.rounds)
    if short is not None:
        warnings.warn(short, UserWarning, stacklevel=2)
    strategy = PpflStrategy(cfg, spec, num_clients=len(env.client_sizes), rounds=env.rounds)
    # enclaves too small for a stage: refused here, before anything is written
    if env.profiles is not None:
        strategy.check_profiles(list(env.profiles))
    else:  # every client's enclave is method.tee.client_mb
        strategy.check_fits([int(cfg.tee.client_mb * MiB)])
    parties = {
        "tee": PartySpec("tee", partial(ClientEnclave, spec), scope="client"),
        "server_tee": PartySpec("server_tee", partial(ServerEnclave, spec), scope="shared"),
    }
    return MethodBuild(strategy, PpflClient(spec), parties)
