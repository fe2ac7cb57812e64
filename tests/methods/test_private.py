"""Differential privacy wired into every summing method (the ``privacy:`` section), checked
against oracles: the non-private uniform mean (σ = 0, no clipping), the accountant, the clip."""

import json
import warnings

import dp_accounting as dpa
import pytest
import torch
from typer.testing import CliRunner

from fedge.cli.main import app
from fedge.core.config import load_config
from fedge.core.errors import ConfigError, PrivacyWarning
from fedge.core.rng import generator
from fedge.experiment.build import build_run
from fedge.experiment.run import run_experiment
from fedge.methods.private import DifferentialPrivacy
from fedge.privacy.dp.accounting import epsilon
from fedge.privacy.dp.config import PrivacyConfig
from fedge.privacy.dp.mechanisms import TreeAggregator, gaussian_like


def _cfg(tiny, privacy=None, **over):
    base = {"method.weighting": "uniform", "clients.num": 6, "clients.per_round": 3, "rounds": 3}
    base.update(over)
    return load_config(tiny(privacy=privacy or {"mechanism": "none"}, **base))


def _weights(sim):
    return {k: v.clone() for k, v in sim.strategy.model.state_dict().items()}


def test_no_noise_and_no_clip_is_the_plain_uniform_mean(tiny):
    plain = build_run(_cfg(tiny)).simulation()
    private = build_run(
        _cfg(tiny, {"mechanism": "gaussian", "noise_multiplier": 0.0, "clip": float("inf")})
    ).simulation()
    for r in (1, 2):
        plain.run_round(r)
        line = private.run_round(r)
    assert line["epsilon"] == float("inf")
    assert all(
        torch.equal(a, b) for a, b in zip(_weights(plain).values(), _weights(private).values())
    )


def test_epsilon_each_round_is_the_accountants(tiny, tmp_path):
    priv = {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0}
    run = run_experiment(_cfg(tiny, priv), out=tmp_path / "r", render=False)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    cfg = PrivacyConfig(**priv)
    for line in lines:
        want = epsilon(cfg, rounds=line["round"], population=6, clients_per_round=3)
        assert line["epsilon"] == pytest.approx(want, rel=1e-12)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epsilon"] == lines[-1]["epsilon"] and summary["delta"] == 1e-6


def test_what_reaches_the_server_is_clipped(tiny):
    built = build_run(_cfg(tiny, {"mechanism": "gaussian", "noise_multiplier": 0.5, "clip": 0.01}))
    seen = []
    dp = built.method.strategy
    while not isinstance(dp, DifferentialPrivacy):
        dp = dp.inner
    original = dp.aggregate_round

    def spy(rnd, replies):
        seen.extend(
            float(torch.cat([a.flatten() for a in r.arrays.values()]).norm())
            for r in replies.values()
        )
        return original(rnd, replies)

    dp.aggregate_round = spy
    built.simulation().run_round(1)
    assert len(seen) == 3 and max(seen) <= 0.01 * (1 + 1e-6)


def test_dp_under_secure_aggregation_matches_dp_alone_without_noise(tiny):
    priv = {"mechanism": "gaussian", "noise_multiplier": 0.0, "clip": 0.05}
    alone = build_run(_cfg(tiny, priv)).simulation()
    both = build_run(_cfg(tiny, priv, **{"method.secure_aggregation": True})).simulation()
    alone.run_round(1)
    line = both.run_round(1)
    assert line["phases"] == 4
    for a, b in zip(_weights(alone).values(), _weights(both).values()):
        assert float((a - b).abs().max()) < 1e-6


def test_baffle_batch_clips_its_k_loss_differences(tiny):
    priv = {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1e-4}
    cfg = _cfg(
        tiny,
        priv,
        method={"name": "baffle", "mode": "batch", "k": 8, "batch_size": 16, "ema": None},
    )
    line = build_run(cfg).simulation().run_round(1)
    assert line["epsilon"] > 0 and line["phases"] == 4  # secure aggregation stays on by default


