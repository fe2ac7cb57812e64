"""Clipping, Gaussian noise and tree aggregation against plain sums and hand-computed cases."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.core.errors import DivergenceError, MessageError
from fedge.privacy.dp.mechanisms import (
    SECURE,
    TreeAggregator,
    clip_l2,
    ftrl_weights,
    gaussian_like,
    global_norm,
)

floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    a=st.lists(floats, min_size=1, max_size=20),
    b=st.lists(floats, min_size=1, max_size=7),
    clip=st.floats(min_value=1e-6, max_value=1e4),
)
def test_clipped_norm_at_most_clip_and_direction_kept(a, b, clip):
    c = {"w": torch.tensor(a, dtype=torch.float32), "b": torch.tensor(b, dtype=torch.float32)}
    clipped, norm = clip_l2(c, clip)
    assert global_norm(clipped) <= clip
    assert norm == pytest.approx(global_norm(c))
    if norm <= clip:
        assert all(clipped[k] is c[k] for k in c)  # unchanged, not a copy
    else:
        for k in c:  # same direction: clipped = c · clip/norm up to float32 rounding
            torch.testing.assert_close(
                clipped[k].double(), c[k].double() * (clip / norm), rtol=1e-5, atol=1e-30
            )


def test_clip_is_global_across_tensors():
    c = {"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}  # norm 5
    clipped, norm = clip_l2(c, 1.0)
    assert norm == 5.0
    torch.testing.assert_close(clipped["a"], torch.tensor([0.6]))
    torch.testing.assert_close(clipped["b"], torch.tensor([0.8]))


def test_clip_inf_is_identity_and_non_finite_is_refused():
    c = {"a": torch.tensor([1e30, -1e30])}
    out, _ = clip_l2(c, math.inf)
    assert out["a"] is c["a"]
    with pytest.raises(MessageError, match=r"non-finite values in \['a'\]") as info:
        clip_l2({"a": torch.tensor([1.0, float("nan")])}, 1.0)
    assert isinstance(info.value, DivergenceError)  # a divergence by type
    assert info.value.cause == "contribution has non-finite values in ['a']"


@pytest.mark.parametrize("source", ["generator", "secure"])
def test_noise_std_is_sigma_times_clip(source):
    z, clip = 1.3, 0.7
    like = {"w": torch.zeros(300, 400), "b": torch.zeros(17)}  # 120 017 coordinates
    src = torch.Generator().manual_seed(5) if source == "generator" else SECURE
    noise = gaussian_like(like, z * clip, src)
    flat = torch.cat([noise["w"].flatten(), noise["b"]]).double()
    assert flat.numel() >= 100_000
    assert float(flat.std()) == pytest.approx(z * clip, rel=0.05)
    assert abs(float(flat.mean())) < 0.01
    assert noise["w"].dtype == torch.float32 and noise["b"].shape == (17,)


def test_noise_reproducible_from_generator_not_from_secure():
    like = {"w": torch.zeros(64)}
    a = gaussian_like(like, 1.0, torch.Generator().manual_seed(3))
    b = gaussian_like(like, 1.0, torch.Generator().manual_seed(3))
    assert torch.equal(a["w"], b["w"])
    assert not torch.equal(
        gaussian_like(like, 1.0, SECURE)["w"], gaussian_like(like, 1.0, SECURE)["w"]
    )


def _leaf(v):
    return {"g": torch.tensor([float(v)], dtype=torch.float64)}


def test_tree_node_noise_and_prefix_sums_hand_computed():
    """Leaves g1..g7; node noise drawn in completion order z1..z7 (one node per step):
    step 1 completes [1] (level 0), 2: [1,2] (level 1), 3: [3] (0), 4: [1..4] (2),
    5: [5] (0), 6: [5,6] (1), 7: [7] (0). So the noisy prefix sums are
    S1=g1+z1, S2=g1+g2+z2, S3=..+z2+z3, S4=..+z4, S5=..+z4+z5, S6=..+z4+z6, S7=..+z4+z6+z7."""
    std = 2.0
    expect_z = (
        torch.randn(7, generator=torch.Generator().manual_seed(11), dtype=torch.float64) * std
    )
    z = [None] + expect_z.tolist()
    decomposition = {1: [1], 2: [2], 3: [2, 3], 4: [4], 5: [4, 5], 6: [4, 6], 7: [4, 6, 7]}
    gs = [0.5, -1.0, 2.0, 0.25, 3.0, -0.5, 1.5]
    tree, gen = TreeAggregator(std), torch.Generator().manual_seed(11)
    exact = 0.0
    for t, g in enumerate(gs, start=1):
        exact += g
        noise = tree.step(_leaf(g), gen)
        assert float(noise["g"]) == pytest.approx(sum(z[i] for i in decomposition[t]), abs=1e-12)
        assert len(tree.nodes) == bin(t).count("1")  # one node per set bit of t
        s = exact + float(noise["g"])
        assert s == pytest.approx(sum(gs[:t]) + sum(z[i] for i in decomposition[t]), abs=1e-12)


def test_tree_state_dict_resumes_identically():
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    a = TreeAggregator(1.0)
    for _ in range(5):
        a.step(_leaf(0), gen_a)
    b = TreeAggregator(1.0)
    for _ in range(5):
        b.step(_leaf(0), gen_b)
    state = b.state_dict()
    c = TreeAggregator(1.0)
    c.load_state_dict(state)
    for _ in range(4):
        assert torch.equal(a.step(_leaf(0), gen_a)["g"], c.step(_leaf(0), gen_b)["g"])
    with pytest.raises(ValueError, match="same config"):
        TreeAggregator(2.0).load_state_dict(state)


def test_tree_reset_restarts_from_no_nodes():
    tree = TreeAggregator(1.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        tree.step(_leaf(0), gen)
    tree.reset()
    assert tree.t == 0 and tree.nodes == {}
    torch.testing.assert_close(
        tree.prefix_noise(_leaf(0))["g"], torch.zeros(1, dtype=torch.float64)
    )


def test_ftrl_weights():
    w0 = {"w": torch.tensor([1.0, 2.0])}
    out = ftrl_weights(w0, {"w": torch.tensor([0.5, -1.0])}, lr=0.1)
    torch.testing.assert_close(out["w"], torch.tensor([0.95, 2.1]))
