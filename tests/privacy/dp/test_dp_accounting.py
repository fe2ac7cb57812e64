"""ε against dp-accounting called directly on the same event, and the FedPT Table 5 row."""

import math

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedge.core.errors import ConfigError
from fedge.privacy.dp.accounting import dp_event, epsilon, max_rounds, tree_depth, tree_steps
from fedge.privacy.dp.config import PrivacyConfig

Rel = dpa.privacy_accountant.NeighboringRelation


def _rdp(event, relation, delta):
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    acc.compose(event)
    return acc.get_epsilon(delta)


def _pld(event, relation, delta):
    acc = pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)
    acc.compose(event)
    return acc.get_epsilon(delta)


# FedPT (seed 002) Sec. 4.2 / Table 5, the DP-FTRL setting of Kairouz et al. 2021 for Stack
# Overflow: 342,477 clients, 100 per round, T = 1600 rounds, δ = 1e-6. 1600·100 = 160,000 <
# 342,477, so the run is less than one pass: a single tree of 1600 steps, no client twice.
TABLE5 = [(1.13, 18.71), (2.33, 7.83), (4.03, 4.19), (6.21, 2.60), (8.83, 1.77)]


@pytest.mark.parametrize("z,paper", TABLE5)
def test_fedpt_table5_epsilon_row(z, paper):
    cfg = PrivacyConfig(mechanism="tree", sampling="shuffle", noise_multiplier=z, delta=1e-6)
    acc = dp_event(cfg, rounds=1600, population=342_477, clients_per_round=100)
    assert acc.event == dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(z, 1600), 1)
    eps = epsilon(cfg, rounds=1600, population=342_477, clients_per_round=100)
    assert round(eps, 2) == paper, eps


P, M = 1000, 10


@pytest.mark.parametrize(
    "cfg,direct",
    [
        (
            dict(mechanism="gaussian", sampling="poisson", noise_multiplier=1.1),
            lambda T: (
                dpa.SelfComposedDpEvent(
                    dpa.PoissonSampledDpEvent(M / P, dpa.GaussianDpEvent(1.1)), T
                ),
                Rel.ADD_OR_REMOVE_ONE,
                _rdp,
            ),
        ),
        (
            dict(mechanism="gaussian", sampling="poisson", noise_multiplier=1.1, accountant="pld"),
            lambda T: (
                dpa.SelfComposedDpEvent(
                    dpa.PoissonSampledDpEvent(M / P, dpa.GaussianDpEvent(1.1)), T
                ),
                Rel.ADD_OR_REMOVE_ONE,
                _pld,
            ),
        ),
        # replace-one: one client moves the clipped sum by up to 2·clip, so z/2 per unit sensitivity
        (
            dict(mechanism="gaussian", sampling="fixed", noise_multiplier=1.1),
            lambda T: (
                dpa.SelfComposedDpEvent(
                    dpa.SampledWithoutReplacementDpEvent(P, M, dpa.GaussianDpEvent(0.55)), T
                ),
                Rel.REPLACE_ONE,
                _rdp,
            ),
        ),
        # shuffle: 250 rounds = 3 passes begun (R = 100), one Gaussian per pass
        (
            dict(mechanism="gaussian", sampling="shuffle", noise_multiplier=1.1),
            lambda T: (
                dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.1), 3),
                Rel.REPLACE_SPECIAL,
                _rdp,
            ),
        ),
        # tree, 2 full passes of 100 steps and one of 50, trees restart each pass
        (
            dict(mechanism="tree", sampling="shuffle", noise_multiplier=3.0),
            lambda T: (
                dpa.ComposedDpEvent(
                    [
                        dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(3.0, 100), 2),
                        dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(3.0, 50), 1),
                    ]
                ),
                Rel.REPLACE_SPECIAL,
                _rdp,
            ),
        ),
        # tree restarting every 40 rounds within a pass: each pass is one epoch of trees [40, 40, 20]
        (
            dict(
                mechanism="tree", sampling="shuffle", noise_multiplier=3.0, tree_restart_rounds=40
            ),
            lambda T: (
                dpa.ComposedDpEvent(
                    [
                        dpa.SelfComposedDpEvent(
                            dpa.SingleEpochTreeAggregationDpEvent(3.0, [40, 40, 20]), 2
                        ),
                        dpa.SelfComposedDpEvent(
                            dpa.SingleEpochTreeAggregationDpEvent(3.0, [40, 10]), 1
                        ),
                    ]
                ),
                Rel.REPLACE_SPECIAL,
                _rdp,
            ),
        ),
        # PLD has no tree event: a single-epoch tree is the Gaussian with sensitivity √depth
        (
            dict(mechanism="tree", sampling="shuffle", noise_multiplier=3.0, accountant="pld"),
            lambda T: (
                dpa.ComposedDpEvent(
                    [dpa.GaussianDpEvent(3.0 / math.sqrt(7))] * 2
                    + [dpa.GaussianDpEvent(3.0 / math.sqrt(6))]
                ),
                Rel.REPLACE_SPECIAL,
                _pld,
            ),
        ),
    ],
)
def test_epsilon_equals_dp_accounting_directly(cfg, direct):
    T = 250
    config = PrivacyConfig(**cfg, delta=1e-5)
    event, relation, accountant = direct(T)
    expected = accountant(event, relation, 1e-5)
    got = epsilon(config, rounds=T, population=P, clients_per_round=M)
    assert got == pytest.approx(expected, rel=1e-6)
    assert 0 < got < math.inf