def test_target_epsilon_stops_the_run_and_says_so(tiny, tmp_path):
    priv = {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0, "target_epsilon": 15.0}
    run = run_experiment(_cfg(tiny, priv, rounds=10), out=tmp_path / "r", render=False)
    summary = json.loads((run / "summary.json").read_text())
    assert "target_epsilon=15.0 reached" in summary["stopped"] and summary["rounds"] < 10
    assert summary["epsilon"] <= 15.0


def _dp(strategy):
    while not isinstance(strategy, DifferentialPrivacy):
        strategy = strategy.inner
    return strategy.dp


def _dp_accounting(mechanism, z, releases):
    """ε from dp-accounting on the run's event for ``releases`` releases: 12 clients, 3 a round,
    δ = 1e-6; ``fixed`` sampling (Wang et al. Thm. 27, replace-one: z/2), or one shuffled pass
    (4 rounds) that is one tree of ``releases`` leaves (Kairouz et al. App. D)."""
    if mechanism == "gaussian":
        event = dpa.SelfComposedDpEvent(
            dpa.SampledWithoutReplacementDpEvent(12, 3, dpa.GaussianDpEvent(z / 2)), releases
        )
        relation = dpa.privacy_accountant.NeighboringRelation.REPLACE_ONE
    else:
        event = dpa.SingleEpochTreeAggregationDpEvent(z, releases)
        relation = dpa.privacy_accountant.NeighboringRelation.REPLACE_SPECIAL
    accountant = dpa.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(event)
    return accountant.get_epsilon(1e-6)


@pytest.mark.parametrize(
    "mechanism, sampling, seed, skipped", [("gaussian", "fixed", 1, 3), ("tree", "shuffle", 2, 2)]
)
def test_a_skipped_round_releases_nothing_and_the_run_goes_on(
    tiny, mechanism, sampling, seed, skipped
):
    """clients.dropout 0.2 with clients.min_replies = clients.per_round skips round ``skipped``
    (the seeded draws); the rounds after it run. Oracles: each released round's ε is
    dp-accounting's for the releases so far, and each release is, by hand, the clipped sum plus
    the noise of its own round's generator: Gaussian, or the tree of the releases alone
    (N_j − N_{j−1} of a TreeAggregator stepped once per release), over m = 3."""
    z, clip = 1.0, 1.0
    priv = {"mechanism": mechanism, "sampling": sampling, "noise_multiplier": z, "clip": clip}
    over = {
        "clients.num": 12,
        "clients.per_round": 3,
        "rounds": 4,
        "seed": seed,
        "clients.dropout": 0.2,
        "clients.min_replies": 3,
    }
    sim = build_run(_cfg(tiny, priv, **over)).simulation()
    dp = _dp(sim.strategy)
    calls = []
    aggregate = dp.aggregate

    def spy(contributions, rnd, **kw):
        mean, metrics = aggregate(contributions, rnd, **kw)
        calls.append((rnd, [{k: v.clone() for k, v in c.items()} for c in contributions], mean))
        return mean, metrics

    dp.aggregate = spy
    lines = [sim.run_round(r) for r in range(1, 5)]
    assert [r for r, x in enumerate(lines, 1) if x.get("round_skipped")] == [skipped]
    assert [rnd for rnd, _, _ in calls] == [r for r in range(1, 5) if r != skipped]
    released = [x["epsilon"] for x in lines if not x.get("round_skipped")]
    assert released == pytest.approx(
        [_dp_accounting(mechanism, z, j) for j in (1, 2, 3)], rel=1e-12
    )
    tree, prev = TreeAggregator(z * clip), None
    for rnd, contributions, mean in calls:
        total = {k: sum(c[k] for c in contributions) for k in mean}
        source = generator(seed, "dp-noise", rnd)
        if mechanism == "gaussian":
            noise = gaussian_like(total, z * clip, source)
        else:
            n = tree.step(total, source)
            noise = n if prev is None else {k: n[k] - prev[k] for k in n}
            prev = n
        for k in mean:
            torch.testing.assert_close(mean[k], (total[k] + noise[k]) / 3, rtol=1e-5, atol=1e-6)


