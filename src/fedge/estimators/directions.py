"""Perturbation directions of a zeroth-order step (``gaussian``, ``orthogonal``, ``block``), each
unbiased with the weights it states for ĝ = 1/(c·σ) Σ_k w_k ΔL_k z_k (BAFFLE Eq. 6 is the
Gaussian case, w_k = 1/K), and each regenerated from (seed, k, parameter) alone: from torch's
generators (``draws="torch"``, the default) or from :mod:`fedge.core.portable`
(``draws="portable"``: the same laws, the same bits on every machine). Design notes:
docs/decisions.md#estimators.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, get_args

import torch
from torch import Tensor

from fedge.core import portable
from fedge.core.errors import ConfigError
from fedge.core.rng import Draws, check_draws, generator
from fedge.estimators.perturbation import (
    DrawMany,
    normal_chunk,
    portable_normal_chunk,
    portable_normal_many,
)

__all__ = [
    "DirectionKind",
    "Directions",
    "block_split",
    "guided_directions",
    "layer_scaled",
    "layer_scales",
    "make_directions",
    "match_params",
    "remembered",
]

DirectionKind = Literal["gaussian", "orthogonal", "block"]
Draw = Callable[[int, Sequence[int], str, Sequence[int]], Tensor]


class Directions:
    """The K directions of one step: ``draw(seed, ks, name, shape) -> (len(ks), *shape)``
    float32 tensor of ``z_k`` restricted to parameter ``name`` (on the CPU, or on the device
    :func:`make_directions` was given), ``weights`` (K,) float64 with
    ĝ = 1/(c σ) Σ_k w_k ΔL_k z_k, and the generator ``draws`` they come from;
    ``draw_many`` (optional) draws one ``z_k`` of several parameters in one call, the same
    tensors as ``draw`` (:class:`~fedge.estimators.perturbation.Selection`)."""

    def __init__(
        self,
        kind: str,
        k: int,
        draw: Draw,
        weights: Tensor,
        draws: Draws = "torch",
        draw_many: DrawMany | None = None,
    ) -> None:
        self.kind, self.k, self.draw, self.weights = kind, k, draw, weights
        self.draws = check_draws(draws)
        self.draw_many = draw_many


def remembered(dirs: Directions, budget_bytes: int) -> Directions:
    """``dirs`` drawing each ``z_k`` once: a draw keeps what it returns, up to ``budget_bytes``.

    For the two halves of one estimate run on one device (BAFFLE's epoch level): the client's
    forwards draw every ``z_k`` to perturb the weights and its own ``estimate_gradient`` draws
    the same ``z_k`` again to rebuild ĝ. For a small model the second draw is not small: on
    LeNet-5 (batch 32, K = 100, forward scheme) drawing is about half of the client's step
    and the rebuild's draw alone ~a quarter. Remembering returns the very same numbers (each
    direction is a function of ``(seed, k, name, shape)`` only), so results are bit for bit
    those of drawing twice; the cost is memory, K × n float32 at most, hence the budget: draws
    past it are not kept and are drawn again. Kept draws are shared with the caller, who must
    not write into them (no estimator does).
    """
    kept: dict[tuple[int, str, tuple[int, ...], int], Tensor] = {}
    used = [0]
    lock = threading.Lock()

    def draw(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
        keys = [(int(seed), name, tuple(int(s) for s in shape), int(k)) for k in ks]
        with lock:
            rows = [kept.get(key) for key in keys]
        missing = [i for i, row in enumerate(rows) if row is None]
        if not missing:
            return torch.stack(rows)  # type: ignore[arg-type]
        fresh = dirs.draw(seed, [ks[i] for i in missing], name, shape)
        with lock:
            if used[0] + fresh.numel() * fresh.element_size() <= budget_bytes:
                used[0] += fresh.numel() * fresh.element_size()
                kept.update((keys[i], fresh[j]) for j, i in enumerate(missing))
        if len(missing) == len(keys):
            return fresh
        for j, i in enumerate(missing):
            rows[i] = fresh[j]
        return torch.stack(rows)  # type: ignore[arg-type]

    many = dirs.draw_many
    if many is None:
        return Directions(dirs.kind, dirs.k, draw, dirs.weights, dirs.draws)

    def draw_many(seed: int, k: int, items: Sequence[tuple[str, Sequence[int]]]) -> list[Tensor]:
        keys = [(int(seed), name, tuple(int(s) for s in shape), int(k)) for name, shape in items]
        with lock:
            rows = [kept.get(key) for key in keys]
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            fresh = many(seed, k, [items[i] for i in missing])
            size = sum(z.numel() * z.element_size() for z in fresh)
            with lock:
                if used[0] + size <= budget_bytes:
                    used[0] += size
                    kept.update((keys[i], z) for i, z in zip(missing, fresh))
            for i, z in zip(missing, fresh):
                rows[i] = z
        return rows  # type: ignore[return-value]

    return Directions(dirs.kind, dirs.k, draw, dirs.weights, dirs.draws, draw_many)


def make_directions(
    kind: str,
    shapes: Mapping[str, Sequence[int]],
    k: int,
    masks: Mapping[str, Tensor] | None = None,
    *,
    draws: Draws = "torch",
    device: torch.device | None = None,
) -> Directions:
    """The directions ``kind`` for a selection (name -> shape, in model order) and K; ``masks``
    (name -> boolean, True = perturbed) size ``block``'s blocks by their kept coordinates (the
    other kinds draw every coordinate and leave masking to the estimator); ``draws`` picks the
    generator (``"torch"``, today's numbers, or ``"portable"``, the same on every machine).

    ``device`` (None: the CPU): where the draws are returned. Portable Gaussian directions are
    made there (:func:`fedge.core.portable.normal_rows`' ``device``: the same bits as on the
    CPU); the others are drawn on the CPU and moved (torch's generators give other numbers on
    a GPU, so a GPU run's directions stay those of a CPU run)."""
    dirs = _make_directions(kind, shapes, k, masks, draws=draws)
    if device is None or device.type == "cpu":
        return dirs
    if kind == "gaussian" and draws == "portable":
        return Directions(
            kind, k, functools.partial(portable_normal_chunk, device=device), dirs.weights, draws
        )
    cpu_draw = dirs.draw

    def draw(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
        return cpu_draw(seed, ks, name, shape).to(device)

    return Directions(kind, k, draw, dirs.weights, draws)


def _make_directions(
    kind: str,
    shapes: Mapping[str, Sequence[int]],
    k: int,
    masks: Mapping[str, Tensor] | None,
    *,
    draws: Draws,
) -> Directions:
    check_draws(draws)
    if kind not in get_args(DirectionKind):
        raise ConfigError(
            f"directions must be one of {list(get_args(DirectionKind))}, got {kind!r}; "
            "gaussian is BAFFLE's i.i.d. N(0, I)"
        )
    uniform = torch.full((k,), 1.0 / k, dtype=torch.float64)
    if kind == "gaussian":
        many = portable_normal_many if draws == "portable" else None
        return Directions(kind, k, normal_chunk(draws), uniform, draws, many)
    if kind == "orthogonal":
        chunk = portable_hadamard_chunk if draws == "portable" else hadamard_chunk
        return Directions(kind, k, chunk, uniform, draws)
    return _block(shapes, k, masks or {}, draws)


def guided_directions(
    basis: Sequence[Mapping[str, Tensor]],
    shapes: Mapping[str, Sequence[int]],
    k: int,
    share: float,
    masks: Mapping[str, Tensor] | None = None,
    *,
    draws: Draws = "torch",
) -> Directions:
    """K directions of which ``round(share · K)`` lie in the span of ``basis`` (e.g. the last r
    global updates, which server and clients both hold) and the rest are BAFFLE's fresh seeded
    Gaussians; kind ``"guided"``.

    The basis vectors (name -> tensor over the selection, zero off ``masks``) are orthonormalized
    together (Gram-Schmidt in float64, in the given order; a vector already in the span of the
    earlier ones is dropped), giving B (r × n, BBᵀ = I). A guided direction is
    z_k = s · Bᵀ ξ_k with ξ_k ~ N(0, I_r) drawn from ``(seed, "zo-guided", k)`` and s = sqrt(n / r),
    so its norm matches a Gaussian direction's (σ·z_k perturbs as much). With weights 1/K for the
    K_f fresh directions and 1/(K s²) for the K_g guided ones, E[ĝ] = (K_f / K)·g + (K_g / K)·P g,
    P = BᵀB the projection on the span: the estimate is biased by −(K_g / K)(I − P) g (zero where g
    lies in the span) and in exchange its guided part has the variance of an r-dimensional
    problem, not an n-dimensional one. With an empty basis every direction is fresh (BAFFLE)."""
    check_draws(draws)
    if not 0 <= share <= 1:
        raise ConfigError(f"guided share must be in [0, 1], got {share!r}")
    names = list(shapes)
    masks = masks or {}
    rows: list[Tensor] = []
    for vec in basis:
        v = torch.cat(
            [
                (vec[n].to(torch.float64) * masks[n] if n in masks else vec[n].to(torch.float64))
                .reshape(-1)
                .cpu()
                for n in names
            ]
        )
        for b in rows:
            v = v - (v @ b) * b
        norm = float(v.norm())
        if norm > 1e-12 * max(1.0, float(v.abs().max())) and norm > 0:
            rows.append(v / norm)
    r = len(rows)
    k_guided = round(share * k) if r else 0
    k_fresh = k - k_guided
    n = sum(math.prod(shapes[m]) for m in names)
    scale = math.sqrt(n / r) if r else 1.0
    weights = torch.full((k,), 1.0 / k, dtype=torch.float64)
    weights[k_fresh:] = 1.0 / (k * scale**2)
    offsets, start = {}, 0
    for m in names:
        offsets[m] = (start, start + math.prod(shapes[m]))
        start = offsets[m][1]
    basis_rows = torch.stack(rows).to(torch.float32) if r else torch.zeros(0, n)
    gaussian = normal_chunk(draws)

    def xi(seed: int, kk: int) -> Tensor:
        if draws == "portable":
            return portable.normal(portable.stream_key(int(seed), "zo-guided", int(kk)), (r,))
        return torch.randn(r, generator=generator(seed, "zo-guided", int(kk)))

    def draw(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
        if name not in offsets:
            raise ConfigError(
                f"parameter {name!r} is not in the selection the guided directions were made for"
            )
        out = torch.empty((len(ks), *shape))
        fresh = [i for i, kk in enumerate(ks) if int(kk) < k_fresh]
        if fresh:
            out[fresh] = gaussian(seed, [ks[i] for i in fresh], name, shape)
        lo, hi = offsets[name]
        for i, kk in enumerate(ks):
            if int(kk) >= k_fresh:
                out[i] = (scale * (xi(seed, int(kk)) @ basis_rows[:, lo:hi])).view(*shape)
        return out

    return Directions("guided", k, draw, weights, draws)


def layer_scales(
    params: Mapping[str, Tensor], masks: Mapping[str, Tensor] | None = None
) -> dict[str, float]:
    """Each parameter's perturbation scale s_l under ``sigma_scale: layer``: its layer's weight
    RMS, normalised so the mean of s² over the perturbed coordinates is 1 (σ keeps its overall
    size: E‖S z‖² = n, as a Gaussian direction's).

    A layer is a parameter's module (:func:`block_of`); its scale is the RMS of the module's
    ``weight`` where that is in ``params``, else of the module's tensors in ``params`` together,
    so a bias (zero at initialisation) moves with its weights. A layer whose RMS is 0 takes the
    RMS of all of ``params``, and 1 where that is 0 too. ``masks`` (True = perturbed) count only
    the kept coordinates. Computed in float64 from the values alone, so a client and the server
    holding the same weights get the same scales."""
    if not params:
        raise ConfigError("layer scales need the perturbed parameters; got none")
    masks = masks or {}

    def mean_square(ts: Sequence[Tensor]) -> float:
        total = sum(float(t.detach().to(torch.float64).square().sum()) for t in ts)
        return total / max(1, sum(t.numel() for t in ts))

    layers: dict[str, list[str]] = {}
    for name in params:
        layers.setdefault(block_of(name), []).append(name)
    overall = mean_square(list(params.values()))
    raw: dict[str, float] = {}
    for layer, names in layers.items():
        weight = f"{layer}.weight"
        ms = mean_square([params[weight]] if weight in params else [params[n] for n in names])
        ms = ms if ms > 0 else overall if overall > 0 else 1.0
        raw.update(dict.fromkeys(names, math.sqrt(ms)))
    counts = {n: int(masks[n].sum()) if n in masks else params[n].numel() for n in params}
    n_total = sum(counts.values())
    if n_total == 0:
        raise ConfigError("layer scales need a perturbed coordinate; every one is masked out")
    norm = math.sqrt(sum(raw[n] ** 2 * counts[n] for n in params) / n_total)
    return {n: raw[n] / norm for n in params}


def layer_scaled(dirs: Directions, scales: Mapping[str, float]) -> Directions:
    """``dirs`` with parameter ``name``'s z_k multiplied by ``scales[name]`` (its kind, weights
    and generator kept): the perturbation δ_k = σ S z_k of ``sigma_scale: layer``, S = diag(s_l)
    (:func:`layer_scales`). The rebuild from the same draws, ĝ = 1/(cσ) Σ_k w_k ΔL_k S z_k, has
    E[ĝ] = S² ∇L to first order in σ: the gradient preconditioned per layer by s_l² (plain
    zeroth-order SGD on u = S⁻¹W, whose perturbations are the same fraction of every layer's
    weights). Drawing a parameter with no scale raises."""

    def scale_of(name: str) -> float:
        if name not in scales:
            raise ConfigError(
                f"parameter {name!r} has no layer scale; the scales cover {sorted(scales)[:5]}"
            )
        return float(scales[name])

    def draw(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
        return dirs.draw(seed, ks, name, shape) * scale_of(name)

    many = dirs.draw_many
    if many is None:
        return Directions(dirs.kind, dirs.k, draw, dirs.weights, dirs.draws)

    def draw_many(seed: int, k: int, items: Sequence[tuple[str, Sequence[int]]]) -> list[Tensor]:
        return [z * scale_of(name) for z, (name, _) in zip(many(seed, k, items), items)]

    return Directions(dirs.kind, dirs.k, draw, dirs.weights, dirs.draws, draw_many)


def block_split(sizes: Sequence[int], k: int) -> list[int]:
    """K_b ∝ sqrt(n_b), each ≥ 1 (0 for a block of no coordinates), summing to K (largest
    remainder; ties to the earlier block)."""
    live = [i for i, n in enumerate(sizes) if n > 0]
    b = len(live)
    if b == 0:
        raise ConfigError(
            "block directions need a perturbed coordinate; every selected one is masked out"
        )
    if k < b:
        raise ConfigError(
            f"block directions need k >= the number of blocks: k={k}, {b} blocks; "
            f"raise k to at least {b} or perturb fewer parameters"
        )
    roots = [math.sqrt(n) for n in sizes]
    extra = k - b  # one each first
    share = [extra * r / sum(roots) for r in roots]
    out = [(1 + int(s)) if n > 0 else 0 for s, n in zip(share, sizes)]
    left = k - sum(out)
    for i in sorted(live, key=lambda i: (-(share[i] - int(share[i])), i))[:left]:
        out[i] += 1
    return out


def block_of(name: str) -> str:
    """A parameter's block: its module's dotted path (``"fc.0.weight"`` -> ``"fc.0"``)."""
    return name.rsplit(".", 1)[0] if "." in name else name


def _block(
    shapes: Mapping[str, Sequence[int]], k: int, masks: Mapping[str, Tensor], draws: Draws
) -> Directions:
    gaussian = normal_chunk(draws)
    blocks: dict[str, int] = {}
    for name, shape in shapes.items():
        n = int(masks[name].sum()) if name in masks else math.prod(shape)
        blocks[block_of(name)] = blocks.get(block_of(name), 0) + n
    counts = block_split(list(blocks.values()), k)
    ranges: dict[str, range] = {}
    weights = torch.empty(k, dtype=torch.float64)
    start = 0
    for b, kb in zip(blocks, counts):
        ranges[b] = range(start, start + kb)
        weights[start : start + kb] = 1.0 / max(kb, 1)  # kb = 0: an empty range
        start += kb

    def draw(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
        own = ranges.get(block_of(name))
        if own is None:
            raise ConfigError(
                f"parameter {name!r} is not in the selection the block directions were made for"
            )
        out = torch.zeros((len(ks), *shape))
        rows = [i for i, kk in enumerate(ks) if int(kk) in own]
        if rows:
            out[rows] = gaussian(seed, [ks[i] for i in rows], name, shape)
        return out

    return Directions("block", k, draw, weights, draws)


def _parity(v: Tensor) -> Tensor:
    """popcount(v) mod 2 for non-negative int64 ``v`` (xor folding)."""
    for shift in (32, 16, 8, 4, 2, 1):
        v = v ^ (v >> shift)
    return v & 1


def hadamard_chunk(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
    """``z_k`` of the ``orthogonal`` directions for parameter ``name``: ``(len(ks), *shape)``."""
    m = math.prod(shape)
    n = 1 << max(0, (m - 1).bit_length())  # N = 2^ceil(log2 m)
    d = torch.randint(0, 2, (m,), generator=generator(seed, "zo-hadamard", name)).mul_(2).sub_(1)

    def chunk(c: int) -> tuple[Tensor, Tensor]:
        g = generator(seed, "zo-hadamard", c, name)
        return torch.randperm(n, generator=g), torch.randint(0, 2, (n,), generator=g) * 2 - 1

    return _hadamard(ks, shape, n, d, chunk)


def portable_hadamard_chunk(
    seed: int, ks: Sequence[int], name: str, shape: Sequence[int]
) -> Tensor:
    """:func:`hadamard_chunk` from portable draws: ``d`` = ``signs(stream_key(seed,
    "zo-hadamard", name))``, chunk c's column order ``permutation(stream_key(seed,
    "zo-hadamard", c, name))`` and signs ``signs(stream_key(seed, "zo-hadamard-sign", c, name))``."""
    m = math.prod(shape)
    n = 1 << max(0, (m - 1).bit_length())
    seed = int(seed)
    d = portable.signs(portable.stream_key(seed, "zo-hadamard", name), (m,)).to(torch.int64)

    def chunk(c: int) -> tuple[Tensor, Tensor]:
        perm = portable.permutation(portable.stream_key(seed, "zo-hadamard", c, name), n)
        s = portable.signs(portable.stream_key(seed, "zo-hadamard-sign", c, name), (n,))
        return perm, s.to(torch.int64)

    return _hadamard(ks, shape, n, d, chunk)


def _hadamard(
    ks: Sequence[int],
    shape: Sequence[int],
    n: int,
    d: Tensor,
    chunk: Callable[[int], tuple[Tensor, Tensor]],
) -> Tensor:
    """z_k[i] = s_k · d[i] · H[i, π(k mod N)] for the chunks' (π, s) that ``chunk(c)`` draws."""
    m = math.prod(shape)
    cols = torch.empty(len(ks), dtype=torch.int64)
    signs = torch.empty(len(ks), dtype=torch.int64)
    perms: dict[int, tuple[Tensor, Tensor]] = {}
    for i, k in enumerate(ks):
        c = int(k) // n
        if c not in perms:
            perms[c] = chunk(c)
        perm, s = perms[c]
        cols[i], signs[i] = perm[int(k) % n], s[int(k) % n]
    rows = torch.arange(m, dtype=torch.int64)
    h = 1 - 2 * _parity(rows[None, :] & cols[:, None])  # (P, m): H[i, col_k]
    z = (h * d[None, :] * signs[:, None]).to(torch.float32)
    return z.view(len(ks), *shape)


def match_params(names: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """The names (in the given order) matching any shell-style pattern (``"fc*"``, ``"*.bias"``).

    Raises ConfigError naming a pattern that matches nothing.
    """
    names = list(names)
    for p in patterns:
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            raise ConfigError(
                f"parameter pattern {p!r} matches no parameter; parameters: {', '.join(names)}; "
                "use shell-style patterns such as 'fc.*' or '*.bias'"
            )
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
