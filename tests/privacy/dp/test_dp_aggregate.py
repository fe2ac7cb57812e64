"""DPAggregator against plain means, hand-built noise and the accountant; resume from state."""

import math

import pytest
import torch

from fedge.core.rng import generator
from fedge.privacy.dp.accounting import epsilon, max_rounds
from fedge.privacy.dp.aggregate import DPAggregator, clip_contribution
from fedge.privacy.dp.config import PrivacyConfig
from fedge.privacy.dp.mechanisms import TreeAggregator, gaussian_like, global_norm

N, M, SEED = 12, 3, 4  # R = 4 rounds per pass


def _contribs(rnd, k=M):
    g = torch.Generator().manual_seed(100 + rnd)
    return [
        {"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)} for _ in range(k)
    ]


def _plain_mean(cs):
    """FedAvg's uniform mean, as methods/fedavg.py forms it: a·w, then add_(a, alpha=w)."""
    w = 1.0 / len(cs)
    out = {k: v * w for k, v in cs[0].items()}
    for c in cs[1:]:
        for k in out:
            out[k].add_(c[k], alpha=w)
    return out


@pytest.mark.parametrize("mechanism", ["gaussian", "tree"])
def test_no_noise_infinite_clip_is_exactly_the_plain_mean(mechanism):
    sampling = "shuffle" if mechanism == "tree" else "fixed"
    cfg = PrivacyConfig(mechanism=mechanism, sampling=sampling, clip=math.inf, noise_multiplier=0.0)
    agg = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    for rnd in range(1, 7):
        cs = [clip_contribution(c, cfg)[0] for c in _contribs(rnd)]
        mean, metrics = agg.aggregate(cs, rnd)
        expect = _plain_mean(_contribs(rnd))
        for k in expect:
            assert torch.equal(mean[k], expect[k])
            torch.testing.assert_close(mean[k], sum(c[k] for c in cs) / M)  # and the mean it is
        assert metrics["epsilon"] == math.inf


def test_gaussian_adds_sigma_clip_noise_from_the_round_generator():
    cfg = PrivacyConfig(mechanism="gaussian", clip=0.5, noise_multiplier=2.0)
    agg = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    cs = [clip_contribution(c, cfg)[0] for c in _contribs(1)]
    assert all(global_norm(c) <= 0.5 for c in cs)
    mean, metrics = agg.aggregate(cs, 1)
    total = {k: cs[0][k] + cs[1][k] + cs[2][k] for k in cs[0]}
    noise = gaussian_like(total, 1.0, generator(SEED, "dp-noise", 1))
    for k in total:
        torch.testing.assert_close(mean[k], (total[k] + noise[k]) / M)
    assert metrics["epsilon"] == pytest.approx(
        epsilon(cfg, rounds=1, population=N, clients_per_round=M), rel=1e-12
    )


def test_tree_increments_sum_to_the_noisy_prefix_sum_and_restart_each_pass():
    """Σ_{s≤t} inc_s = (exact prefix sum + N_t)/m within a tree (FTRL: W_t = W_0 + η·S_t/m);
    round 5 starts pass 2, a fresh tree whose first node comes from round 5's generator."""
    cfg = PrivacyConfig(mechanism="tree", sampling="shuffle", clip=1.0, noise_multiplier=1.5)
    agg = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    oracle = TreeAggregator(1.5)
    acc = {k: torch.zeros_like(v) for k, v in _contribs(1)[0].items()}
    exact = {k: torch.zeros_like(v) for k, v in acc.items()}
    for rnd in range(1, 6):
        cs = [clip_contribution(c, cfg)[0] for c in _contribs(rnd)]
        inc, _ = agg.aggregate(cs, rnd)
        total = {k: sum(c[k] for c in cs) for k in cs[0]}
        if rnd == 5:
            oracle.reset()
            acc = {k: torch.zeros_like(v) for k, v in acc.items()}
            exact = {k: torch.zeros_like(v) for k, v in acc.items()}
        noise = oracle.step(total, generator(SEED, "dp-noise", rnd))
        acc = {k: acc[k] + inc[k] for k in acc}
        exact = {k: exact[k] + total[k] for k in exact}
        for k in acc:
            torch.testing.assert_close(acc[k], (exact[k] + noise[k]) / M, rtol=1e-5, atol=1e-5)


def test_tree_momentum_hand_computed():
    cfg = PrivacyConfig(
        mechanism="tree", sampling="shuffle", clip=math.inf, noise_multiplier=0.0, momentum=0.5
    )
    agg = DPAggregator(cfg, population=N, clients_per_round=1, seed=SEED)
    outs = [
        float(agg.aggregate([{"x": torch.tensor([g])}], r)[0]["x"])
        for r, g in enumerate([1.0, 2.0, 4.0], 1)
    ]
    assert outs == [1.0, 2.5, 5.25]  # u1 = 1, u2 = 0.5·1 + 2, u3 = 0.5·2.5 + 4


def test_tree_momentum_is_dp_ftrlm_on_the_noisy_prefix_sums_within_a_tree():
    """Oracle: Kairouz et al.'s DP-FTRLM, v_t = γ·v_{t−1} + S_t and W_t = W_0 − η·v_t, on the noisy
    prefix sums S_t of the same tree (the γ = 0 run's increments summed): the increments u_t summed
    give v_t. R = 4 rounds per pass, so the tree of rounds 1-4 never restarts here."""
    gamma = 0.9
    cfg = PrivacyConfig(mechanism="tree", sampling="shuffle", clip=1.0, noise_multiplier=1.0)
    plain = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    heavy = DPAggregator(
        cfg.model_copy(update={"momentum": gamma}), population=N, clients_per_round=M, seed=SEED
    )
    prefix = v = moved = None
    for rnd in range(1, 5):
        cs = [clip_contribution(c, cfg)[0] for c in _contribs(rnd)]
        inc, _ = plain.aggregate(cs, rnd)
        u, _ = heavy.aggregate(cs, rnd)
        prefix = inc if prefix is None else {k: prefix[k] + inc[k] for k in inc}  # S_t / m
        v = prefix if v is None else {k: gamma * v[k] + prefix[k] for k in prefix}
        moved = u if moved is None else {k: moved[k] + u[k] for k in u}  # (W_t − W_0) / η
        for k in v:
            torch.testing.assert_close(moved[k], v[k], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mechanism", ["gaussian", "tree"])
def test_state_dict_resume_gives_identical_rounds(mechanism):
    sampling = "shuffle" if mechanism == "tree" else "fixed"
    extra = {"momentum": 0.9} if mechanism == "tree" else {}
    cfg = PrivacyConfig(
        mechanism=mechanism, sampling=sampling, clip=1.0, noise_multiplier=1.0, **extra
    )
    straight = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    first = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    for rnd in range(1, 4):
        straight.aggregate(_contribs(rnd), rnd)
        first.aggregate(_contribs(rnd), rnd)
    resumed = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    resumed.load_state_dict(first.state_dict())
    for rnd in range(4, 7):
        a, _ = straight.aggregate(_contribs(rnd), rnd)
        b, _ = resumed.aggregate(_contribs(rnd), rnd)
        for k in a:
            assert torch.equal(a[k], b[k])


def test_secure_noise_is_not_reproducible():
    cfg = PrivacyConfig(mechanism="gaussian", clip=1.0, noise_multiplier=1.0, secure_noise=True)
    a, _ = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED).aggregate(
        _contribs(1), 1
    )
    b, _ = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED).aggregate(
        _contribs(1), 1
    )
    assert not torch.equal(a["w"], b["w"])


