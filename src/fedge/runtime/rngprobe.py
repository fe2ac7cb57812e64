"""Do two machines draw the same numbers from the same seed? A probe to compare them by.

Every party of a run draws from the run's seed and relies on the others drawing the same: each
Flower node computes its own clients' data partition (numpy generators), BAFFLE's server
regenerates the clients' perturbations, FedPT's clients the frozen weights, secure
aggregation's parties the same sparse mask graph, EPPFL's masks and PPFL's stage heads come
from the run seed on every party. On one machine that holds by construction; across machines
(Flower SuperNodes) it holds only where torch and numpy draw the same numbers, which other
builds need not do. If they do not, nothing fails: a node trains on another shard than the
partition the run records (shards may overlap), or the server rebuilds other perturbations than
the client ran, and the run is not the configured one, silently.

:func:`rng_probe` draws, from a fixed seed, through the very paths those use: a perturbation
direction (:func:`~fedge.estimators.perturbation.standard_normal_chunk`), a seeded model
initialisation (:func:`~fedge.models.initialization.reset_parameters`, what FedPT
regenerates), a permutation and uniforms of a derived torch generator
(:func:`~fedge.core.rng.generator`: batch orders, dropouts) and of a numpy one
(:func:`~fedge.core.rng.numpy_rng`: partitions, client sampling, the mask graph).
:func:`same_draws` compares two probes: equal up to float roundoff (rtol 1e-5), so two
instruction sets whose vectorized kernels round differently still agree, while another
generator or initialiser does not (its numbers are unrelated: they differ at the first digit).
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
