"""Do two machines draw the same numbers from the same seed? :func:`rng_probe` draws through the
paths every party relies on and :func:`same_draws` compares two probes: up to float roundoff for
``draws="torch"`` (torch's kernels round differently per CPU), exactly for ``"portable"``, whose
probe is a known answer (:data:`PORTABLE_PROBE_SHA256`). Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedge.core.rng import Draws, PortableGenerator, check_draws, generator, numpy_rng
from fedge.estimators.perturbation import normal_chunk
from fedge.models.initialization import portable_reset_parameters, reset_parameters

__all__ = ["PORTABLE_PROBE_SHA256", "probe_sha256", "rng_probe", "same_draws"]

_SEED = 20_26_11_29

#: sha256 of ``rng_probe("portable")`` as float64 little-endian bytes: the portable probe is the
#: same on every machine, so a machine that draws anything else has a broken fedge or numpy.
PORTABLE_PROBE_SHA256 = "831a06b8550b79157320992bc5801be357adb15aa5bd788776d33cde0ff8f78a"


def rng_probe(draws: Draws = "torch") -> list[float]:
    """144 numbers drawn from a fixed seed through fedge's seeded paths of ``draws`` (perturbation
    directions, model init, a generator's permutation and uniforms, a partition's generator);
    torch's global generator is left as it was."""
    normals = normal_chunk(draws)(_SEED, range(2), "fedge/rng-probe", (24,)).reshape(-1)
    with torch.random.fork_rng(
        devices=[]
    ):  # the modules' constructors draw from the global generator
        shell = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2))
    if check_draws(draws) == "portable":
        model = portable_reset_parameters(shell, _SEED)
        init = torch.cat([p.detach().reshape(-1) for p in model.parameters()])[:32]
        stream = PortableGenerator(_SEED, "fedge/rng-probe", "stream")
        perm = torch.from_numpy(stream.permutation(16)).to(torch.float32)
        uniform = stream.uniform((16,))
        part = PortableGenerator(_SEED, "fedge/rng-probe", "partition")
        rest = [float(v) for v in part.permutation(16)] + part.uniform((16,)).double().tolist()
        return torch.cat([normals, init, perm, uniform]).double().tolist() + rest
    model = reset_parameters(shell, generator(_SEED, "fedge/rng-probe", "init"))
    init = torch.cat([p.detach().reshape(-1) for p in model.parameters()])[:32]
    g = generator(_SEED, "fedge/rng-probe", "stream")
    perm, uniform = torch.randperm(16, generator=g).to(torch.float32), torch.rand(16, generator=g)
    rng = numpy_rng(_SEED, "fedge/rng-probe")
    numpy_draws = torch.from_numpy(np.concatenate([rng.permutation(16), rng.random(16)]))
    return (
        torch.cat([normals, init, perm, uniform]).double().tolist() + numpy_draws.double().tolist()
    )


def probe_sha256(probe: Sequence[float]) -> str:
    """sha256 of a probe's numbers as float64 little-endian bytes (see :data:`PORTABLE_PROBE_SHA256`)."""
    return hashlib.sha256(struct.pack(f"<{len(probe)}d", *probe)).hexdigest()


def same_draws(a: object, b: object, *, draws: Draws = "torch") -> bool:
    """Whether two probes of ``draws`` agree: up to float roundoff for ``"torch"``, exactly for
    ``"portable"``. A missing or malformed probe (a node with an older fedge, a reply that is
    not a list of numbers) agrees with nothing."""
    if not (_numbers(a) and _numbers(b)) or len(a) != len(b):  # type: ignore[arg-type]
        return False
    if check_draws(draws) == "portable":
        return [float(v) for v in a] == [float(v) for v in b]  # type: ignore[attr-defined]
    ta, tb = (torch.tensor(list(x), dtype=torch.float64) for x in (a, b))  # type: ignore[call-overload]
    return bool(torch.allclose(ta, tb, rtol=1e-5, atol=1e-6))


def _numbers(x: object) -> bool:
    return (
        isinstance(x, Sequence)
        and not isinstance(x, (str, bytes))
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
    )
