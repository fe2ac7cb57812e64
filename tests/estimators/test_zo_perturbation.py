"""Seeded perturbations: deterministic, order-free, identical across processes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.estimators import perturbation
from fedge.estimators.perturbation import select, standard_normal, standard_normal_chunk

SHAPES = {"0.weight": (6, 1, 5, 5), "0.bias": (6,), "3.weight": (10, 24)}


def _digest(seed: int, ks: range) -> str:
    h = hashlib.sha256()
    for k in ks:
        for name, shape in SHAPES.items():
            h.update(standard_normal(seed, k, name, shape).numpy().tobytes())
    return h.hexdigest()


def test_same_seed_same_draw_and_different_keys_differ() -> None:
    a = standard_normal(7, 3, "0.weight", (6, 1, 5, 5))
    assert torch.equal(a, standard_normal(7, 3, "0.weight", (6, 1, 5, 5)))
    assert a.dtype == torch.float32
    for other in [
        standard_normal(8, 3, "0.weight", (6, 1, 5, 5)),
        standard_normal(7, 4, "0.weight", (6, 1, 5, 5)),
        standard_normal(7, 3, "3.weight", (6, 1, 5, 5)),
    ]:
        assert not torch.equal(a, other)


def test_chunk_equals_singles_bit_for_bit() -> None:
    ks = [5, 0, 9]  # any order: one generator per (k, parameter)
    chunk = standard_normal_chunk(1, ks, "3.weight", (10, 24))
    for i, k in enumerate(ks):
        assert torch.equal(chunk[i], standard_normal(1, k, "3.weight", (10, 24)))


def test_perturbation_scales_and_masks() -> None:
    mask = torch.rand(6, 1, 5, 5, generator=torch.Generator().manual_seed(0)) > 0.5
    d = perturbation(2, 1, "0.weight", (6, 1, 5, 5), sigma=1e-3, mask=mask)
    z = standard_normal(2, 1, "0.weight", (6, 1, 5, 5))
    assert torch.equal(d[mask], z[mask] * 1e-3)
    assert bool((d[~mask] == 0).all())


def test_bit_identical_in_a_fresh_process() -> None:
    code = (
        "import hashlib, torch\n"
        "from fedge.estimators.perturbation import standard_normal\n"
        f"S = {SHAPES!r}\n"
        "h = hashlib.sha256()\n"
        "for k in range(4):\n"
        "    for n, s in S.items():\n"
        "        h.update(standard_normal(123, k, n, s).numpy().tobytes())\n"
        "print(h.hexdigest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == _digest(123, range(4))


def test_portable_kernel_agrees_to_float_noise(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # CPUs without AVX2 use libm for Box-Muller: same uniforms, z within a few 1e-6
    # (module docstring of fedge.estimators.perturbation).
    out = tmp_path / "z.pt"
    code = (
        "import torch\n"
        "from fedge.estimators.perturbation import standard_normal\n"
        f"torch.save(standard_normal(9, 2, '3.weight', (10, 24)), {str(out)!r})\n"
    )
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
    torch.testing.assert_close(
        torch.load(out), standard_normal(9, 2, "3.weight", (10, 24)), rtol=0, atol=1e-5
    )


def _model() -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    m[2].bias.requires_grad_(False)
    return m


def test_select_defaults_to_trainable_parameters_only() -> None:
    sel = select(_model())
    assert list(sel.params) == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight"]
    assert sel.numel == 12 + 4 + 4 + 4 + 8


def test_select_counts_masked_coordinates() -> None:
    mask = torch.zeros(4, 3, dtype=torch.bool)
    mask[0] = True
    sel = select(_model(), ["0.weight", "2.bias"], {"0.weight": mask})
    assert list(sel.params) == ["0.weight", "2.bias"] and sel.numel == 3 + 2


@pytest.mark.parametrize(
    ("params", "masks", "error", "match"),
    [
        (["nope"], None, UnknownNameError, "unknown parameter 'nope'"),
        (["0.weight", "0.weight"], None, ConfigError, "more than once"),
        ([], None, ConfigError, "params is empty"),
        ("0.weight", None, ConfigError, "list of names"),
        (["0.bias"], {"0.weight": torch.ones(4, 3, dtype=torch.bool)}, ConfigError, "not a sel"),
        (None, {"0.weight": torch.ones(4, 3)}, ConfigError, "torch.bool"),
        (None, {"0.weight": torch.ones(3, 4, dtype=torch.bool)}, ConfigError, r"shape \(3, 4\)"),
    ],
)
def test_select_rejects_bad_selections(params, masks, error, match) -> None:
    with pytest.raises(error, match=match):
        select(_model(), params, masks)
