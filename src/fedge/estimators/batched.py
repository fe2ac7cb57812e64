"""Fast mode: many perturbed copies of one nn.Sequential evaluated in one hand-batched pass,
with the same perturbed weights as the lean mode (:func:`.perturbation.perturb`); models it
cannot batch fall back to the lean loop. Design notes: docs/decisions.md#estimators.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedge.estimators.lean import LossFn, mean_loss
from fedge.estimators.perturbation import Selection, perturb

__all__ = ["BatchedEvaluator", "register_channelwise"]

_ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.CELU,
    nn.ELU,
    nn.GELU,
    nn.Hardsigmoid,
    nn.Hardswish,
    nn.Hardtanh,
    nn.Identity,
    nn.LeakyReLU,
    nn.Mish,
    nn.ReLU,
    nn.ReLU6,
    nn.SELU,
    nn.Sigmoid,
    nn.SiLU,
    nn.Softplus,
    nn.Tanh,
)
_TORCH_POOLING = (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.AvgPool2d, nn.MaxPool2d)
_CHANNELWISE: list[type[nn.Module]] = list(_TORCH_POOLING)
# In-place forms of element-wise modules, for activations the batched pass owns (same kernels,
# so the same values as the module; saves an allocation of the widest activations).
_INPLACE: dict[type[nn.Module], Callable[[nn.Module, Tensor], Tensor]] = {
    nn.Hardswish: lambda m, t: F.hardswish(t, inplace=True),
    nn.Hardsigmoid: lambda m, t: F.hardsigmoid(t, inplace=True),
    nn.ReLU: lambda m, t: t.relu_(),
    nn.SELU: lambda m, t: F.selu(t, inplace=True),
    nn.SiLU: lambda m, t: F.silu(t, inplace=True),
    nn.Tanh: lambda m, t: t.tanh_(),
    nn.Sigmoid: lambda m, t: t.sigmoid_(),
}
_UNFOLD_LIMIT = 1 << 24  # largest shared im2col (elements) the first convolution may cache


def register_channelwise(*module_types: type[nn.Module]) -> None:
    """Declare parameter-free modules that act on each channel of ``(N, C, H, W)`` alone.

    The fast mode runs such a module unchanged on M models stacked along channels, e.g. a
    pooling module written as a max over strided slices. Registering a module that mixes
    channels gives wrong losses: only register what is channel-independent.
    """
    for t in module_types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise TypeError(f"register_channelwise takes nn.Module subclasses, got {t!r}")
        if t not in _CHANNELWISE:
            _CHANNELWISE.append(t)


def _is_channelwise(m: nn.Module) -> bool:
    """Registered, or declared by the module's class (``channelwise = True``)."""
    return isinstance(m, tuple(_CHANNELWISE)) or getattr(type(m), "channelwise", False) is True


class Unsupported(Exception):
    """Raised while planning or running when the batched path cannot evaluate the model."""


def _leaves(seq: nn.Sequential) -> list[nn.Module]:
    if type(seq).forward is not nn.Sequential.forward:
        raise Unsupported(f"{type(seq).__name__} overrides Sequential.forward")
    out: list[nn.Module] = []
    for m in seq:
        out.extend(_leaves(m) if isinstance(m, nn.Sequential) else [m])
    return out


