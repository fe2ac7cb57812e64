"""FedPT: federated learning of partially trainable networks (seed 002, Algorithm 1).

The model ``x`` is split into a trainable part ``y`` and a frozen part that stays at its
seeded initial value for the whole run and is summarized by one seed ``z`` (Algorithm 1,
line 1). Each round:

- the server sends ``(y^(t), z)`` (line 3): the trainable tensors, the float buffers
  (BatchNorm statistics) and the model-init seed — never a frozen value;
- a client reconstructs ``x = Reconstruct(y, z)`` (line 5) by re-running the seeded
  initialisation (:func:`fedge.models.reset_parameters` with ``z``: with the default portable
  draws bit-identical on every machine; with ``draws: torch`` only across processes and machines
  of one torch build) and overwriting the trainable tensors with ``y``;
  it runs ``ClientOpt`` on ``y`` only (lines 6–9; frozen parameters have
  ``requires_grad=False``, so no gradient or optimizer state is ever held for them) and
  uploads ``Δ_i = y_i^(t,τ) − y_i^(t,0)`` (line 10);
- the server averages with weights ``p_i = n_i`` (line 12) and applies ``ServerOpt`` to
  ``−Δ`` (line 13).

Composition: the server is fedavg's :class:`~fedge.methods.fedavg.DeltaAveraging` on a model
whose frozen parameters do not require gradients (so its
:class:`~fedge.methods.base.GlobalModel` optimizes ``y`` only and its reply validation expects
exactly ``y``'s names and shapes), wrapped to send ``(y, z)`` instead of the whole model; the
client is :class:`~fedge.methods.local.LocalTraining`, preceded by the reconstruction.
Secure aggregation wraps it as it wraps FedAvg.

Which tensors freeze: ``method.freeze`` (:func:`fedge.models.blocks.resolve_freeze`):
``largest`` (principle 1), ``largest:N`` or module-name patterns. Normalization layers are
always trained (Sec. 3.1).

The frozen values (a stated difference): the paper's "are generated from Gaussian
initializers" (Sec. 3.1); ours are torch's default initialisation (kaiming-uniform weights,
uniform biases, bound ``1/sqrt(fan_in)``: :mod:`fedge.models.initialization`), which every model
of the zoo starts from, so that a FedPT run and its fully trainable FedAvg baseline start from
the same ``x^(0)`` and differ only in what is frozen. Regenerating them needs what the paper
asks, "the same random number generator" on server and clients; :func:`build` checks the
server's side; on Flower, a node whose seeded draws differ from the server's (under
``draws: torch``, another torch build; it would train against other frozen tensors) is refused
when it connects (:mod:`fedge.runtime.rngprobe`). No per-round digest of the rebuilt tensors
travels (it would add bytes to every downlink).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Round, Strategy, StrategyWrapper
from fedge.core.rng import Draws, check_draws, derive_seed
from fedge.methods.base import (
    MethodBuild,
    MethodEnv,
    check_reply_arrays,
    split_trainable,
)
from fedge.methods.fedavg import DeltaAveraging, FedAvgConfig
from fedge.methods.local import LocalTraining
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities
from fedge.models.blocks import freeze_, resolve_freeze
from fedge.models.initialization import portable_reset_parameters, reset_parameters

__all__ = [
    "FedPTClient",
    "FedPTConfig",
    "FedPTServer",
    "build",
    "describe",
    "freeze_",
    "reconstruct_",
    "trainable_fraction",
]

SEED_KEY = "seed"  # the downlink config key carrying z


class FedPTConfig(FedAvgConfig):
    """FedAvg's keys (ClientOpt, ServerOpt, E, B, weighting) plus ``freeze``."""

    name: Literal["fedpt"] = "fedpt"  # type: ignore[assignment]
    freeze: str | list[str] = Field(
        "largest",
        description="'largest' | 'largest:N' | module-name patterns such as [classifier.fc1] or ['features.*']; [] freezes nothing",
    )

    @field_validator("freeze")
    @classmethod
    def _non_empty_strings(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, str) and not v:
            raise ValueError(
                "expected 'largest', 'largest:N' or a list of module-name patterns, got ''"
            )
        return v


@torch.no_grad()
def reconstruct_(
    model: torch.nn.Module,
    arrays: Mapping[str, torch.Tensor],
    seed: int,
    *,
    draws: Draws = "torch",
) -> torch.nn.Module:
    """``Reconstruct(y, z)`` (Algorithm 1, line 5), in place: every tensor re-initialised from
    ``seed`` exactly as :func:`fedge.models.build_model` does with the same ``draws``
    (:func:`~fedge.models.initialization.portable_reset_parameters` for ``"portable"``), then
    the tensors in ``arrays`` (the trainable part and buffers) copied over. No second copy of
    the model is made."""
    if check_draws(draws) == "portable":
        portable_reset_parameters(model, seed)
    else:
        reset_parameters(model, torch.Generator().manual_seed(seed))
    state = model.state_dict()
    for k, v in arrays.items():
        state[k].copy_(v)
    return model


