"""What a method says about itself in the registry: its :class:`MethodSpec`, with the
:class:`Capabilities` the composer reads and what an observer of its uploads sees."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fedge.methods.base import MethodBuild, MethodConfigBase, MethodEnv

__all__ = ["Capabilities", "MethodSpec", "SeedScalars", "Upload"]


@dataclass(frozen=True)
class Capabilities:
    """What a built method can do: the composer (:mod:`fedge.methods.compose`) applies a
    cross-cutting mechanism only where its capability holds, and refuses the rest by name of
    the key, with the reason written here.

    - ``sums_replies``: the server's aggregate is the weighted mean of the clients' reply arrays
      (its strategy is a :class:`~fedge.methods.secure.Summable`): secure aggregation
      (``method.secure_aggregation``) and DP-FedAvg/DP-FTRL (``privacy.*``) apply.
    - ``global_model``: the strategy trains one global model
      (:class:`~fedge.methods.base.GlobalModel`): an EMA of it can be evaluated (``method.ema``).
    - ``freezable``: the method trains only the parameters of its model that require gradients,
      so parameters frozen at their seeded values (``method.freeze``) stay so.
    - ``client_optimizer``: clients run a local optimizer (``method.client_optimizer``).
    - ``dense_upload``: its clients upload a dense float vector (a model delta or gradient) that
      a lossy codec may approximate (``method.compress``, :mod:`fedge.methods.compress`); its
      strategy's ``summands()`` say what a reply carries. A configuration whose uplink is
      scalars (``upload`` is ``loss_differences``: BAFFLE's batch mode) is refused.
    - ``coordinate_mask``: its clients perturb and update only the coordinates of
      ``MethodEnv.train_masks`` (``method.train_mask``, :mod:`fedge.methods.sparse`).
    - ``accelerators``: every tensor the method makes follows the run's ``device`` (its models
      come from ``env.model_fn``, its batches from ``ctx.data``, its estimator's draws from
      ``env.device``), checked on a GPU by the ``needs_cuda`` tests: ``device: cuda`` applies.
    """

    sums_replies: bool = False
    global_model: bool = False
    freezable: bool = False
    client_optimizer: bool = False
    dense_upload: bool = False
    coordinate_mask: bool = False
    accelerators: bool = False

    def reason(self, capability: str) -> str:
        """Why a mechanism needing ``capability`` does not apply (for the composer's errors)."""
        return _REASONS[capability]


_REASONS = {
    "sums_replies": "its server does not aggregate a weighted sum of the clients' reply arrays",
    "global_model": "its server trains no single global model whose average could be evaluated",
    "freezable": "it does not train a model whose parameters can be left frozen",
    "client_optimizer": "its clients run no local optimizer",
    "dense_upload": "its clients upload no dense vector for a codec to approximate (a few scalars, "
    "or weights that are masked or sealed by the method itself)",
    "coordinate_mask": "its clients do not restrict their updates to a coordinate mask "
    "(fedavg and baffle do)",
    "accelerators": "its tensors are not yet placed on the run's device everywhere (it runs on "
    "the CPU only; fedavg, fedsgd and baffle run on a GPU)",
}


#: what an observer of a method's uploads sees (:attr:`MethodSpec.upload`), read by
#: :mod:`fedge.attacks`: a gradient in the clear; a model delta after local backprop steps
#: (``-Δ/η`` is the gradient after one SGD step); a delta of zeroth-order local steps; K loss
#: differences with the seed broadcast; an enclave-sealed ciphertext (read as if it were the
#: gradient); activations released to an edge server (the edge server is the observer); scalars
#: along public seeded directions, several local steps' worth, that rebuild the client's update
#: (:class:`SeedScalars`: FedKSeed, DeComFL, FeedSign).
Upload = Literal[
    "gradient",
    "delta",
    "estimate_delta",
    "loss_differences",
    "ciphertext",
    "edge_activations",
    "seed_scalars",
]


@dataclass(frozen=True)
class SeedScalars:
    """What an observer of a ``seed_scalars`` upload reads out of it with the public seeds
    (:attr:`MethodSpec.seed_scalars`): the direction sum D = (1/``per``) Σ_k t_k z_k, z_k
    direction k of ``seed``, Gaussian (:func:`fedge.estimators.directions.make_directions`
    drawn with ``draws`` over the trainable parameters, in model order). The client's model
    change is −``lr`` · D: exactly for FedKSeed and FeedSign (constant η), for DeComFL when
    its optimizer is plain SGD without momentum or clip (else D is the sum of its steps'
    estimates, the optimizer's input)."""

    seed: int
    t: Any  # torch.Tensor (K,): the client's scalars as uploaded
    per: int
    lr: float
    draws: Literal["torch", "portable"]


def _no_advice(cfg: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class MethodSpec:
    """Registry entry: what a method is and what it can do.

    Args:
        name, description: ``method.name`` and its line in ``fedge methods``.
        config: the method's own config model (``method.*`` keys, without the mechanisms'
            options, which the composer attaches from ``capabilities``).
        build: ``build(cfg, env) -> MethodBuild``, the method's BARE strategy and client program.
        capabilities: what it can do (:class:`Capabilities`).
        defaults: the method's own defaults for mechanism options (BAFFLE: ``ema: 0.995``).
        summary_keys: metrics of its last round that the run's summary carries.
        advice: ``advice(cfg) -> [text]``: what else to lower when a run diverges, beyond the
            learning rates (BAFFLE: its inf-norm clip).
        upload: ``upload(cfg) ->`` :data:`Upload` or None: what an observer of its uploads sees
            (None: nothing an attack of :mod:`fedge.attacks` reads).
        seed_scalars: for a ``seed_scalars`` upload, ``seed_scalars(cfg, config, arrays,
            draws) ->`` :class:`SeedScalars`: the reply's ``arrays`` read with the public
            ``config`` of the message that asked for it and the run's ``draws``.
        section: filled in on registration (below).
    """

    name: str
    description: str
    config: type[MethodConfigBase]
    build: Callable[[Any, MethodEnv], MethodBuild]
    capabilities: Capabilities = Capabilities()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    summary_keys: tuple[str, ...] = ()
    advice: Callable[[Any], list[str]] = _no_advice
    upload: Callable[[Any], Upload | None] = lambda cfg: None
    seed_scalars: Callable[[Any, Mapping[str, Any], Mapping[str, Any], str], SeedScalars] | None = (
        None
    )
    #: the model of the ``method.*`` section: :attr:`config` plus the options of the mechanisms
    #: the capabilities support (:func:`fedge.methods.compose.section_model`); the registry
    #: fills it in
    section: type[MethodConfigBase] | None = None
