"""Do two machines draw the same numbers from the same seed? :func:`rng_probe` draws through the
paths every party relies on and :func:`same_draws` compares two probes. Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedge.core.rng import generator, numpy_rng
from fedge.estimators.perturbation import standard_normal_chunk
from fedge.models.initialization import reset_parameters

__all__ = ["rng_probe", "same_draws"]

_SEED = 20_26_11_29


def rng_probe() -> list[float]:
    """144 numbers drawn from a fixed seed through fedge's seeded paths (see the module);
    torch's global generator is left as it was."""
    normals = standard_normal_chunk(_SEED, range(2), "fedge/rng-probe", (24,)).reshape(-1)
    with torch.random.fork_rng(
        devices=[]
    ):  # the modules' constructors draw from the global generator
        shell = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2))
    model = reset_parameters(shell, generator(_SEED, "fedge/rng-probe", "init"))
    init = torch.cat([p.detach().reshape(-1) for p in model.parameters()])[:32]
    g = generator(_SEED, "fedge/rng-probe", "stream")
    perm, uniform = torch.randperm(16, generator=g).to(torch.float32), torch.rand(16, generator=g)
    rng = numpy_rng(_SEED, "fedge/rng-probe")
    numpy_draws = torch.from_numpy(np.concatenate([rng.permutation(16), rng.random(16)]))
    return (
        torch.cat([normals, init, perm, uniform]).double().tolist() + numpy_draws.double().tolist()
    )


def same_draws(a: object, b: object) -> bool:
    """Whether two probes agree (up to float roundoff); a missing or malformed probe (a node
    with an older fedge, a reply that is not a list of numbers) agrees with nothing."""
    if not (_numbers(a) and _numbers(b)) or len(a) != len(b):  # type: ignore[arg-type]
        return False
    ta, tb = (torch.tensor(list(x), dtype=torch.float64) for x in (a, b))  # type: ignore[call-overload]
    return bool(torch.allclose(ta, tb, rtol=1e-5, atol=1e-6))


def _numbers(x: object) -> bool:
    return (
        isinstance(x, Sequence)
        and not isinstance(x, (str, bytes))
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
    )