class BatchedEvaluator:
    """Losses of M perturbed copies of a Sequential per pass; see the module docstring."""

    _STACKABLE: ClassVar[tuple[type[nn.Module], ...]] = (
        nn.Conv2d,
        nn.Linear,
        nn.GroupNorm,
        nn.BatchNorm1d,
        nn.BatchNorm2d,
        nn.LayerNorm,
        nn.Flatten,
        nn.Dropout,
    )

    def __init__(
        self,
        layers: list[nn.Module],
        first: int,
        sel: Selection,
        seed: int,
        x: Tensor,
        loss_fn: LossFn,
        y: Tensor,
    ) -> None:
        self.layers, self.first, self.sel, self.seed = layers, first, sel, seed
        self.loss_fn, self.y = loss_fn, y
        self.name_of = {id(p): n for n, p in sel.params.items()}
        self.x = x
        self.shared: Tensor | None = None  # output of the unperturbed prefix, once per call
        self.cols: Tensor | None = None  # im2col of the first convolution's shared input
        self.buffers: dict[tuple[int, ...], Tensor] = {}  # first convolution's outputs

    @classmethod
    def build(
        cls,
        model: nn.Module,
        sel: Selection,
        seed: int,
        x: Tensor,
        loss_fn: LossFn,
        y: Tensor,
    ) -> BatchedEvaluator | None:
        """The evaluator for ``model``, or None when the batched path cannot run it."""
        try:
            if not isinstance(model, nn.Sequential):
                raise Unsupported("not an nn.Sequential")
            layers = _leaves(model)
            owned = {id(p) for p in sel.params.values()}
            first = next(
                i for i, m in enumerate(layers) if any(id(p) in owned for p in m.parameters())
            )
            for m in layers[first:]:
                cls._check_layer(m)
        except (Unsupported, StopIteration):
            return None
        return cls(layers, first, sel, seed, x, loss_fn, y)

    @classmethod
    def _check_layer(cls, m: nn.Module) -> None:
        if isinstance(m, _ELEMENTWISE) or _is_channelwise(m):
            if any(True for _ in m.parameters()):
                raise Unsupported(f"{type(m).__name__} has parameters")
            return
        if not isinstance(m, cls._STACKABLE):
            raise Unsupported(type(m).__name__)
        if isinstance(m, nn.Conv2d) and m.padding_mode != "zeros":
            raise Unsupported("padding_mode")
        if isinstance(m, nn.Flatten) and (m.start_dim, m.end_dim) != (1, -1):
            raise Unsupported("Flatten dims")
        if isinstance(m, nn.Dropout) and m.training and m.p > 0:
            raise Unsupported("active dropout")
        if isinstance(m, nn.LayerNorm) and len(m.normalized_shape) != 1:
            raise Unsupported("LayerNorm over several dims")

    def __enter__(self) -> BatchedEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shared = self.cols = None
        self.buffers.clear()

    def losses(
        self, ks: list[int], blocks: tuple[float, ...], sigma: float, baseline: bool
    ) -> Tensor:
        """float64 losses at ``W + s·σ·z_k`` for s in ``blocks`` (outer), k in ``ks`` (inner),
        then at ``W`` if ``baseline`` (same contract as the lean evaluator)."""
        if self.shared is None:
            h = self.x
            for m in self.layers[: self.first]:
                h = m(h)
            self.shared = h
        m_count = len(blocks) * len(ks) + int(baseline)
        weights = _Weights(self, ks, tuple(s * sigma for s in blocks), baseline)
        kind, h = "shared", self.shared
        for i, m in enumerate(self.layers[self.first :]):
            kind, h = self._layer(m, kind, h, m_count, weights, first=i == 0)
        if kind == "vector":  # (M, B, classes)
            outs = [h[j] for j in range(m_count)]
        elif kind == "image":  # (B, M·C, ...)
            hv = h.reshape(h.shape[0], m_count, h.shape[1] // m_count, *h.shape[2:])
            outs = [hv[:, j] for j in range(m_count)]
        else:
            raise Unsupported("output is not batched")
        losses = [mean_loss(self.loss_fn, o, self.y) for o in outs]
        return torch.tensor(losses, dtype=torch.float64)

    def _layer(
        self, m: nn.Module, kind: str, h: Tensor, mc: int, w: _Weights, first: bool
    ) -> tuple[str, Tensor]:
        if isinstance(m, nn.Dropout) or isinstance(m, _ELEMENTWISE):
            inplace = _INPLACE.get(type(m))
            if inplace is not None and kind != "shared":  # stacked activations are ours
                return kind, inplace(m, h)
            return kind, m(h)
        if _is_channelwise(m):
            if kind == "vector":
                raise Unsupported("pooling a vector")
            if kind == "image" and isinstance(m, _TORCH_POOLING):
                # torch's pooling kernels vectorize over channels_last (10x faster on NCHW
                # here), and the grouped convolution that usually follows wants it too.
                h = h.contiguous(memory_format=torch.channels_last)
            return kind, m(h)
        if isinstance(m, nn.Flatten):
            if kind == "image":  # (B, M·C, H, W) -> (M, B, C·H·W)
                return "vector", h.reshape(h.shape[0], mc, -1).transpose(0, 1)
            if kind == "shared":
                return kind, m(h)
            raise Unsupported("Flatten of a vector")
        if isinstance(m, nn.Conv2d):
            return self._conv(m, kind, h, mc, w, first)
        if isinstance(m, nn.Linear):
            return self._linear(m, kind, h, mc, w)
        if kind == "shared":  # a norm right after the prefix: give every model its own copy
            kind, h = _lift(h, mc)
        if isinstance(m, nn.GroupNorm):
            wt, b = w.get(m.weight), w.get(m.bias)
            groups = mc * m.num_groups
            return kind, _per_channel(
                kind, h, mc, lambda t: F.group_norm(t, groups, _flat(wt), _flat(b), m.eps)
            )
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            return kind, self._batch_norm(m, kind, h, mc, w)
        if isinstance(m, nn.LayerNorm):
            if kind != "vector":
                raise Unsupported("LayerNorm of an image")
            out = F.layer_norm(h, m.normalized_shape, None, None, m.eps)
            wt, b = w.get(m.weight), w.get(m.bias)
            if wt is not None:
                out = out * wt.unsqueeze(1)
            if b is not None:
                out = out + b.unsqueeze(1)
            return kind, out
        raise Unsupported(type(m).__name__)

    def _conv(
        self, m: nn.Conv2d, kind: str, h: Tensor, mc: int, w: _Weights, first: bool
    ) -> tuple[str, Tensor]:
        wt, b = w.get(m.weight), w.get(m.bias)  # (M, Cout, Cin/g, kh, kw), (M, Cout)
        assert wt is not None
        cout = m.out_channels
        if kind == "shared" and h.dim() == 4 and m.groups == 1:
            if first and isinstance(m.padding, tuple) and self._cols_fit(h, m):
                # One matmul for all M models on the shared im2col, the bias riding on a row of
                # ones: (M·Cout, Cin·kh·kw [+1]) @ (B, Cin·kh·kw [+1], L) -> (B, M·Cout, L).
                if self.cols is None:
                    cols = F.unfold(h, m.kernel_size, m.dilation, m.padding, m.stride)
                    if b is not None:
                        cols = torch.cat([cols, cols.new_ones(cols.shape[0], 1, cols.shape[2])], 1)
                    self.cols = cols
                wmat = wt.reshape(mc * cout, -1)
                if b is not None:
                    wmat = torch.cat([wmat, b.reshape(mc * cout, 1)], 1)
                shape = (h.shape[0], mc * cout, self.cols.shape[2])
                if shape not in self.buffers:  # reused across chunks: no fresh pages to touch
                    self.buffers[shape] = h.new_empty(shape)
                out = torch.matmul(wmat, self.cols, out=self.buffers[shape])
                hw = [
                    (h.shape[2 + i] + 2 * m.padding[i] - m.dilation[i] * (m.kernel_size[i] - 1) - 1)
                    // m.stride[i]
                    + 1
                    for i in range(2)
                ]
                return "image", out.view(h.shape[0], mc * cout, *hw)
            out = F.conv2d(
                h, wt.reshape(mc * cout, *wt.shape[2:]), _flat(b), m.stride, m.padding, m.dilation
            )
            return "image", out
        if kind == "shared":
            kind, h = _lift(h, mc)
        if kind != "image":
            raise Unsupported("Conv2d of a vector")
        if self._norm_follows(m):
            # GroupNorm is ~10x slower on channels_last, and a grouped convolution runs as fast in
            # the default layout here (torch 2.13): skip the layout round trip (measured: 17-28%
            # of a fast-mode step for BAFFLE's LeNet, docs/benchmarks.md "Zeroth-order step time").
            out = F.conv2d(
                h.contiguous(),
                wt.reshape(mc * cout, *wt.shape[2:]),
                _flat(b),
                m.stride,
                m.padding,
                m.dilation,
                mc * m.groups,
            )
            return "image", out
        h = h.contiguous(memory_format=torch.channels_last)
        out = F.conv2d(
            h,
            wt.reshape(mc * cout, *wt.shape[2:]),
            _flat(b),
            m.stride,
            m.padding,
            m.dilation,
            mc * m.groups,
        )
        return "image", out

    def _linear(
        self, m: nn.Linear, kind: str, h: Tensor, mc: int, w: _Weights
    ) -> tuple[str, Tensor]:
        wt, b = w.get(m.weight), w.get(m.bias)  # (M, Out, In), (M, Out)
        assert wt is not None
        if kind == "shared" and h.dim() == 2:  # (B, In) @ (In, M·Out)
            out = F.linear(h, wt.reshape(-1, wt.shape[-1]), _flat(b))
            return "vector", out.view(h.shape[0], mc, -1).transpose(0, 1)
        if kind != "vector":
            raise Unsupported("Linear of an image")
        if b is None:
            return kind, torch.bmm(h, wt.transpose(1, 2))
        return kind, torch.baddbmm(b.unsqueeze(1), h, wt.transpose(1, 2))

    def _batch_norm(
        self, m: nn.BatchNorm1d | nn.BatchNorm2d, kind: str, h: Tensor, mc: int, w: _Weights
    ) -> Tensor:
        if (kind == "image") != isinstance(m, nn.BatchNorm2d) or (kind == "vector") != (
            isinstance(m, nn.BatchNorm1d)
        ):
            raise Unsupported("BatchNorm input rank")
        batch_stats = m.training or m.running_mean is None
        rm = None if batch_stats else m.running_mean.repeat(mc)  # type: ignore[union-attr]
        rv = None if batch_stats else m.running_var.repeat(mc)  # type: ignore[union-attr]
        wt, b = w.get(m.weight), w.get(m.bias)
        # Running statistics are never updated here (the lean mode restores them instead).
        return _per_channel(
            kind,
            h,
            mc,
            lambda t: F.batch_norm(t, rm, rv, _flat(wt), _flat(b), batch_stats, 0.0, m.eps),
        )

    def _norm_follows(self, m: nn.Module) -> bool:
        i = next(j for j, layer in enumerate(self.layers) if layer is m)
        for nxt in self.layers[i + 1 :]:
            if isinstance(nxt, (nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)):
                return True
            if not (isinstance(nxt, _ELEMENTWISE) or isinstance(nxt, nn.Dropout)):
                return False
        return False

    def _cols_fit(self, h: Tensor, m: nn.Conv2d) -> bool:
        k = m.in_channels * math.prod(m.kernel_size)
        return h.shape[0] * k * h.shape[2] * h.shape[3] <= _UNFOLD_LIMIT


class _Weights:
    """Stacked ``(M, *shape)`` parameters of one chunk, built layer by layer as it runs."""

    def __init__(
        self, ev: BatchedEvaluator, ks: list[int], scales: tuple[float, ...], baseline: bool
    ) -> None:
        self.ev, self.ks, self.scales, self.baseline = ev, ks, scales, baseline
        self.mc = len(scales) * len(ks) + int(baseline)

    def get(self, p: Tensor | None) -> Tensor | None:
        if p is None:
            return None
        name = self.ev.name_of.get(id(p))
        if name is None:  # not perturbed: the same weights for every model
            return p.unsqueeze(0).expand(self.mc, *p.shape)
        z = self.ev.sel.draw(self.ev.seed, self.ks, name, p.shape)  # (P, *shape)
        mask = self.ev.sel.masks.get(name)
        parts = [perturb(p, z, s, mask) for s in self.scales]
        if self.baseline:
            parts.append(p.unsqueeze(0))
        return torch.cat(parts)


def _flat(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.reshape(-1)


def _lift(h: Tensor, mc: int) -> tuple[str, Tensor]:
    """Copy a shared input once per model: image ``(B, M·C, H, W)`` or vector ``(M, B, F)``."""
    if h.dim() == 4:
        return "image", h.repeat(1, mc, 1, 1)
    if h.dim() == 2:
        return "vector", h.unsqueeze(0).repeat(mc, 1, 1)
    raise Unsupported(f"input of rank {h.dim()}")


def _per_channel(kind: str, h: Tensor, mc: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """Apply a channel-stacked op: images directly, vectors as ``(B, M·C)`` and back."""
    if kind == "image":
        return fn(h)
    bsz = h.shape[1]
    out = fn(h.transpose(0, 1).reshape(bsz, -1))
    return out.view(bsz, mc, -1).transpose(0, 1)