def _at_round(agg, rnd, skipped=()):
    """``agg`` as after round ``rnd`` was released, the rounds in ``skipped`` having released nothing."""
    agg.load_state_dict(
        {"round": rnd, "skipped": list(skipped), "tree": None, "prev_noise": None, "momentum": None}
    )
    return agg


def test_target_epsilon_counts_releases_and_rounds_go_forward():
    """The budget allows exactly T = max_rounds releases (the accountant's own bisection): not
    round T+1 after T releases, but round T+1 after a skipped round, which released nothing."""
    cfg = PrivacyConfig(
        mechanism="gaussian", sampling="poisson", clip=1.0, noise_multiplier=1.0, target_epsilon=3.0
    )
    kw = {"population": 1000, "clients_per_round": 10}
    t = max_rounds(cfg, 3.0, **kw)
    assert epsilon(cfg, rounds=t, **kw) <= 3.0 < epsilon(cfg, rounds=t + 1, **kw)
    agg = DPAggregator(cfg, seed=SEED, **kw)
    assert not _at_round(agg, t).allows(t + 1) and agg.epsilon(t) == epsilon(cfg, rounds=t, **kw)
    assert _at_round(agg, t - 1).allows(t + 1)  # round t skipped
    assert agg.epsilon(t + 1) == epsilon(cfg, rounds=t, **kw)
    assert _at_round(agg, t, skipped=[3]).allows(t + 1)
    with pytest.raises(ValueError, match=f"round {t} after round {t} was aggregated"):
        agg.aggregate(_contribs(t), t)


