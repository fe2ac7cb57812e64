"""DP mechanisms on client contributions: L2 clipping, Gaussian noise, tree aggregation and FTRL
(DP-FedAvg, McMahan et al. 2018, arXiv:1710.06963v3, Alg. 1; DP-FTRL, Kairouz et al. 2021,
arXiv:2103.00039v3, Alg. 1 and Sec. 4). Design notes: docs/decisions.md#differential-privacy.
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Final

import numpy as np
import torch
from torch import Tensor

from fedge.core.errors import NonFiniteError

__all__ = [
    "SECURE",
    "Contribution",
    "NoiseSource",
    "SecureNoise",
    "TreeAggregator",
    "add",
    "clip_l2",
    "ftrl_weights",
    "gaussian_like",
    "global_norm",
    "scale",
    "secure_uniform",
]

Contribution = dict[str, Tensor]


class SecureNoise:
    """Marker: draw from the OS CSPRNG (``secrets.token_bytes``) instead of a generator."""

    def __repr__(self) -> str:
        return "SECURE"


SECURE: Final = SecureNoise()
NoiseSource = torch.Generator | SecureNoise


def global_norm(c: Contribution) -> float:
    """‖c‖₂ over all tensors, computed in float64."""
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in c.values()))


def clip_l2(c: Contribution, clip: float) -> tuple[Contribution, float]:
    """Scale ``c`` to L2 norm at most ``clip`` (McMahan et al. Alg. 1, ``ClipFn``).

    Returns ``(clipped, pre-clip norm)``. A contribution already within the bound is returned
    unchanged (the same tensors), so ``clip = inf`` is exactly the identity. The scaled copy is
    checked in float64 and nudged down if float rounding left it a hair above ``clip``, so
    ``global_norm(clipped) <= clip`` always holds.
    """
    norm = global_norm(c)
    if not math.isfinite(norm):
        bad = [k for k, t in c.items() if not bool(torch.isfinite(t).all())]
        raise NonFiniteError(
            f"contribution has non-finite values in {bad}; a client sent NaN/inf, "
            "check its learning rate or drop it before clipping",
            cause=f"contribution has non-finite values in {bad}",
        )
    if norm <= clip:
        return c, norm
    factor = clip / norm
    while True:
        out = {k: (t.double() * factor).to(t.dtype) for k, t in c.items()}
        if global_norm(out) <= clip:
            return out, norm
        factor *= 1 - 2.0**-20


def scale(c: Contribution, s: float) -> Contribution:
    return {k: t * s for k, t in c.items()}


def add(a: Contribution, b: Contribution) -> Contribution:
    return {k: a[k] + b[k] for k in a}


def secure_uniform(n: int) -> np.ndarray:
    """``n`` uniforms on [0, 1) from the OS CSPRNG: 53-bit multiples of 2^-53 out of
    ``secrets.token_bytes`` (what every :data:`SECURE` draw starts from)."""
    raw = (
        np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64) if n else np.zeros(0, np.uint64)
    )
    return (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _secure_standard_normal(numel: int) -> np.ndarray:
    """N(0, 1) samples by Box–Muller from :func:`secure_uniform`."""
    pairs = (numel + 1) // 2
    u = secure_uniform(2 * pairs).reshape(2, pairs)
    u1, u2 = u[0] + 2.0**-53, u[1]  # u1 on (0, 1]: its log is finite
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])
    return z[:numel]


def gaussian_like(like: Contribution, std: float, source: NoiseSource) -> Contribution:
    """N(0, std²) noise with the shapes and dtypes of ``like``; tensors drawn in sorted key
    order so the draw is the same whatever the dict's insertion order."""
    if not math.isfinite(std) or std < 0:
        raise ValueError(f"noise std must be finite and >= 0, got {std}")
    out: Contribution = {}
    for k in sorted(like):
        t = like[k]
        if isinstance(source, SecureNoise):
            z = torch.from_numpy(_secure_standard_normal(t.numel()).reshape(t.shape))
            out[k] = (z * std).to(t.dtype)
        else:
            out[k] = torch.randn(t.shape, generator=source, dtype=t.dtype) * std
    return {k: out[k] for k in like}


class TreeAggregator:
    """Noise of the binary-tree ("tree aggregation") prefix sums of Kairouz et al. Alg. 1.

    Leaves are the per-round sums g_1, g_2, ...; every tree node gets its own N(0, σ²) noise
    (σ = z·clip). The noisy prefix sum S_t is the sum of the O(log t) nodes of the binary
    decomposition of [1, t], one per set bit of t. Going from t−1 to t completes exactly one
    node, at level ν(t) (the number of trailing zeros of t), covering leaves
    t−2^ν+1..t: its noise is drawn fresh and the lower levels leave the decomposition. So

        S_t = g_1 + ... + g_t + N_t,   N_t = Σ_{levels l with bit l of t set} noise(node_l).

    This class keeps only the noise part (the exact prefix sum is the caller's), which lets
    the FTRL increment S_t − S_{t−1} = g_t + (N_t − N_{t−1}) be formed without cancellation:
    with σ = 0 it is exactly g_t. ``state_dict``/``load_state_dict`` make a run resumable.
    """

    def __init__(self, std: float) -> None:
        if not math.isfinite(std) or std < 0:
            raise ValueError(f"tree noise std must be finite and >= 0, got {std}")
        self.std = std
        self.reset()

    def reset(self) -> None:
        """Restart the tree (Kairouz et al. Sec. 4, "tree restart"): no leaves, no nodes."""
        self.t = 0
        self.nodes: dict[int, Contribution] = {}  # level -> noise of the completed node there

    def step(self, like: Contribution, source: NoiseSource) -> Contribution:
        """Add leaf t+1 (only its shapes matter here); return N_{t+1}, the prefix noise."""
        self.t += 1
        level = (self.t & -self.t).bit_length() - 1  # trailing zeros of t
        for lower in range(level):
            self.nodes.pop(lower, None)
        self.nodes[level] = gaussian_like(like, self.std, source)
        return self.prefix_noise(like)

    def prefix_noise(self, like: Contribution) -> Contribution:
        """N_t: the summed noise of the nodes decomposing [1, t] (zeros before the first leaf)."""
        total = {k: torch.zeros_like(v) for k, v in like.items()}
        for level in sorted(self.nodes):
            total = add(total, self.nodes[level])
        return total

    def state_dict(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "std": self.std,
            "nodes": {lv: {k: v.clone() for k, v in n.items()} for lv, n in self.nodes.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if float(state["std"]) != self.std:
            raise ValueError(
                f"tree state has noise std {state['std']}, this tree {self.std}; resume with the same config"
            )
        self.t = int(state["t"])
        self.nodes = {
            int(lv): {k: v.clone() for k, v in n.items()} for lv, n in state["nodes"].items()
        }
        expected = {lv for lv in range(self.t.bit_length()) if self.t >> lv & 1}
        if set(self.nodes) != expected:
            raise ValueError(
                f"tree state at t={self.t} must hold nodes at levels {sorted(expected)}, got {sorted(self.nodes)}"
            )


def ftrl_weights(w0: Contribution, noisy_prefix_sum: Contribution, lr: float) -> Contribution:
    """DP-FTRL's server weights (Kairouz et al. Alg. 1 with the L2 regulariser centred at W_0):
    W_t = W_0 − η · S_t, S_t the noisy prefix sum of the (mean) gradients."""
    return {k: w0[k] - lr * noisy_prefix_sum[k] for k in w0}
