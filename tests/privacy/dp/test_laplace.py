"""The Laplace mechanism and its accounting (fedge.privacy.dp.laplace)."""

from __future__ import annotations

import dp_accounting
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from fedge.core.errors import ConfigError
from fedge.privacy.dp.laplace import LaplaceMechanism, clip_l1, laplace_epsilon, laplace_noise


def test_clip_l1_scales_only_rows_over_the_bound():
    v = torch.tensor([[3.0, -1.0], [0.5, 0.25]])  # L1 norms 4 and 0.75
    out = clip_l1(v, 2.0)
    assert torch.allclose(out, torch.tensor([[1.5, -0.5], [0.5, 0.25]]))


def test_noise_is_laplace_with_the_stated_scale():
    x = laplace_noise(
        (20000,), 3.0, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    assert stats.kstest(x.numpy(), "laplace", args=(0.0, 3.0)).pvalue > 1e-3


def test_secure_noise_is_laplace_from_the_os_and_never_repeats():
    from fedge.privacy.dp.mechanisms import SECURE

    x = laplace_noise((20000,), 3.0, generator=SECURE, dtype=torch.float64)
    assert (
        stats.kstest(x.numpy(), "laplace", args=(0.0, 3.0)).pvalue > 1e-6
    )  # not seeded: fails 1 run in 10^6
    assert not torch.equal(
        laplace_noise((8,), 1.0, generator=SECURE), laplace_noise((8,), 1.0, generator=SECURE)
    )
    assert laplace_noise((0, 3), 1.0, generator=SECURE).shape == (0, 3)


def test_mechanism_sensitivity_is_replace_one_and_release_is_clip_plus_noise():
    m = LaplaceMechanism(epsilon=2.0, clip=1.5)
    assert m.sensitivity == 3.0 and m.scale == 1.5
    v = torch.tensor([[10.0, 0.0, -10.0]])
    clipped, released = m.release(v, generator=torch.Generator().manual_seed(1))
    noise = laplace_noise((1, 3), 1.5, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(clipped, torch.tensor([[0.75, 0.0, -0.75]]))
    assert torch.equal(released, clipped + noise)


@pytest.mark.parametrize("eps,count,delta", [(1.0, 1, 1e-5), (5.0, 4, 1e-5), (0.5, 30, 1e-6)])
def test_epsilon_equals_dp_accounting_called_directly(eps, count, delta):
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1.0 / eps), count)
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(event)
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(event)
    got = laplace_epsilon(eps, count, delta)
    assert got == {
        "pure": count * eps,
        "rdp": rdp.get_epsilon(delta),
        "pld": pld.get_epsilon(delta),
    }
    assert (
        got["pld"] <= got["pure"] + 1e-6
    )  # composition never worse than basic (up to discretization)


@pytest.mark.parametrize("eps", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_epsilon_is_a_config_error(eps):
    with pytest.raises(ConfigError, match="epsilon"):
        LaplaceMechanism(epsilon=eps, clip=1.0)
    if eps <= 0:
        with pytest.raises(ConfigError):
            laplace_epsilon(eps, 1, 1e-5)
