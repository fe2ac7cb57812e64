import subprocess
import sys

import numpy as np
import pytest
import torch

from fedge.core import portable
from fedge.core.errors import ConfigError
from fedge.core.rng import (
    PortableGenerator,
    check_draws,
    derive_seed,
    generator,
    make_generator,
    numpy_rng,
    rand,
    randn,
    seed_family,
)


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


@pytest.mark.parametrize(
    ("seed", "prefix", "rest"),
    [
        (0, (), (5,)),
        (7, ("activity", 2), (0,)),
        (-3, ("zo",), (12, "features.conv1.weight")),
        (2**40, ("it's", 'say "x"', 1), ("a, b)", -1)),
    ],
)
def test_seed_family_is_derive_seed_with_the_prefix_hashed_once(seed, prefix, rest):
    # Oracle: derive_seed on the whole path, for every width; and a generator reseeded from it
    # draws what a fresh one draws (what the estimators rely on to reuse one generator).
    for bits in (63, 32):
        assert seed_family(seed, *prefix, bits=bits)(*rest) == derive_seed(
            seed, *prefix, *rest, bits=bits
        )
    seeds, gen = seed_family(seed, *prefix), torch.Generator()
    torch.randn(3, generator=gen)  # a used generator: reseeding forgets it
    got = torch.randn(4, generator=gen.manual_seed(seeds(*rest)))
    assert torch.equal(got, torch.randn(4, generator=generator(seed, *prefix, *rest)))


def test_seed_family_needs_a_tail():
    with pytest.raises(TypeError, match="at least one"):
        seed_family(0, "zo")()


def test_portable_generator_gives_each_call_its_own_stream():
    # Oracle: call i of PortableGenerator(seed, *path) is the portable draw of key
    # (seed, *path, "seq", i), whatever the kind of the call.
    g = PortableGenerator(3, "prune", 1)
    a, b, c, d = (
        g.normal((2, 5)),
        g.uniform((7,)),
        g.permutation(9),
        g.permutation(np.arange(4) * 10),
    )
    key = [portable.stream_key(3, "prune", 1, "seq", i) for i in range(4)]
    assert torch.equal(a, portable.normal(key[0], (2, 5)))
    assert torch.equal(b, portable.uniform(key[1], (7,)))
    np.testing.assert_array_equal(c, portable.permutation(key[2], 9).numpy())
    np.testing.assert_array_equal(d, (portable.permutation(key[3], 4) * 10).numpy())
    assert g.calls == 4
    before = torch.get_rng_state()
    h = make_generator("portable", 3, "prune", 1)
    assert isinstance(h, PortableGenerator) and torch.equal(randn((2, 5), h), a)
    assert torch.equal(rand((7,), h), b)
    assert torch.equal(before, torch.get_rng_state())
    t = make_generator("torch", 3, "prune", 1)
    assert isinstance(t, torch.Generator)
    assert torch.equal(randn((2, 5), t), torch.randn(2, 5, generator=generator(3, "prune", 1)))


def test_draws_are_checked():
    assert check_draws("torch") == "torch" and check_draws("portable") == "portable"
    with pytest.raises(
        ConfigError, match="draws must be one of \\['torch', 'portable'\\], got 'cuda'"
    ):
        check_draws("cuda")