def test_poisson_sampling_with_min_replies_warns(tiny):
    priv = {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0, "sampling": "poisson"}
    with pytest.warns(PrivacyWarning, match="privacy.sampling=poisson with clients.min_replies=2"):
        build_run(_cfg(tiny, priv, **{"clients.min_replies": 2}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        build_run(_cfg(tiny, {**priv, "sampling": "fixed"}, **{"clients.min_replies": 2}))


def test_poisson_sampling_draws_a_varying_number_of_clients(tiny):
    priv = {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0, "sampling": "poisson"}
    sim = build_run(_cfg(tiny, priv, **{"clients.num": 6, "clients.per_round": 3})).simulation()
    counts = {len(sim.sample(r)) for r in range(1, 30)}
    assert len(counts) > 2


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_secure_noise_draws_the_clients_the_seed_does_not_fix(tiny, sampling):
    """Amplification by subsampling assumes a secret sample: seeded without secure_noise (two
    builds agree round by round), from the OS CSPRNG with it (two builds disagree)."""

    def samples(secure):
        priv = {
            "mechanism": "gaussian",
            "noise_multiplier": 1.0,
            "clip": 1.0,
            "sampling": sampling,
            "secure_noise": secure,
        }
        sim = build_run(
            _cfg(tiny, priv, **{"clients.num": 40, "clients.per_round": 5})
        ).simulation()
        return [sim.sample(r) for r in range(1, 11)]

    assert samples(False) == samples(False)
    a, b = samples(True), samples(True)
    assert a != b
    if sampling == "fixed":
        assert all(len(s) == 5 and len(set(s)) == 5 and set(s) <= set(range(40)) for s in a + b)


def _ntk_epoch(tiny, privacy):
    method = {
        "name": "ntk-baffle",
        "mode": "epoch",
        "k": 8,
        "batch_size": 16,
        "max_steps": 2,
        "density": 0.2,
        "prune_rounds": 3,
        "prune_inputs": 8,
    }
    return load_config(
        tiny(
            model={"name": "mlp", "hidden": [32]},
            method=method,
            privacy=privacy,
            **{"clients.num": 4, "clients.per_round": 4},
        )
    )


def test_dp_on_a_pruned_model_clips_and_noises_its_kept_coordinates(tiny):
    """Epoch-level NTK-BAFFLE under DP: a contribution is what its client sends, the kept
    coordinates of the pruned tensors (and the dense rest). With σ = 0 and no clip the model is
    the plain run's (equal client sizes: the uniform mean is the sample-weighted one); with noise
    the kept weights move and the pruned ones stay exactly zero."""
    plain = build_run(_ntk_epoch(tiny, {"mechanism": "none"}))
    assert len({len(p) for p in plain.parts}) == 1
    sims = [plain.simulation()] + [
        build_run(
            _ntk_epoch(tiny, {"mechanism": "gaussian", "noise_multiplier": sigma, "clip": clip})
        ).simulation()
        for sigma, clip in ((0.0, float("inf")), (1.0, 0.5))
    ]
    for sim in sims:
        sim.run_round(1)
    oracle, exact, noisy = (_weights(sim) for sim in sims)
    masks = sims[0].strategy.global_model.masks
    assert masks and all(torch.equal(oracle[k], exact[k]) for k in oracle)
    for k, m in masks.items():
        assert not noisy[k][~m].any() and not torch.allclose(noisy[k][m], oracle[k][m]), k


def test_a_method_that_cannot_take_dp_is_refused(tiny):
    cfg = load_config(
        tiny(
            privacy={"mechanism": "gaussian", "noise_multiplier": 1.0},
            method={"name": "baffle", "mode": "batch", "shared_perturbations": False, "k": 4},
        )
    )
    with pytest.raises(ConfigError, match="privacy|shared"):
        build_run(cfg)


@pytest.mark.parametrize(
    "bad",
    [
        "privacy.noise_multiplier=-1",
        "privacy.clip=0",
        "privacy.delta=1",
        "privacy.mechanism=laplace",
    ],
)
def test_bad_privacy_input_exits_2(tmp_path, bad):
    r = CliRunner().invoke(
        app,
        [
            "run",
            "quickstart",
            "--set",
            "privacy.mechanism=gaussian",
            "--set",
            bad,
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert r.exit_code == 2, r.output
    assert "privacy." in r.output and not (tmp_path / "x").exists()
