"""Data reconstruction from an observed upload: dummy inputs (and labels) optimized so that what
they would have uploaded matches what was observed, by L-BFGS on the L2 match as DLG does (Zhu,
Liu, Han, NeurIPS 2019, Alg. 1; :func:`invert`) or by Adam on the cosine match plus total
variation of Inverting Gradients (Geiping et al., NeurIPS 2020, Eq. 4; :func:`invert_ig`), with
iDLG's label read off the last bias gradient (Zhao et al. 2020). Targets: a gradient or BAFFLE's
Stein estimate (:class:`GradientTarget`), BAFFLE's K loss differences as K projections of the
gradient on the seed's directions, optionally at an unknown DP clip scale
(:class:`ProjectionTarget`). See docs/privacy/attacks.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fedge.core.rng import Draws
from fedge.estimators.directions import make_directions

__all__ = [
    "BLOCK",
    "GradientTarget",
    "ProjectionTarget",
    "Reconstruction",
    "baffle_projection",
    "direction_sum",
    "idlg_labels",
    "invert",
    "invert_ig",
    "seeded_directions",
    "total_variation",
]

#: iterations per block: one L-BFGS call of DLG (``max_iter``), and the reporting step of both
BLOCK = 20


@dataclass
class GradientTarget:
    """An observed gradient (name -> tensor, a subset of the model's parameters)."""

    grads: dict[str, Tensor]

    def loss(self, g: Mapping[str, Tensor]) -> Tensor:
        return sum(((g[n] - t) ** 2).sum() for n, t in self.grads.items())  # type: ignore[return-value]

    def cosine(self, g: Mapping[str, Tensor]) -> Tensor:
        """1 − cos(∇L(x̂), g) over all parameters (Geiping et al. 2020, Eq. 4)."""
        dot = sum((g[n] * t).sum() for n, t in self.grads.items())
        na = sum((g[n] ** 2).sum() for n in self.grads)
        nb = sum((t**2).sum() for t in self.grads.values())
        return 1 - dot / (na.sqrt() * nb.sqrt() + 1e-12)  # type: ignore[union-attr]

    @property
    def names(self) -> list[str]:
        return list(self.grads)


@dataclass
class ProjectionTarget:
    """K observed projections t of the gradient on directions Z (name -> (K, *shape)).

    With ``fit_scale`` the observed t is taken to be s·(Zᵀ∇L) for an unknown s ≥ 0 (a clipped
    upload) and :meth:`loss` is the residual after the best such s (:meth:`scale`), relative
    to ‖t‖²."""

    directions: dict[str, Tensor]
    t: Tensor
    fit_scale: bool = False

    def project(self, g: Mapping[str, Tensor]) -> Tensor:
        return sum(z.flatten(1) @ g[n].flatten() for n, z in self.directions.items())  # type: ignore[return-value]

    def scale(self, g: Mapping[str, Tensor]) -> Tensor:
        """s* = max(pᵀt, 0) / ‖p‖², the least-squares scale s ≥ 0 of p = Zᵀg onto t."""
        p = self.project(g)
        return (p @ self.t).clamp(min=0) / ((p @ p) + 1e-30)

    def loss(self, g: Mapping[str, Tensor]) -> Tensor:
        p = self.project(g)
        if not self.fit_scale:
            return ((p - self.t) ** 2).sum()
        # (‖t‖² − (pᵀt)²/‖p‖²) / ‖t‖² = min_{s≥0} ‖s·p − t‖² / ‖t‖² while pᵀt ≥ 0, continued as
        # 1 + cos² below (a start with pᵀt < 0 still has a gradient towards agreement). Relative
        # to ‖t‖²: a clipped t is small, and L-BFGS's tolerances are absolute.
        pt, tt = p @ self.t, self.t @ self.t
        return 1 - pt * pt.abs() / (((p @ p) + 1e-30) * tt)

    def cosine(self, g: Mapping[str, Tensor]) -> Tensor:
        """1 − cos between the dummy's K projections and the observed ones."""
        return 1 - F.cosine_similarity(self.project(g), self.t, dim=0, eps=1e-12)

    @property
    def names(self) -> list[str]:
        return list(self.directions)


_NORMALIZER = {"forward": 1.0, "central": 2.0}


def baffle_projection(
    shapes: Mapping[str, torch.Size],
    loss_diffs: Tensor,
    *,
    sigma: float,
    seed: int,
    scheme: str,
    directions: str,
    masks: Mapping[str, Tensor] | None = None,
    draws: Draws = "torch",
) -> ProjectionTarget:
    """What BAFFLE's K loss differences tell a server that knows the seed: t_k = ΔL_k / (cσ)
    ≈ z_kᵀ∇L, with z_k regenerated exactly as the client drew them
    (:func:`fedge.estimators.directions.make_directions`; ``masks``, NTK-BAFFLE's, zero the
    pruned coordinates, z_k ⊙ m, and size the blocks of ``block`` directions as the client's;
    ``draws``: the observed run's ``draws``, the generator the client drew them with)."""
    z = seeded_directions(shapes, loss_diffs.numel(), seed, directions, masks, draws)
    return ProjectionTarget(z, loss_diffs.to(torch.float32) / (_NORMALIZER[scheme] * sigma))


def seeded_directions(
    shapes: Mapping[str, torch.Size],
    k: int,
    seed: int,
    directions: str = "gaussian",
    masks: Mapping[str, Tensor] | None = None,
    draws: Draws = "torch",
) -> dict[str, Tensor]:
    """Directions 0..k−1 of ``seed`` (name -> (k, *shape)), regenerated exactly as a client
    drew them (:func:`fedge.estimators.directions.make_directions`), masked by ``masks``."""
    masks = masks or {}
    dirs = make_directions(
        directions, {n: tuple(s) for n, s in shapes.items()}, k, masks, draws=draws
    )
    z = {n: dirs.draw(seed, range(k), n, tuple(s)).reshape(k, *s) for n, s in shapes.items()}
    return {n: v * masks[n].to(v.dtype) if n in masks else v for n, v in z.items()}


def direction_sum(directions: Mapping[str, Tensor], t: Tensor, per: int = 1) -> dict[str, Tensor]:
    """(1/per) Σ_k t_k z_k per parameter: BAFFLE's Stein estimate (per = K, Eq. 6) and the
    update a seed-and-scalar client's scalars rebuild (:class:`~fedge.methods.spec.SeedScalars`)."""
    t = t.to(torch.float32)
    return {n: torch.einsum("k,k...->...", t, z) / per for n, z in directions.items()}


def idlg_labels(grads: Mapping[str, Tensor], model: torch.nn.Module) -> Tensor | None:
    """iDLG: the label of a single sample from the last Linear layer's bias gradient, or None."""
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not last or last[-1].bias is None:
        return None
    name = next(n for n, p in model.named_parameters() if p is last[-1].bias)
    g = grads.get(name)
    return None if g is None else g.argmin().reshape(1)


@dataclass
class Reconstruction:
    x: Tensor  # (B, *input_shape), in the model's (normalized) input space
    labels: Tensor  # (B,) the attacker's label guesses
    loss: float  # the best matching loss reached
    iterations: int


def total_variation(x: Tensor) -> Tensor:
    """Anisotropic total variation: mean |horizontal| + mean |vertical| neighbour differences."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (
        x[..., :, 1:] - x[..., :, :-1]
    ).abs().mean()


def _dummy_gradient(
    model: torch.nn.Module,
    params: dict[str, Tensor],
    names: Sequence[str],
    x: Tensor,
    labels: Tensor | None,
    y_logits: Tensor,
) -> dict[str, Tensor]:
    """The gradient of the dummy batch's loss (hard ``labels``, else soft labels ``softmax(y_logits)``)
    with respect to the attacked parameters ``names``, kept differentiable in ``x`` and ``y_logits``."""
    p = {n: (v.clone().requires_grad_(True) if n in names else v) for n, v in params.items()}
    out = functional_call(model, p, (x,))
    if labels is not None:
        loss = F.cross_entropy(out, labels)
    else:
        loss = -(F.softmax(y_logits, -1) * F.log_softmax(out, -1)).sum(-1).mean()
    g = torch.autograd.grad(loss, [p[n] for n in names], create_graph=True)
    return dict(zip(names, g, strict=True))


def _dummy_start(
    model: torch.nn.Module,
    target: GradientTarget | ProjectionTarget,
    input_shape: tuple[int, ...],
    num_classes: int,
    batch: int,
    labels: Tensor | None,
    generator: torch.Generator,
) -> tuple[dict[str, Tensor], list[str], Tensor, Tensor, list[Tensor]]:
    """The starting point both attacks optimize from: the model's parameters (detached), the
    attacked names, dummy data ``x ~ N(0, I)`` then dummy label logits (drawn in that order from
    ``generator``), and the variables optimized (``x``, plus the logits unless ``labels`` given)."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    x = torch.randn(batch, *input_shape, generator=generator).requires_grad_(True)
    y_logits = torch.randn(batch, num_classes, generator=generator).requires_grad_(True)
    variables = [x] if labels is not None else [x, y_logits]
    return params, target.names, x, y_logits, variables


def invert_ig(
    model: torch.nn.Module,
    target: GradientTarget | ProjectionTarget,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    batch: int = 1,
    labels: Tensor | None = None,
    iterations: int = 1000,
    tv: float = 1e-2,
    lr: float = 0.1,
    bounds: tuple[Tensor, Tensor] | None = None,
    generator: torch.Generator,
    on_block: Callable[[int], None] | None = None,
) -> Reconstruction:
    """Inverting Gradients (Geiping et al. 2020): cosine matching loss + ``tv`` · total
    variation, Adam on the signed gradient of the dummy data (their Sec. 4), learning rate
    decayed ×0.1 at 3/8, 5/8 and 7/8 of the iterations. Soft labels are optimized jointly
    when ``labels`` is None. Returns the last iterate (the objective includes the prior).

    ``bounds``: (low, high), broadcastable to the dummy batch — the valid pixel range [0, 1]
    in the model's normalized input space. Their Eq. 4 minimizes over x ∈ [0, 1]^n, and their
    code projects the dummy data onto that box after every step (its default ``boxed``); so
    does this, when given. The dummy start (N(0, I)) is not projected, as theirs is not.

    ``on_block``: called with the iterations done after every :data:`BLOCK` of them (and the
    last), for progress displays."""
    params, names, x, y_logits, variables = _dummy_start(
        model, target, input_shape, num_classes, batch, labels, generator
    )
    opt = torch.optim.Adam(variables, lr=lr)
    milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    value = float("inf")
    for it in range(iterations):
        opt.zero_grad()
        g = _dummy_gradient(model, params, names, x, labels, y_logits)
        objective = target.cosine(g) + tv * total_variation(x)
        objective.backward()
        x.grad.sign_()  # type: ignore[union-attr]
        opt.step()
        sched.step()
        if bounds is not None:
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, bounds[1]), bounds[0]))
        value = float(objective.detach())
        if on_block is not None and ((it + 1) % BLOCK == 0 or it + 1 == iterations):
            on_block(it + 1)
    guess = labels if labels is not None else y_logits.detach().argmax(-1)
    return Reconstruction(x.detach().clone(), guess, value, iterations)


