"""runtime.rngprobe: the probe draws through fedge's seeded paths and compares up to roundoff."""

from __future__ import annotations

import torch

from fedge.estimators.perturbation import standard_normal_chunk
from fedge.runtime import rngprobe
from fedge.runtime.rngprobe import rng_probe, same_draws


def test_the_probe_is_the_seeded_paths_draws_repeats_and_leaves_the_global_generator() -> None:
    before = torch.get_rng_state()
    p = rng_probe()
    assert torch.equal(torch.get_rng_state(), before)
    assert len(p) == 144 and p == rng_probe()
    want = (
        standard_normal_chunk(rngprobe._SEED, range(2), "fedge/rng-probe", (24,))
        .reshape(-1)
        .double()
    )
    assert torch.equal(torch.tensor(p[:48], dtype=torch.float64), want)
    assert (
        sorted(p[80:96]) == sorted(p[112:128]) == list(map(float, range(16)))
    )  # torch's and numpy's permutations


def test_same_draws_tolerates_roundoff_only() -> None:
    p = rng_probe()
    assert same_draws(p, [x * (1 + 1e-7) for x in p])  # another ISA's rounding
    assert not same_draws(p, [x + 1e-3 for x in p])  # another generator or initialiser
    assert not same_draws(p, p[:-1])
    for bad in (
        None,
        "probe",
        b"probe",
        [True] * len(p),
        [*p[:-1], "x"],
    ):  # an older fedge, a garbled reply
        assert not same_draws(p, bad)


def test_the_portable_probe_is_the_known_answer_on_every_cpu_kernel() -> None:
    """The portable probe is the committed known answer, in this process and under torch's
    non-vectorized CPU kernels (what a CPU without AVX2 runs), where torch's probe differs."""
    import json
    import os
    import subprocess
    import sys

    p = rng_probe("portable")
    assert len(p) == 144 and rngprobe.probe_sha256(p) == rngprobe.PORTABLE_PROBE_SHA256
    assert p != rng_probe("torch")
    code = (
        "import json; from fedge.runtime.rngprobe import rng_probe; "
        "print(json.dumps(rng_probe('portable')))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == p


def test_portable_probes_are_compared_exactly() -> None:
    p = rng_probe("portable")
    assert same_draws(p, list(p), draws="portable")
    assert not same_draws(p, [x * (1 + 1e-7) for x in p], draws="portable")  # roundoff refused
    assert same_draws(p, [x * (1 + 1e-7) for x in p])  # what torch's probe tolerates
    assert not same_draws(p, None, draws="portable")  # a node without the portable probe
