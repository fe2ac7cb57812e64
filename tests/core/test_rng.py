import subprocess
import sys

import torch

from fedge.core.rng import derive_seed, generator, numpy_rng


def test_same_path_same_draws_different_path_different():
    a = torch.randn(5, generator=generator(0, "client", 1, 2))
    b = torch.randn(5, generator=generator(0, "client", 1, 2))
    c = torch.randn(5, generator=generator(0, "client", 1, 3))
    d = torch.randn(5, generator=generator(1, "client", 1, 2))
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)


def test_no_global_rng_is_touched():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    torch.randn(3, generator=generator(0, "x"))
    numpy_rng(0, "y").random()
    assert torch.equal(before, torch.get_rng_state())


def test_seeds_are_stable_across_processes():
    code = "from fedge.core.rng import derive_seed; print(derive_seed(7, 'partition', 3))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert int(out) == derive_seed(7, "partition", 3)
    assert 0 <= derive_seed(7, "partition", 3) < 2**63


def test_path_parts_are_not_confused():
    assert derive_seed(0, "a", 12) != derive_seed(0, "a1", 2)
    assert derive_seed(0, 1, 23) != derive_seed(0, 12, 3)
