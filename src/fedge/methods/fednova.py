"""FedNova: normalized averaging for clients that run different amounts of local work (Wang et
al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization",
NeurIPS 2020, arXiv:2007.07481v1, Section 4 and Appendix).

In round t client i starts from the global model x, runs τ_i local SGD steps and ends at y_i,
Δ_i = y_i − x. Averaging Δ_i as FedAvg does weights a client by how many steps it ran, so with
unequal τ_i the global model converges to the stationary point of a mismatched objective. FedNova
has each client send its normalized update d_i = Δ_i / a_i, where a_i = ‖a_i‖₁ of the paper's
aggregation vector — the sum of the weights its local steps give their gradients:

    a_i = τ_i                                            plain SGD
    a_i = [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)] / (1 − ρ)           SGD with momentum ρ (Appendix, "momentum SGD")

and the server updates the model with the effective number of steps τ_eff = Σ_i p_i a_i:

    x ← x + η_g · τ_eff · Σ_i p_i d_i                                        (Eq. 6/7)

p_i = n_i / n (``weighting: samples``) or 1/m (``uniform``); η_g is the server optimizer's rate
(``server_optimizer: {name: sgd, lr: 1.0}``, the default, is the paper's update; another server
optimizer takes ``−τ_eff Σ p_i d_i`` as its pseudo-gradient). With equal a_i the update is FedAvg's
up to float rounding (d_i = Δ_i / a, then times τ_eff = a: two rounded operations FedAvg skips).

The local work: ``local_epochs`` epochs of ``batch_size`` mini-batches capped at ``max_steps``, as
FedAvg; clients with more samples already run more steps. ``local_epochs_range: [lo, hi]`` draws
each client's epochs per round uniformly from {lo, …, hi} (a pure function of (run seed,
"fednova-epochs", round, client): BLAKE2b, the same on every machine and in every process), the
heterogeneity of the paper's experiments. The client counts the steps it ran (τ_i) and reports
``tau`` and ``a`` in its reply's config. Float buffers (BatchNorm statistics) are not gradient
sums: they travel as plain deltas and are averaged as FedAvg does.

Capabilities: freezing, EMA evaluation and uplink compression (of d_i) compose, as does the
client optimizer (SGD with or without momentum; Adam has no a_i and a momentum buffer carried
across rounds breaks the formula, so both are refused). Secure aggregation and DP do not: the update is the product of two weighted
sums (Σ p_i d_i and Σ p_i a_i), not one weighted mean of the reply arrays. Sending a_i as an array
would let secure aggregation sum both, but DP would then clip and noise a_i together with d_i (a_i
≈ tens of steps dominates the norm, and noise on τ_eff scales the whole update), which calibrates
nothing; the method declares ``sums_replies`` off and both are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from fedge.core.context import ClientContext
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.rng import derive_seed
from fedge.methods.base import MethodBuild, MethodEnv, check_reply_arrays, split_trainable
from fedge.methods.fedavg import CAPABILITIES, DeltaAveraging, FedAvgConfig
from fedge.methods.local import Batch, GradientFn, LocalTraining, Masks, backprop_gradient_fn
from fedge.methods.registry import declare_method
from fedge.methods.spec import Capabilities

__all__ = [
    "FedNovaAveraging",
    "FedNovaClient",
    "FedNovaConfig",
    "build",
    "drawn_local_epochs",
    "normalizer",
]


class FedNovaConfig(FedAvgConfig):
    """FedAvg's keys (E, B, step cap, client and server optimizers, weighting) plus the range
    each client's local epochs are drawn from."""

    name: Literal["fednova"] = "fednova"  # type: ignore[assignment]
    local_epochs_range: list[int] | None = Field(
        None,
        description="[lo, hi]: each client's local epochs drawn per round uniformly from lo..hi "
        "(seeded by run seed, round, client); local_epochs is then ignored (null: local_epochs for all)",
    )

    @model_validator(mode="after")
    def _check(self) -> FedNovaConfig:
        r = self.local_epochs_range
        if r is not None:
            if len(r) != 2 or not 1 <= r[0] <= r[1]:
                raise ValueError(
                    f"local_epochs_range={r!r}; expected [lo, hi] with 1 <= lo <= hi, e.g. [1, 5]"
                )
        opt = self.client_optimizer
        if opt.name != "sgd":
            raise ValueError(
                f"client_optimizer.name={opt.name!r}: FedNova normalizes by the gradient weights "
                "of SGD (with momentum); Adam's have no closed form; use client_optimizer.name=sgd"
            )
        if opt.state == "persistent" and opt.momentum > 0:
            raise ValueError(
                "client_optimizer.state='persistent' with momentum="
                f"{opt.momentum}: a_i assumes a zero momentum buffer at the start of each round; "
                "use client_optimizer.state=fresh"
            )
        return self


def drawn_local_epochs(seed: int, rnd: int, cid: int, lo: int, hi: int) -> int:
    """Client ``cid``'s local epochs in round ``rnd``: uniform on {lo, …, hi}, a pure function of
    (seed, "fednova-epochs", rnd, cid) (BLAKE2b via :func:`~fedge.core.rng.derive_seed`; the
    modulo bias of a 63-bit draw is below 2^-50 for any realistic range)."""
    return lo + derive_seed(seed, "fednova-epochs", rnd, cid) % (hi - lo + 1)


def normalizer(tau: int, momentum: float = 0.0) -> float:
    """a_i = ‖a_i‖₁: the summed weight τ local steps give their gradients. τ for plain SGD;
    [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ) for SGD with momentum ρ started from a zero buffer
    (step k's gradient enters every later step with weight Σ_j ρ^j, j < τ − k)."""
    if tau < 1:
        raise ValueError(f"tau={tau}; a client that sends an update ran at least one step")
    rho = momentum
    if rho == 0:
        return float(tau)
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


