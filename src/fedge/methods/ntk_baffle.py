"""NTK foresight pruning + BAFFLE (seed 004, "When foresight pruning meets zeroth-order
optimization": Section 4, Eq. 13-15, Algorithm 1).

Before training, the server prunes the initial model W0 to ``density`` (the kept fraction of
prunable weights: conv and linear weights) over ``prune_rounds`` rounds of the exponential
schedule d^(t/T_p) with one global threshold (:mod:`fedge.pruning`). Then BAFFLE trains the
sparse model: every estimate perturbs only kept coordinates (n shrinks to d·n, so the
zeroth-order error O(sqrt(n/K)) shrinks with it), the server keeps pruned weights exactly
zero, and the model travels as its kept values plus the mask (bitmap or index list,
whichever is smaller). The uplink is unchanged: K scalars in batch mode.

Pruning data (``prune_data``):

- ``random`` (NTK-Rand, the paper's default and best): the NTK statistic is evaluated on
  inputs drawn from a standard Gaussian on the server. No data, no communication, no
  device compute; it happens when the method is built.
- ``client`` (NTK-Ori): the statistic is evaluated on the devices' own data, forward-only.
  Each pruning round is one phase of the federation's first round: the server sends the
  current sparse model and a seed; each sampled client evaluates K differences
  I(m + δ_k) − I(m − δ_k) of the NTK statistic on ``prune_inputs`` of its samples under
  seed-shared mask perturbations and uploads those K scalars (4K bytes); the server
  combines them with weights N_c/N, estimates ∂I/∂m by Stein's identity, and prunes. Its
  bytes and FLOPs are logged with round 1. (Algorithm 1 has devices send one scalar, from
  which no derivative can be formed; this is the forward-only protocol closest to it.)
  Round 1's sampled clients answer every pruning round (a stated difference: Algorithm 1,
  lines 2-3, samples G_p participants anew in each pruning round; here the pruning rounds are
  exchanges of one federation round, which can address only the clients that round sampled,
  and G_p = G_t = clients per round). These K scalars per client travel in the clear, as
  Algorithm 1's F_i do, also when ``secure_aggregation`` covers the training rounds (the build
  warns); under DP the build refuses NTK-Ori.

Rescaling (``rescale: true``, the default; a deliberate addition to Algorithm 1): after
pruning, each pruned tensor's kept weights are scaled by 1/sqrt(its density), which restores
the layer's initial output variance. Without it, a LeNet-5 pruned to 10% at initialisation
has near-constant logits, and zeroth-order training sits on a long plateau (measured here:
test loss flat for 100+ batch-level rounds while dense BAFFLE learns), although backprop
trains the same pruned network fine. The paper trains for 3000 rounds, where the plateau
matters less. What it contributes to Table 3's NTK rows is measured by a row without it
(`benchmarks/ntk_table3.py --new-rows no-rescale`): under the SGD recipe at K = 100, without it
NTK-BAFFLE stays at chance on all 3 seeds (0.100 after 300 rounds), 59.5 points below the
rescaled row, so the NTK rows' lead over dense BAFFLE under SGD rests on this addition.

What pruning buys (docs/benchmarks.md, "NTK-BAFFLE Table 3 analogue"): at 10% density one
estimate's cosine with the true gradient rises about sqrt(1/d)-fold (n shrinks), and with the
paper's optimizer, SGD with momentum, NTK-BAFFLE ends above dense BAFFLE (0.706 ± 0.021 against
0.436 ± 0.301 at K = 100), but dense BAFFLE's screened lr fails on one seed of three (0.10),
and the widened dense screen (`benchmarks/ntk_table3.py --new-rows dense-sgd`) finds no lr that
trains it on every seed (the one lr above chance on seed 0, 0.026, diverges on all three), so
the lead is in part against runs that never leave chance and its size is not resolved. With
Adam (BAFFLE's
optimizer) it does not in 300 rounds: Adam normalises each coordinate, and a coordinate's noise
is set by the norm of the gradient over the trained coordinates, which pruning shrinks far less
than it shrinks n.

``prune_score`` picks the saliency: ``ntk`` (the paper), ``magnitude`` (|W0|) or ``random``,
the last two as the baselines that measure what the NTK score is worth at equal density.

Client FLOPs are executed dense (the kernels do not skip zeros); every round also logs
``effective_flops_ratio``, the share of forward FLOPs that multiply kept weights (per-layer
densities weighted by torch's per-module FLOP counts), and the engine derives
``client_flops_effective`` from it.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator, Mapping
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError, MessageError, PrivacyWarning
from fedge.core.messages import Message
from fedge.core.meter import effective_flops_ratio
from fedge.core.protocols import Exchange, Round, Savepoint, Strategy, StrategyWrapper
from fedge.core.rng import Draws, derive_seed, make_generator
from fedge.estimators import ZerothOrderSpec, combine_loss_differences
from fedge.methods.baffle import CAPABILITIES, DEFAULTS, BaffleConfig, advice
from fedge.methods.baffle import build as build_baffle
from fedge.methods.base import (
    Layer,
    MethodBuild,
    MethodEnv,
    model_message_arrays,
    unpack_model_arrays,
)
from fedge.methods.registry import declare_method
from fedge.pruning import (
    DEFAULT_EPS,
    ScoreContext,
    apply_masks_,
    dense_masks,
    gaussian_inputs,
    keep_counts,
    ntk_saliency_from_differences,
    ntk_saliency_zeroth_order,
    ntk_statistic_differences,
    prune,
    prune_step,
    rescale_,
)
from fedge.pruning import (
    density as mask_density,
)

__all__ = [
    "ClientDataPruning",
    "NtkBaffleConfig",
    "PruningClient",
    "ReportEffectiveFlops",
    "build",
    "data_free_masks",
]


class NtkBaffleConfig(BaffleConfig):
    name: Literal["ntk-baffle"] = "ntk-baffle"  # type: ignore[assignment]
    density: float = Field(0.1, gt=0, le=1, description="kept fraction of prunable weights")
    prune_rounds: int = Field(
        10,
        ge=1,
        description="T_p (the paper: 50 for LeNet, 20 for ResNet-20; the LeNet preset uses 50; 10: a quicker build)",
    )
    prune_data: Literal["random", "client"] = Field(
        "random", description="NTK-Rand (Gaussian inputs) or NTK-Ori"
    )
    prune_score: Literal["ntk", "magnitude", "random"] = "ntk"
    prune_inputs: int = Field(
        256, ge=1, description="inputs per pruning round (per client with prune_data=client)"
    )
    prune_eps: float = Field(
        DEFAULT_EPS, gt=0, description="variance of the weight perturbation in Eq. 15"
    )
    prune_samples: int = Field(1, ge=1, description="weight-perturbation draws per input batch")
    prune_k: int = Field(
        100, ge=1, description="prune_data=client: K scalars per client per pruning round"
    )
    prune_sigma: float = Field(
        1e-2, gt=0, description="prune_data=client: sigma of the mask perturbation"
    )
    rescale: bool = Field(
        True,
        description="scale kept weights by 1/sqrt(layer density) after pruning (variance-preserving)",
    )
    prune_route: Literal["autograd", "zeroth_order"] = Field(
        "autograd",
        description="prune_data=random: score by autograd on the server (NTK-Rand as the paper) or by the "
        "zeroth-order route NTK-Ori must take (K=prune_k differences, sigma=prune_sigma), for a like-for-like "
        "comparison of the two; prune_data=client always takes the zeroth-order route",
    )

    @model_validator(mode="after")
    def _pruning_rules(self) -> NtkBaffleConfig:
        if self.prune_route == "zeroth_order" and self.prune_score != "ntk":
            raise ValueError(
                f"prune_route=zeroth_order estimates the NTK score; prune_score={self.prune_score!r} needs no "
                "estimate — leave prune_route at autograd"
            )
        if self.prune_data == "client" and self.prune_score != "ntk":
            raise ValueError(
                f"prune_data=client evaluates the NTK statistic on devices; prune_score={self.prune_score!r} "
                "needs no data — use prune_data=random with it"
            )
        return self

    def prune_spec(self, *, draws: Draws = "torch") -> ZerothOrderSpec:
        """The zeroth-order estimate of ∂I/∂m (NTK-Ori, and NTK-Rand's ``zeroth_order`` route):
        K = ``prune_k`` central differences of the NTK statistic at σ = ``prune_sigma``, the mask
        perturbations drawn by ``draws`` (the run's, from the build environment)."""
        return ZerothOrderSpec(
            k=self.prune_k, sigma=self.prune_sigma, scheme="central", draws=draws
        )


class PruningClient:
    """Device side of NTK-Ori: K differences of the NTK statistic on local data, forwards
    only; any other message goes to the BAFFLE client program."""

    def __init__(
        self, inner: Any, model_fn: Any, cfg: NtkBaffleConfig, *, draws: Draws = "torch"
    ) -> None:
        self.inner, self.cfg, self.spec = inner, cfg, cfg.prune_spec(draws=draws)
        self.model = model_fn()

    def run(self, message: Message, ctx: ClientContext) -> Message:
        if "prune_seed" not in message.config:
            return self.inner.run(message, ctx)
        cfg = self.cfg
        who = f"round {ctx.rnd}, client {ctx.cid}"
        arrays, masks = unpack_model_arrays(message.arrays, self.model.state_dict(), who=who)
        self.model.load_state_dict(arrays)
        ctx.meter.resident = self.model
        seed = message.config["prune_seed"]
        if not isinstance(seed, int):
            raise MessageError(f"{who}: prune_seed must be an int, got {seed!r}")
        n = ctx.data.num_samples
        idx = ctx.data.indices[
            torch.randperm(n, generator=ctx.generator)[: min(cfg.prune_inputs, n)]
        ]
        diffs = ntk_statistic_differences(
            self.model,
            masks,
            ctx.data.x[idx],
            self.spec,
            eps=cfg.prune_eps,
            samples=cfg.prune_samples,
            generator=ctx.generator,
            seed=seed,
        )
        return Message({"dI": diffs}, config={"num_samples": n})


class ClientDataPruning(StrategyWrapper):
    """Server side of NTK-Ori: the T_p pruning rounds run as the first exchanges of round 1,
    then the wrapped BAFFLE strategy trains the pruned model for the rest of the run."""

    def __init__(
        self, inner: Strategy, cfg: NtkBaffleConfig, *, seed: int, draws: Draws = "torch"
    ) -> None:
        super().__init__(inner)
        self.cfg, self.seed, self.spec = cfg, seed, cfg.prune_spec(draws=draws)
        self.server = inner.global_model
        self.masks = dense_masks(self.model)
        self.counts = keep_counts(
            sum(m.numel() for m in self.masks.values()), cfg.density, cfg.prune_rounds
        )
        self.step = 0
        self.done = False
        self.pruning_ids: list[int] | None = None  # the clients still in round 1's pruning

    def _prune_message(self) -> Message:
        seed = derive_seed(self.seed, "ntk-ori", self.step, bits=62)
        return Message(model_message_arrays(self.model, self.masks), config={"prune_seed": seed})

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        if not self.done:
            client_ids = yield from self.prune(rnd, client_ids)
        return (yield from self.inner.round(rnd, client_ids))

    def prune(
        self, rnd: int, client_ids: list[int]
    ) -> Generator[Exchange | Savepoint, Any, list[int]]:
        """The remaining pruning rounds, one exchange each, a :class:`Savepoint` after each (the
        run checkpoints there: an interrupt keeps the pruning rounds done, and a resumed run
        goes on from the next); then the pruned model is the global one. Returns the clients
        still in the round (those that replied to every exchange)."""
        if self.pruning_ids is not None:  # going on from a savepoint
            client_ids = list(self.pruning_ids)
        while self.step < self.cfg.prune_rounds:
            replies = yield Exchange(dict.fromkeys(client_ids, self._prune_message()))
            client_ids = sorted(
                replies
            )  # a client that failed (clients.min_replies) is out for the round
            diffs, weights = [], []
            for cid, reply in replies.items():
                d, n = reply.arrays.get("dI"), reply.config.get("num_samples")
                if d is None or d.shape != (self.cfg.prune_k,) or not isinstance(n, int) or n < 1:
                    raise MessageError(
                        f"round {rnd}, client {cid}: expected dI of shape ({self.cfg.prune_k},) and num_samples"
                    )
                diffs.append(d)
                weights.append(n)
            seed = derive_seed(self.seed, "ntk-ori", self.step, bits=62)
            combined = combine_loss_differences(diffs, weights)
            scores = ntk_saliency_from_differences(
                self.model, self.masks, combined, self.spec, seed=seed
            )
            self.masks = prune_step(scores, self.masks, self.counts[self.step])
            self.step += 1
            self.pruning_ids = client_ids
            yield Savepoint("pruning", self.step, self.cfg.prune_rounds)
        self.done = True
        self.pruning_ids = None
        self.server.set_masks(self.masks)
        if self.cfg.rescale:
            rescale_(self.model, self.masks)
        return client_ids

    def state_dict(self) -> dict[str, Any]:
        return {
            "inner": self.inner.state_dict(),
            "masks": self.masks,
            "step": self.step,
            "done": self.done,
            **({} if self.pruning_ids is None else {"pruning_ids": list(self.pruning_ids)}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.masks, self.step, self.done = state["masks"], state["step"], state["done"]
        ids = state.get("pruning_ids")
        self.pruning_ids = None if ids is None else list(ids)
        if self.done:
            self.server.set_masks(self.masks)


class ReportEffectiveFlops(StrategyWrapper):
    """Logs the sparse model's ``effective_flops_ratio`` and ``density`` every round, and from
    the engine's measured ``client_flops`` the non-zero FLOPs ``client_flops_effective`` (and
    their running total)."""

    def __init__(self, inner: Strategy, sample: torch.Tensor) -> None:
        super().__init__(inner)
        self.sample = sample
        self.ratio = 1.0
        self.cum = 0

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        out = yield from self.inner.round(rnd, client_ids)
        gm = self.global_model
        self.ratio = effective_flops_ratio(gm.model, gm.masks or {}, self.sample)
        return {
            **out,
            "effective_flops_ratio": self.ratio,
            "density": mask_density(gm.masks, gm.model),
        }

    def round_metrics(self, line: Mapping[str, Any]) -> dict[str, Any]:
        if "client_flops" not in line:  # measure.flops=false: nothing counted to scale
            return self.inner.round_metrics(line)
        eff = round(int(line["client_flops"]) * self.ratio)
        self.cum += eff
        return {
            **self.inner.round_metrics(line),
            "client_flops_effective": eff,
            "cum_client_flops_effective": self.cum,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "cum_client_flops_effective": self.cum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.cum = int(state["cum_client_flops_effective"])


def data_free_masks(
    cfg: NtkBaffleConfig,
    w0: torch.nn.Module,
    *,
    seed: int,
    input_shape: tuple[int, ...],
    draws: Draws = "torch",
) -> dict[str, torch.Tensor]:
    """The server's pruning of ``w0`` for ``prune_data: random`` (what :func:`build` runs, with the
    run's ``seed``): ``prune_rounds`` rounds of ``prune_score`` to ``density``.

    ``prune_route: zeroth_order`` scores each round as NTK-Ori does (K = ``prune_k`` seeded mask
    perturbations of the statistic on the round's ``prune_inputs`` Gaussian inputs, Stein's
    estimate of ∂I/∂m; the perturbation seed of pruning round t is NTK-Ori's), so that NTK-Rand
    and NTK-Ori differ in their inputs only.

    ``draws``: the generator of pruning's inputs, ΔW, random scores and mask perturbations
    (``make_generator(draws, seed, "prune")``; :data:`fedge.core.rng.Draws`)."""
    score: Any = cfg.prune_score
    if cfg.prune_route == "zeroth_order":
        step = iter(range(cfg.prune_rounds))
        spec = cfg.prune_spec(draws=draws)

        def score(
            model: torch.nn.Module, masks: dict[str, torch.Tensor], ctx: ScoreContext
        ) -> dict[str, torch.Tensor]:
            x = gaussian_inputs(input_shape, cfg.prune_inputs, generator=ctx.generator)
            return ntk_saliency_zeroth_order(
                model,
                masks,
                x,
                spec,
                eps=ctx.eps,
                samples=ctx.samples,
                generator=ctx.generator,
                seed=derive_seed(seed, "ntk-ori", next(step), bits=62),
            )

    return prune(
        w0,
        density=cfg.density,
        rounds=cfg.prune_rounds,
        score=score,
        generator=make_generator(draws, seed, "prune"),
        input_shape=input_shape,
        num_inputs=cfg.prune_inputs,
        eps=cfg.prune_eps,
        samples=cfg.prune_samples,
    )


@declare_method(
    "ntk-baffle",
    "NTK foresight pruning (data-free or on client data), then BAFFLE on the sparse model",
    config=NtkBaffleConfig,
    capabilities=CAPABILITIES,
    defaults=DEFAULTS,
    advice=advice,
    # the reconstruction harness reads batch mode's K loss differences (not a sparse epoch delta)
    upload=lambda cfg: "loss_differences" if cfg.mode == "batch" else None,
    summary_keys=("forward_mode_ad",),
)
def build(cfg: NtkBaffleConfig, env: MethodEnv) -> MethodBuild:
    """Prune (data-free, on the server) or arrange client-data pruning, then build BAFFLE."""
    sample = torch.zeros((1, *env.input_shape))
    if cfg.prune_data == "random":
        masks = data_free_masks(
            cfg,
            env.model_fn(),
            seed=env.seed,
            input_shape=tuple(env.input_shape),
            draws=env.draws,
        )
        base_fn = env.model_fn

        def pruned_model() -> torch.nn.Module:
            model = apply_masks_(base_fn(), masks)
            return rescale_(model, masks) if cfg.rescale else model

        pruned_env = MethodEnv(**{**env.__dict__, "model_fn": pruned_model})
        built = build_baffle(cfg, pruned_env, masks=masks)
        built.layers.append(Layer("outermost", lambda s: ReportEffectiveFlops(s, sample)))
        return built
    # NTK-Ori: pruning exchanges run under the EMA (the average starts from the pruned model)
    if env.privacy is not None and env.privacy.enabled:
        # The pruning exchanges upload K statistic differences of each client's data in the clear,
        # outside the clipping and noise (and the ε) of the training rounds, and the mask they pick
        # is released with every model: the run's ε would not cover them.
        raise ConfigError(
            f"privacy.mechanism={env.privacy.mechanism} with method.prune_data=client: NTK-Ori's pruning rounds "
            "upload statistics of each client's data outside DP (no clipping, no noise, not in ε), and the mask "
            "they choose is released with the model; use method.prune_data=random (data-free pruning, which "
            "sees no client data) with DP, or set privacy.mechanism=none"
        )
    if cfg.secure_aggregation:
        warnings.warn(
            "method.secure_aggregation=true with method.prune_data=client: NTK-Ori's pruning rounds upload each "
            "client's K differences of the NTK statistic on its own inputs in the clear (secure aggregation covers "
            "the training rounds only); use method.prune_data=random (data-free pruning, which sees no client data) "
            "to keep every upload under secure aggregation",
            PrivacyWarning,
            stacklevel=2,
        )
    built = build_baffle(cfg, env)
    built.layers += [
        # the pruning exchanges run over the protected rounds, under the EMA (its average starts
        # from the pruned model)
        Layer(
            "over_protection",
            lambda s: ClientDataPruning(s, cfg, seed=env.seed, draws=env.draws),
        ),
        Layer(
            "outermost",
            lambda s: ReportEffectiveFlops(s, sample),
            lambda p: PruningClient(p, env.model_fn, cfg, draws=env.draws),
        ),
    ]
    return built
