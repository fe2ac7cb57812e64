"""Lean evaluation of perturbed losses (BAFFLE Table 4, Appendix C): forward hooks swap
``W + s·δ_k`` in while a module runs, so the extra memory is one parameter's worth of noise (two
with portable draws, whose small parameters are drawn together once per direction) and the stored
weights are never written. Design notes: docs/decisions.md#estimators.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedge.core.errors import ConfigError
from fedge.estimators.perturbation import Selection, perturb

__all__ = ["LeanEvaluator", "LossFn", "mean_loss", "scalar_loss"]

LossFn = Callable[[Tensor, Tensor], Tensor]
# Parameters of at most this many elements are drawn together, one call per direction, when the
# directions can (Selection.draw_many: portable draws): drawing a 10-element bias alone costs about
# as much as an 8,000-element layer. The group holds at most as many elements as the largest
# parameter, so no tensor the lean mode makes is larger than a parameter (or the forward's own).
_GROUP_MAX = 8192


def scalar_loss(loss: Tensor) -> float:
    """The loss as a Python float (float64), insisting it is one number."""
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        got = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ConfigError(
            f"loss_fn must return a scalar (mean) loss, got {got}; "
            "use reduction='mean' (e.g. F.cross_entropy's default)"
        )
    return float(loss)


def mean_loss(loss_fn: LossFn, logits: Tensor, y: Tensor) -> float:
    """The batch's mean loss, computed in float64 from the forward's logits.

    The forward runs in the model's precision (fp32, or bf16/fp16 under autocast); only the
    loss on its logits — a (B, classes) tensor, negligible work — runs in float64. Loss
    differences are ~σ·|∇L| (≈3e-4 at BAFFLE's σ = 1e-4), while an fp32 cross-entropy near
    2.3 rounds at ~2.4e-7 per term: taking the loss and its mean over the batch in float64
    cuts the relative error of the K differences against an all-float64 computation from
    1.9e-3 to 8.4e-5 on BAFFLE's LeNet (batch 64, K = 100; fp32 per-sample losses averaged
    in float64 reach 1.2e-4). ``loss_fn`` must accept float64 logits (every torch loss does).
    """
    return scalar_loss(loss_fn(logits.to(torch.float64), y))


class LeanEvaluator:
    """Losses of ``W + s·σ·z_k`` by plain forwards of ``model``; a context manager holds the hooks.

    Args:
        model: the network (its Parameters are never written to).
        sel: the selected parameters and masks.
        seed: perturbation seed.
        x, loss_fn, y: the batch and the loss.
    """

    def __init__(
        self,
        model: nn.Module,
        sel: Selection,
        seed: int,
        x: Tensor,
        loss_fn: LossFn,
        y: Tensor,
        *,
        reuse_directions: bool = False,
    ) -> None:
        self.model, self.sel, self.seed = model, sel, seed
        self.reuse = reuse_directions
        self.z_of: dict[str, Tensor] = {}  # the current k's noise, when reused
        self.z_k: int | None = None
        self.x, self.loss_fn, self.y = x, loss_fn, y
        name_of = {id(p): n for n, p in sel.params.items()}
        self.owners: dict[nn.Module, list[tuple[str, str]]] = {}
        for mod in model.modules():
            hits = [
                (attr, name_of[id(p)])
                for attr, p in mod._parameters.items()
                if p is not None and id(p) in name_of
            ]
            if hits:
                self.owners[mod] = hits
        self.current: tuple[int, float] | None = None  # (k, s·σ) of the running forward
        self.swapped: list[tuple[nn.Module, str, Tensor]] = []
        self.seen: set[str] = set()
        self.checked = False
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.group = self._small_params() if sel.draw_many is not None else []
        self.grouped = frozenset(self.group)
        self.group_z: dict[str, Tensor] = {}  # z_k of the group's parameters, k = group_k
        self.group_k: int | None = None

    def __enter__(self) -> LeanEvaluator:
        for mod in self.owners:
            self.handles.append(mod.register_forward_pre_hook(self._swap_in))
            self.handles.append(mod.register_forward_hook(self._swap_out))
        return self

    def _small_params(self) -> list[str]:
        """The parameters drawn together (one ``draw_many`` call per direction): the small ones,
        in selection order, up to the group's element budget."""
        sizes = {n: p.numel() for n, p in self.sel.params.items()}
        budget = max(sizes.values(), default=0)
        group, total = [], 0
        for name, n in sizes.items():
            if n <= _GROUP_MAX and total + n <= budget:
                group.append(name)
                total += n
        return group if len(group) > 1 else []

    def __exit__(self, *exc: object) -> None:
        self._restore(None)
        self.z_of.clear()
        self.z_k = None
        self.group_z.clear()
        self.group_k = None
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def losses(
        self, ks: list[int], blocks: tuple[float, ...], sigma: float, baseline: bool
    ) -> Tensor:
        """float64 losses at ``W + s·σ·z_k`` for s in ``blocks`` (outer), k in ``ks`` (inner),
        then at ``W`` if ``baseline``. Both signs of one δ_k run back to back."""
        by_spec: dict[tuple[int, float], float] = {}
        for k in ks:
            for s in blocks:
                by_spec[(k, s)] = self._loss((k, s * sigma))
        out = [by_spec[(k, s)] for s in blocks for k in ks]
        if baseline:
            out.append(self._loss(None))
        return torch.tensor(out, dtype=torch.float64)

    def _loss(self, spec: tuple[int, float] | None) -> float:
        self.current = spec
        try:
            loss = mean_loss(self.loss_fn, self.model(self.x), self.y)
        finally:
            self.current = None
            self._restore(None)
        if spec is not None and not self.checked:
            self._check_all_used()
        return loss

    def _check_all_used(self) -> None:
        missing = sorted(set(self.sel.params) - self.seen)
        if missing:
            raise ConfigError(
                f"parameters {missing} are not used by their module's forward, so they cannot "
                "be perturbed; drop them from `params` (the lean mode perturbs a parameter "
                "while the module that owns it runs)"
            )
        self.checked = True

    def _swap_in(self, mod: nn.Module, args: object) -> None:
        if self.current is None:
            return
        k, scale = self.current
        for attr, name in self.owners[mod]:
            w = mod._parameters[attr]
            if w is not self.sel.params[name]:  # module re-entered: already perturbed
                continue
            z = self._direction(k, name, w.shape)
            # A plain tensor in _parameters is what `mod.weight` returns during this forward.
            pert = perturb(w, z, scale, self.sel.masks.get(name))
            mod._parameters[attr] = pert  # type: ignore[assignment]
            self.swapped.append((mod, attr, w))
            self.seen.add(name)

    def _direction(self, k: int, name: str, shape: torch.Size) -> Tensor:
        """z_{k,name}: drawn, or (reusing) kept from this k's other sign; a small parameter's
        with the group's (drawn once for k, kept while k's forwards run)."""
        if name in self.grouped:
            if self.group_k != k:
                assert self.sel.draw_many is not None
                items = [(n, self.sel.params[n].shape) for n in self.group]
                self.group_z = dict(zip(self.group, self.sel.draw_many(self.seed, k, items)))
                self.group_k = k
            return self.group_z[name]
        if not self.reuse:
            return self.sel.draw(self.seed, [k], name, shape)[0]
        if self.z_k != k:
            self.z_of.clear()
            self.z_k = k
        z = self.z_of.get(name)
        if z is None:
            z = self.z_of[name] = self.sel.draw(self.seed, [k], name, shape)[0]
        return z

    def _swap_out(self, mod: nn.Module, args: object, out: object) -> None:
        self._restore(mod)

    def _restore(self, mod: nn.Module | None) -> None:
        keep = []
        for owner, attr, w in self.swapped:
            if mod is None or owner is mod:
                owner._parameters[attr] = w  # type: ignore[assignment]
            else:
                keep.append((owner, attr, w))
        self.swapped = keep