class FedNovaClient(LocalTraining):
    """Client side: FedAvg's local training with this round's local epochs (drawn when
    ``epochs_range`` is given), its steps counted; the trainable parameters' delta divided by
    a_i, float-buffer deltas as they are; ``tau`` and ``a`` in the reply's config."""

    def __init__(
        self,
        model_fn: Callable[[], torch.nn.Module],
        cfg: FedNovaConfig,
        *,
        seed: int,
        gradient_fn: GradientFn = backprop_gradient_fn,
    ) -> None:
        super().__init__(
            model_fn,
            local_epochs=cfg.local_epochs,
            batch_size=cfg.batch_size,
            max_steps=cfg.max_steps,
            optimizer=cfg.client_optimizer,
            gradient_fn=self._counted,
        )
        self.base_gradient_fn, self.seed, self.cfg = gradient_fn, seed, cfg
        self.steps = 0

    def _counted(
        self, model: torch.nn.Module, batch: Batch, ctx: ClientContext, masks: Masks = None
    ) -> tuple[float | None, dict[str, torch.Tensor]]:
        self.steps += 1  # LocalTraining asks for one gradient per step
        return self.base_gradient_fn(model, batch, ctx, masks)

    def run(self, message: Message, ctx: ClientContext) -> Message:
        r = self.cfg.local_epochs_range
        self.local_epochs = (
            drawn_local_epochs(self.seed, ctx.rnd, ctx.cid, r[0], r[1])
            if r
            else self.cfg.local_epochs
        )
        self.steps = 0
        reply = super().run(message, ctx)
        a = normalizer(self.steps, self.optimizer.momentum)
        params, _ = split_trainable(self.model)
        arrays = {k: (v / a if k in params else v) for k, v in reply.arrays.items()}
        config = {**reply.config, "tau": self.steps, "a": a}
        return Message(arrays, config=config, metrics=reply.metrics)


class FedNovaAveraging(DeltaAveraging):
    """Server side: x ← x + η_g · τ_eff · Σ p_i d_i with τ_eff = Σ p_i a_i (Eq. 6/7), the step
    taken by the server optimizer on the pseudo-gradient −τ_eff Σ p_i d_i; float buffers move by
    their mean delta. Logs ``tau_eff`` and the mean of the clients' ``tau``."""

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        weights: dict[int, float] = {}
        norms: dict[int, float] = {}
        taus: list[int] = []
        for cid, reply in replies.items():
            who = f"round {rnd}, client {cid}"
            self._dense(reply.arrays)
            check_reply_arrays(reply, self.expected, who=who)
            n, a, tau = (reply.config.get(k) for k in ("num_samples", "a", "tau"))
            if not isinstance(n, int) or n < 1:
                raise MessageError(f"{who}: num_samples={n!r}; expected an int >= 1")
            if not isinstance(a, (int, float)) or not a > 0:
                raise MessageError(
                    f"{who}: a={a!r}; expected the client's normalizer a_i > 0 (FedNovaClient)"
                )
            if not isinstance(tau, int) or tau < 1:
                raise MessageError(f"{who}: tau={tau!r}; expected the local steps run, an int >= 1")
            weights[cid] = float(n) if self.weighting == "samples" else 1.0
            norms[cid] = float(a)
            taus.append(tau)
        total = sum(weights.values())
        mean: dict[str, torch.Tensor] = {}
        tau_eff = 0.0
        for cid, reply in replies.items():  # in client-id order (deterministic)
            p = weights[cid] / total
            tau_eff += p * norms[cid]
            for k, v in reply.arrays.items():
                mean[k] = mean[k].add_(v, alpha=p) if k in mean else v * p
        for k in self.server.param_names:
            mean[k] = mean[k] * tau_eff
        metrics = self.apply_mean(rnd, mean, weight=total, clients=sorted(replies))
        metrics = {**metrics, "tau_eff": tau_eff, "tau_mean": sum(taus) / len(taus)}
        losses = [
            (weights[c] / total) * float(r.metrics["train_loss"])
            for c, r in replies.items()
            if "train_loss" in r.metrics
        ]
        return {**metrics, "train_loss": sum(losses)} if losses else metrics


#: FedAvg's, less sums_replies: the update is a product of two weighted sums (module docstring)
FEDNOVA_CAPABILITIES = Capabilities(
    sums_replies=False,
    global_model=CAPABILITIES.global_model,
    freezable=CAPABILITIES.freezable,
    client_optimizer=CAPABILITIES.client_optimizer,
    dense_upload=CAPABILITIES.dense_upload,  # d_i = Δ_i / a_i: a dense vector (a_i in the config)
)


@declare_method(
    "fednova",
    "FedNova: clients send Δ_i/a_i (a_i = their local steps' gradient weight), server steps τ_eff·Σp_i·d_i",
    config=FedNovaConfig,
    capabilities=FEDNOVA_CAPABILITIES,
    upload=lambda cfg: "delta",
)
def build(cfg: FedNovaConfig, env: MethodEnv) -> MethodBuild:
    """Build FedNova: the normalized-averaging server and the step-counting local training."""
    strategy = FedNovaAveraging(
        env.model_fn(),
        cfg.server_optimizer.build(),
        replies_are_gradients=False,
        weighting=cfg.weighting,
    )
    program: Any = FedNovaClient(env.model_fn, cfg, seed=env.seed)
    return MethodBuild(strategy, program)