def test_tree_steps_and_depth_hand_computed():
    # R = ⌊11/2⌋ = 5 rounds per pass; restart every 2 → trees [2, 2, 1] per pass
    assert tree_steps(7, population=11, clients_per_round=2, restart_rounds=2) == [[2, 2, 1], [2]]
    assert tree_steps(7, population=11, clients_per_round=2, restart_rounds=None) == [[5], [2]]
    assert tree_steps(3, population=3, clients_per_round=3, restart_rounds=None) == [[1], [1], [1]]
    assert [tree_depth(s) for s in (1, 2, 3, 4, 7, 8, 1600)] == [1, 2, 2, 3, 3, 4, 11]


def test_every_client_every_round_tree_restarts_each_round():
    """m = N under shuffle: each round is a pass, each tree one leaf: T Gaussians, no amplification."""
    cfg = PrivacyConfig(mechanism="tree", sampling="shuffle", noise_multiplier=2.0)
    got = epsilon(cfg, rounds=20, population=10, clients_per_round=10)
    assert got == pytest.approx(
        _rdp(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 20), Rel.ADD_OR_REMOVE_ONE, 1e-6),
        rel=1e-6,
    )


def test_degenerate_cases():
    kw = dict(population=100, clients_per_round=10)
    assert (
        epsilon(PrivacyConfig(mechanism="gaussian", noise_multiplier=0.0), rounds=5, **kw)
        == math.inf
    )
    assert epsilon(PrivacyConfig(mechanism="gaussian", noise_multiplier=1.0), rounds=0, **kw) == 0.0
    e = [
        epsilon(PrivacyConfig(mechanism="gaussian", noise_multiplier=1.0), rounds=t, **kw)
        for t in (1, 10, 100)
    ]
    assert e[0] < e[1] < e[2]


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(population=0, clients_per_round=1), "population must be an int >= 1"),
        (
            dict(population=10, clients_per_round=11),
            "clients per round must be an int in [1, population=10]",
        ),
        (dict(population=10, clients_per_round=0), "got 0"),
    ],
)
def test_bad_population(kw, needle):
    with pytest.raises(ConfigError) as exc:
        epsilon(PrivacyConfig(mechanism="gaussian", noise_multiplier=1.0), rounds=5, **kw)
    assert needle in str(exc.value)


def test_mechanism_none_has_no_event():
    with pytest.raises(ConfigError, match="mechanism=gaussian or tree"):
        epsilon(PrivacyConfig(), rounds=5, population=10, clients_per_round=1)


def test_max_rounds_brackets_the_target():
    cfg = PrivacyConfig(mechanism="gaussian", sampling="poisson", noise_multiplier=1.0)
    kw = dict(population=1000, clients_per_round=10)
    t = max_rounds(cfg, 2.0, **kw)
    assert epsilon(cfg, rounds=t, **kw) <= 2.0 < epsilon(cfg, rounds=t + 1, **kw)


def test_skipped_rounds_are_no_releases():
    """Oracle: dp-accounting on the events of the released rounds alone. R = 5 rounds a pass."""
    kw = {"population": 11, "clients_per_round": 2}
    assert tree_steps(7, **kw, restart_rounds=2, skipped=[3, 4]) == [[2, 1], [2]]
    assert tree_steps(7, **kw, restart_rounds=None, skipped=[6, 7]) == [[5]]
    assert tree_steps(7, **kw, restart_rounds=2, skipped=[9]) == [[2, 2, 1], [2]]  # past T: ignored
    fixed = PrivacyConfig(mechanism="gaussian", sampling="fixed", noise_multiplier=1.1)
    ev = dpa.SampledWithoutReplacementDpEvent(11, 2, dpa.GaussianDpEvent(0.55))
    assert epsilon(fixed, rounds=7, **kw, skipped=[2, 5]) == _rdp(
        dpa.SelfComposedDpEvent(ev, 5), Rel.REPLACE_ONE, 1e-6
    )
    # shuffle: round 6 is pass 2's only round; skipped, pass 2 released nothing
    shuffle = PrivacyConfig(mechanism="gaussian", sampling="shuffle", noise_multiplier=1.1)
    one_pass = _rdp(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.1), 1), Rel.REPLACE_SPECIAL, 1e-6)
    assert (
        epsilon(shuffle, rounds=6, **kw, skipped=[6]) == one_pass < epsilon(shuffle, rounds=6, **kw)
    )
    tree = PrivacyConfig(
        mechanism="tree", sampling="shuffle", noise_multiplier=1.1, tree_restart_rounds=2
    )
    want = dpa.ComposedDpEvent(
        [
            dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(1.1, [2, 1]), 1),
            dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(1.1, 2), 1),
        ]
    )
    assert epsilon(tree, rounds=7, **kw, skipped=[3, 4]) == _rdp(want, Rel.REPLACE_SPECIAL, 1e-6)
    assert epsilon(tree, rounds=3, **kw, skipped=[1, 2, 3]) == 0.0