def test_empty_poisson_round_is_noise_alone():
    cfg = PrivacyConfig(mechanism="gaussian", sampling="poisson", clip=1.0, noise_multiplier=1.0)
    agg = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    with pytest.raises(ValueError, match="pass like="):
        agg.aggregate([], 1)
    like = _contribs(1)[0]
    mean, _ = agg.aggregate([], 1, like=like)
    noise = gaussian_like(like, 1.0, generator(SEED, "dp-noise", 1))
    for k in like:
        torch.testing.assert_close(mean[k], noise[k] / M)


# ---- skipped rounds (clients.min_replies): the engine restores the state and goes on -------------


def test_the_engines_restore_then_a_later_round_is_a_round_with_no_release():
    """The engine's path: aggregate(1), save, load (round 2 skipped), aggregate(3). The Gaussian
    release of round 3 is round 3's own (its generator); ε is that of 2 releases; the skip is
    kept in the state; a round number that goes back is refused."""
    cfg = PrivacyConfig(mechanism="gaussian", clip=1.0, noise_multiplier=1.0)
    agg = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    agg.aggregate(_contribs(1), 1)
    agg.load_state_dict(agg.state_dict())
    mean, metrics = agg.aggregate(_contribs(3), 3)
    total = {k: sum(c[k] for c in _contribs(3)) for k in mean}
    noise = gaussian_like(total, 1.0, generator(SEED, "dp-noise", 3))
    for k in total:
        torch.testing.assert_close(mean[k], (total[k] + noise[k]) / M)
    assert metrics["epsilon"] == epsilon(cfg, rounds=2, population=N, clients_per_round=M)
    assert agg.state_dict()["skipped"] == [2]
    with pytest.raises(ValueError, match="round 2 after round 3 was aggregated"):
        agg.aggregate(_contribs(2), 2)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_tree_after_a_skipped_round_is_the_tree_of_the_releases(momentum):
    """Round 2 skipped: round 3 is the tree's 2nd leaf. Oracle, by hand from the node noises:
    N_1 = ν_1 (level-0 node, round 1's generator), N_2 = ν_2 (level-1 node, round 3's), so
    inc_3 = (Σ c_3 + N_2 − N_1)/m, then u_3 = γ·u_1 + inc_3; round 4 is the 3rd leaf,
    N_3 = ν_2 + ν_3 (round 4's). ε is that of one pass, a tree of 3 leaves."""
    cfg = PrivacyConfig(
        mechanism="tree", sampling="shuffle", clip=10.0, noise_multiplier=1.5, momentum=momentum
    )
    agg = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    like = _contribs(1)[0]
    nu = {r: gaussian_like(like, 15.0, generator(SEED, "dp-noise", r)) for r in (1, 3, 4)}
    total = {r: {k: sum(c[k] for c in _contribs(r)) for k in like} for r in (1, 3, 4)}
    u1, _ = agg.aggregate(_contribs(1), 1)
    agg.load_state_dict(agg.state_dict())
    u3, _ = agg.aggregate(_contribs(3), 3)
    u4, metrics = agg.aggregate(_contribs(4), 4)
    for k in like:
        torch.testing.assert_close(u1[k], (total[1][k] + nu[1][k]) / M)
        inc3 = (total[3][k] + nu[3][k] - nu[1][k]) / M
        torch.testing.assert_close(u3[k], momentum * u1[k] + inc3, rtol=1e-5, atol=1e-5)
        inc4 = (total[4][k] + nu[4][k]) / M  # N_3 − N_2 = ν_3
        torch.testing.assert_close(u4[k], momentum * u3[k] + inc4, rtol=1e-5, atol=1e-5)
    assert metrics["epsilon"] == epsilon(cfg, rounds=3, population=N, clients_per_round=M)


def test_a_tree_restarts_at_a_skipped_boundary_round():
    """R = 4: round 5 starts pass 2. Skipped, round 6 must still start a fresh tree (pass 2's
    clients are not pass 1's), whose first node is round 6's; ε: 4 + 1 leaves in two passes."""
    cfg = PrivacyConfig(mechanism="tree", sampling="shuffle", clip=10.0, noise_multiplier=1.5)
    agg = DPAggregator(cfg, population=N, clients_per_round=M, seed=SEED)
    for rnd in range(1, 5):
        agg.aggregate(_contribs(rnd), rnd)
    inc, metrics = agg.aggregate(_contribs(6), 6)
    nu = gaussian_like(inc, 15.0, generator(SEED, "dp-noise", 6))
    for k in inc:
        torch.testing.assert_close(inc[k], (sum(c[k] for c in _contribs(6)) + nu[k]) / M)
    assert metrics["epsilon"] == epsilon(cfg, rounds=5, population=N, clients_per_round=M)