def trainable_fraction(model: torch.nn.Module) -> float:
    """Parameters with ``requires_grad`` over all parameters (Table 1's "Trainable Parameters")."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / total if total else 1.0


def _seed_of(message: Message, who: str) -> int:
    z = message.config.get(SEED_KEY)
    if isinstance(z, bool) or not isinstance(z, int) or not 0 <= z < 2**64:
        raise MessageError(
            f"{who}: downlink seed {z!r}; expected the model-init seed, an int in [0, 2**64)"
        )
    return z


class FedPTServer(StrategyWrapper):
    """Server side: :class:`DeltaAveraging` on the trainable part, broadcasting ``(y, z)``.

    Args:
        inner: DeltaAveraging over a model whose frozen parameters have ``requires_grad=False``.
        seed: ``z``, the seed the model was initialised from.
    """

    def __init__(self, inner: DeltaAveraging, *, seed: int) -> None:
        super().__init__(inner)
        self.averaging, self.seed = inner, seed
        self.weighted = inner.weighted
        params, buffers = split_trainable(inner.model)
        self.sent = params + buffers  # y and the float buffers, state-dict order
        self.fraction = trainable_fraction(inner.model)
        self.trainable_params = sum(p.numel() for p in inner.model.parameters() if p.requires_grad)

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        return (yield from Strategy.round(self, rnd, client_ids))

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        state = self.averaging.model.state_dict()
        broadcast = Message(
            {k: state[k].detach().clone() for k in self.sent},
            config={"round": rnd, SEED_KEY: self.seed},
        )
        return dict.fromkeys(client_ids, broadcast)

    def _metrics(self) -> dict[str, float]:
        return {"trainable_fraction": self.fraction, "trainable_params": self.trainable_params}

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        return {**self.averaging.aggregate_round(rnd, replies), **self._metrics()}

    # Summable (secure aggregation sums y's deltas, exactly what the plain server averages)
    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return self.averaging.summands()

    def apply_mean(
        self,
        rnd: int,
        mean: dict[str, torch.Tensor],
        *,
        weight: float = 1.0,
        clients: Sequence[int] = (),
    ) -> dict[str, float]:
        return {
            **self.averaging.apply_mean(rnd, mean, weight=weight, clients=clients),
            **self._metrics(),
        }


class FedPTClient:
    """Client side: rebuild the frozen tensors from ``z``, train ``y`` locally, upload ``Δ``.

    The downlink is validated before anything is touched: its seed must be an int and its
    arrays exactly the trainable tensors and float buffers, with their shapes.
    """

    def __init__(
        self,
        model_fn: Callable[[], torch.nn.Module],
        frozen: list[str],
        cfg: FedPTConfig,
        *,
        draws: Draws = "torch",
    ) -> None:
        self.draws = check_draws(draws)
        self.local = LocalTraining.from_config(lambda: freeze_(model_fn(), frozen), cfg)
        state = self.local.model.state_dict()
        params, buffers = split_trainable(self.local.model)
        self.expected = {k: state[k].shape for k in params + buffers}

    def run(self, message: Message, ctx: ClientContext) -> Message:
        who = f"round {ctx.rnd}, client {ctx.cid}: downlink"
        z = _seed_of(message, who)
        check_reply_arrays(message, self.expected, who=who)
        model = reconstruct_(self.local.model, message.arrays, z, draws=self.draws)
        model.train()
        ctx.meter.resident = model
        self.local.masks = None
        return self.local.train(model, ctx)


@declare_method(
    "fedpt",
    "FedPT: FedAvg on a partially trainable network; frozen tensors rebuilt from a seed, only the trainable part travels",
    config=FedPTConfig,
    # its own method.freeze (the frozen tensors are rebuilt from a seed, never sent) is its core,
    # not the composer's freezing
    capabilities=Capabilities(
        sums_replies=True, global_model=True, client_optimizer=True, dense_upload=True
    ),
    summary_keys=("trainable_fraction",),
    upload=lambda cfg: "delta",
)
def build(cfg: FedPTConfig, env: MethodEnv) -> MethodBuild:
    """Build FedPT: resolve ``freeze`` on the model, check that the initial model is exactly
    the one seed ``z`` rebuilds, and compose the server and client."""
    if not env.seeded_start:
        raise ConfigError(
            "fedpt with warm_start: every client rebuilds the frozen tensors from the init seed "
            "(they never travel), but warm_start pretrains the initial model, so its frozen "
            "tensors are no longer the seed's; remove warm_start, or train the same partially "
            "trainable network with method.name=fedavg and method.freeze (the model then travels)"
        )
    model = env.model_fn()
    frozen = resolve_freeze(model, cfg.freeze)
    z = derive_seed(
        env.seed, "model-init"
    )  # the seed fedge.experiment.build initialises the model from
    rebuilt = reconstruct_(copy.deepcopy(model), {}, z, draws=env.draws)
    if any(
        not torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), rebuilt.state_dict().values(), strict=True)
    ):
        raise ConfigError(
            "fedpt: the initial model is not the one its init seed rebuilds, so clients could not "
            "regenerate the frozen tensors; build the model with build_model(..., seed=derive_seed(seed, 'model-init'))"
        )
    inner = DeltaAveraging(
        freeze_(model, frozen),
        cfg.server_optimizer.build(),
        replies_are_gradients=False,
        weighting=cfg.weighting,
    )
    server = FedPTServer(inner, seed=z)
    client = FedPTClient(env.model_fn, frozen, cfg, draws=env.draws)
    return MethodBuild(server, client)


def describe(model: torch.nn.Module, frozen: list[str]) -> dict[str, Any]:
    """Counts for reports: frozen tensor names, trainable and total parameters."""
    named = dict(model.named_parameters())
    total = sum(p.numel() for p in named.values())
    n_frozen = sum(named[k].numel() for k in frozen)
    return {
        "frozen": frozen,
        "trainable_params": total - n_frozen,
        "total_params": total,
        "trainable_fraction": (total - n_frozen) / total if total else 1.0,
    }