def invert(
    model: torch.nn.Module,
    target: GradientTarget | ProjectionTarget,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    batch: int = 1,
    labels: Tensor | None = None,
    iterations: int = 300,
    generator: torch.Generator,
    on_block: Callable[[int], None] | None = None,
) -> Reconstruction:
    """DLG (Zhu et al. 2019): L-BFGS on dummy data (and soft labels unless ``labels`` given)
    so that the dummy's gradient at ``model`` matches ``target``. The model is evaluated with
    its parameters as given (eval mode is not set: the attacked upload came from train mode).

    Returns the best iterate by matching loss, each scored where it stands: the dummy start,
    then the point after every L-BFGS call of 20 iterations (``LBFGS.step`` returns the loss
    *before* its step, so it is not used as the score). A target with no finite matching loss
    at the start (ciphertext read as floats overflows the squared error) cannot be optimized:
    the start comes back with ``loss = inf`` and ``iterations = 0``, which callers report as
    "no finite objective" rather than as an attack's result. ``on_block``: called with the
    iterations done after every L-BFGS call (:data:`BLOCK` iterations), for progress displays."""
    params, names, x, y_logits, variables = _dummy_start(
        model, target, input_shape, num_classes, batch, labels, generator
    )
    opt = torch.optim.LBFGS(
        variables, lr=1.0, max_iter=BLOCK, history_size=100, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        opt.zero_grad()
        match = target.loss(_dummy_gradient(model, params, names, x, labels, y_logits))
        match.backward()
        return match

    best = (float(closure().detach()), x.detach().clone(), y_logits.detach().clone())
    steps = 0
    if math.isfinite(best[0]):
        for _ in range(max(1, iterations // BLOCK)):
            opt.step(closure)
            steps += BLOCK
            if on_block is not None:
                on_block(steps)
            if not torch.isfinite(x).all():
                break
            value = float(closure().detach())
            if not math.isfinite(value):
                break
            if value < best[0]:
                best = (value, x.detach().clone(), y_logits.detach().clone())
    guess = labels if labels is not None else best[2].argmax(-1)
    return Reconstruction(best[1], guess, best[0], steps)
