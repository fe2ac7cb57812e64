"""What EPPFL's edge server S_e holds after round 1 (the side party whose messages
:func:`~fedge.attacks.observe.observe_parties` records): each device's released (kept, clipped,
noisy) cut activations, put back at their positions (regenerated from the message's seed, θ_a),
and the round's global M_c (broadcast in the clear in round 1) loaded into the device half of the
split model, run as the device ran it. Activation inversion
(:func:`~fedge.attacks.inversion.activation_inversion`) and property inference at the edge
(:func:`~fedge.attacks.property.edge_pia_attack`) attack this view.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedge.attacks.harness import ObservedRun, upload_of
from fedge.core.errors import ConfigError

__all__ = ["dense_activations", "device_as_run", "edge_view", "released_activations"]


def edge_view(run: ObservedRun, attack: str) -> tuple[dict[int, Any], Any]:
    """What an EPPFL edge server holds after round 1: each device's first ``step`` message
    (its released activations, taken with the broadcast M_c), and the split model with the
    round-1 global M_c (broadcast in the clear in round 1) loaded into its device half."""
    from fedge.methods.eppfl.split import split_model  # noqa: PLC0415

    built = run.built
    if upload_of(built) != "edge_activations":
        raise ConfigError(
            f"{attack} attacks activations released to an edge server (EPPFL's); this run is "
            f"{built.config.method.name!r}, which releases none"
        )
    steps: dict[int, Any] = {}
    for r in (
        run.party_records
    ):  # the first step of each device in round 1: taken with the broadcast M_c
        if (
            r.party == "edge"
            and r.rnd == 1
            and r.message.config.get("op") == "step"
            and r.key is not None
        ):
            steps.setdefault(r.key, r.message)
    if not steps:
        raise ConfigError(
            "no activations observed at the edge server in round 1; run observe_run with parties=('edge',)"
        )
    sent = next((o.sent for o in run.observer.records if o.rnd == 1 and o.sent.arrays), None)
    if sent is None or "masked_sum" in sent.config:
        raise ConfigError("round 1's broadcast of M_c was not observed in the clear")
    split = split_model(built.model_fn(), getattr(built.method_config, "cut", None))
    dstate = split.device.state_dict()
    with torch.no_grad():
        for key, local in split.device_keys.items():
            dstate[local].copy_(sent.arrays[key])
    return steps, split


def dense_activations(a: torch.Tensor, seed_pos: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """(B, C·N) released values at their positions, zeros at positions not released."""
    from fedge.methods.eppfl.split import activation_positions, scatter  # noqa: PLC0415

    if seed_pos >= 0:
        a = scatter(
            a.to(torch.float32), activation_positions(seed_pos, shape, a.shape[-1]), shape[-1]
        )
    return a.reshape(shape[0], -1).to(torch.float32)


def device_as_run(device: torch.nn.Module) -> torch.nn.Module:
    """A copy of EPPFL's device half that computes what the device computed: norm layers in
    training mode (the device runs M_c in train mode, so BatchNorm uses the batch's statistics,
    not its running ones), everything else in eval mode (dropout off: the zoo's split points
    have none). A copy, so the attacker's forwards leave the run's running statistics alone."""
    import copy  # noqa: PLC0415

    twin = copy.deepcopy(device)
    for m in twin.modules():
        m.train(isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    return twin


def released_activations(step: Any) -> torch.Tensor:
    """An EPPFL ``step`` message as its edge server reads it: the (B, C·N_c) cut activations
    with the released values at their positions (regenerated from the message's seed, θ_a)
    and zeros where nothing was released."""
    full = tuple(int(v) for v in str(step.config["shape"]).split(","))
    b, c = full[0], full[1] if len(full) > 2 else 1
    return dense_activations(
        step.arrays["a"], step.config_int("seed", -1), (b, c, math.prod(full[1:]) // c)
    )
