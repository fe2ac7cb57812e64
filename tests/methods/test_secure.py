"""Secure aggregation as a wrapper for every summing method, checked against the plain
method (the oracle): same model up to the fixed-point step, in one process or several."""

import math

import pytest
import torch

from fedge.core import transforms as T
from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.build import build_run
from fedge.methods.fedavg import DeltaAveraging
from fedge.methods.secure import FIXED_POINT, SecureAggregation, SecureAggregationOptions
from tests_helpers import record_replies


def _run(tiny, rounds=2, workers=0, **method):
    base = {"name": "fedavg", "local_epochs": 1, "batch_size": 16, "client_optimizer": {"lr": 0.1}}
    if method.get("name") == "fedsgd":
        base = {}
    cfg = load_config(
        tiny(
            method={**base, **method},
            **{"clients.workers": workers, "clients.num": 4, "clients.per_round": 4},
        )
    )
    built = build_run(cfg)
    sim = built.simulation()
    lines = [sim.run_round(r) for r in range(1, rounds + 1)]
    sim.close()
    return sim, lines, built


@pytest.mark.parametrize(
    "name, weighting", [("fedavg", "samples"), ("fedavg", "uniform"), ("fedsgd", "samples")]
)
def test_secure_equals_plain_up_to_the_fixed_point_step(tiny, name, weighting):
    extra = {"name": name, "weighting": weighting}
    if name == "fedsgd":
        extra = {"name": "fedsgd", "weighting": weighting, "batch_size": 16}
    plain, _, built = _run(tiny, **extra)
    secure, lines, _ = _run(tiny, workers=2, secure_aggregation=True, **extra)
    assert lines[-1]["phases"] == 4 and lines[-1]["secagg_survivors"] == 4
    # Bound: the mean of C fixed-point values is exact to C·2^-(frac+1)/Σw; the plain float32
    # incremental mean adds its own rounding (~1e-7 relative). Server SGD moves weights by
    # lr·mean per round (lr = 1 for fedavg, 0.1 for fedsgd), over 2 rounds.
    sizes = [len(p) for p in built.parts]
    weight = sum(sizes) if weighting == "samples" else len(sizes)
    fixed = len(sizes) * 2.0 ** -(FIXED_POINT.frac_bits + 1) / weight
    for (k, a), b in zip(
        plain.strategy.model.state_dict().items(), secure.strategy.model.state_dict().values()
    ):
        bound = 2 * (fixed + 2e-7 * float(a.abs().max()) + 1e-7)
        assert float((a - b).abs().max()) <= bound, k
    assert "train_loss" not in lines[-1]  # per-client losses would leak around the masks


def test_secure_messages_never_carry_a_plain_reply(tiny):
    _, lines, _ = _run(tiny, rounds=1, secure_aggregation=True)
    plain_up = _run(tiny, rounds=1)[1][0]["bytes_up"]
    # each masked upload is the K + 1 ring elements (8 bytes each) plus the protocol's framing
    assert lines[0]["bytes_up"] > plain_up


def test_secure_aggregation_refuses_a_strategy_that_does_not_sum():
    class NotSumming(DeltaAveraging.__mro__[1]):  # a bare Strategy
        pass

    with pytest.raises(ConfigError, match="sums client replies"):
        SecureAggregation(NotSumming(), SecureAggregationOptions(secure_aggregation=True), seed=0)


def test_a_pruned_tensor_is_summed_as_its_kept_coordinates():
    """The masked vector of a pruned model: a pruned tensor's kept coordinates (3 of 6 weights)
    and the dense bias (2), plus the weight; and a kept-coordinates mean lands on them."""
    model = torch.nn.Linear(3, 2)
    masks = {"weight": torch.tensor([[True, False, True], [False, True, False]])}
    strategy = DeltaAveraging(model, T.sgd(1.0), replies_are_gradients=False, masks=masks)
    secure = SecureAggregation(strategy, SecureAggregationOptions(secure_aggregation=True), seed=0)
    assert secure.summands == {
        "bias": (torch.Size([2]), torch.float32),
        "weight": (torch.Size([3]), torch.float32),
    }
    assert secure.length == 3 + 2 + 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    strategy.apply_mean(
        1, {"weight": torch.tensor([1.0, 2.0, 3.0]), "bias": torch.tensor([0.5, -0.5])}
    )
    want = before["weight"] + torch.tensor(
        [[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]
    )  # SGD lr 1 on the pseudo-gradient -Δ
    assert torch.allclose(model.weight.detach(), want * masks["weight"]) and torch.allclose(
        model.bias.detach(), before["bias"] + torch.tensor([0.5, -0.5])
    )


def _ntk_epoch(tiny, **method):
    base = {
        "name": "ntk-baffle",
        "mode": "epoch",
        "k": 8,
        "batch_size": 16,
        "max_steps": 2,
        "density": 0.2,
        "prune_rounds": 3,
        "prune_inputs": 8,
        **method,
    }
    return load_config(
        tiny(
            model={"name": "mlp", "hidden": [32]},
            method=base,
            **{"clients.num": 4, "clients.per_round": 4},
        )
    )


def _secure_wrapper(strategy):
    while not isinstance(strategy, SecureAggregation):
        strategy = strategy.inner
    return strategy


@pytest.mark.parametrize("prune_data", ["random", "client"])
def test_a_pruned_model_is_aggregated_securely_to_the_plain_mean(tiny, prune_data):
    """Epoch-level NTK-BAFFLE (data-free pruning, or NTK-Ori's pruning rounds inside round 1, which
    change the masks under the wrapper): secure aggregation sums each client's kept coordinates;
    the model is the plain run's up to the fixed-point step, pruned weights stay exactly zero,
    and the masked vector is as long as the kept coordinates plus the dense tensors. One round:
    after it the clients start from models that differ in the last bits, which zeroth-order
    estimates (ΔL/σ, σ = 1e-4) amplify past the fixed-point bound."""
    extra = {"prune_data": prune_data, "prune_k": 6} if prune_data == "client" else {}
    plain = build_run(_ntk_epoch(tiny, **extra)).simulation()
    secure = build_run(_ntk_epoch(tiny, secure_aggregation=True, **extra)).simulation()
    plain.run_round(1)
    line = secure.run_round(1)
    assert line["secagg_survivors"] == 4
    masks = plain.strategy.global_model.masks
    assert masks and all(
        torch.equal(masks[k], secure.strategy.global_model.masks[k]) for k in masks
    )
    state = secure.strategy.model.state_dict()
    assert (
        _secure_wrapper(secure.strategy).length
        == sum(int(masks[k].sum()) if k in masks else state[k].numel() for k in state) + 1
    )
    fixed = 4 * 2.0 ** -(
        FIXED_POINT.frac_bits + 1
    )  # the largest possible Σw is 4 clients' samples ≥ 4
    for k, a in plain.strategy.model.state_dict().items():
        assert float((a - state[k]).abs().max()) <= 2 * (
            fixed + 2e-7 * float(a.abs().max()) + 1e-7
        ), k
        if k in masks:
            assert not state[k][~masks[k]].any(), k


def test_dropout_option_needs_secure_aggregation():
    with pytest.raises(ValueError, match="secure_aggregation=true"):
        SecureAggregationOptions(secagg_dropout=0.2)
    assert math.isclose(
        SecureAggregationOptions(secure_aggregation=True, secagg_dropout=0.2).secagg_dropout, 0.2
    )


def test_real_dropouts_at_every_step_are_recovered_to_the_survivors_plain_mean(tiny):
    """clients.dropout loses replies at any of the four exchanges; the unmasked mean is the plain
    FedAvg mean over exactly the clients whose masked inputs arrived (the oracle: a plain run
    whose round samples just those), up to the fixed-point step."""
    over = {
        "clients.num": 10,
        "clients.per_round": 10,
        "clients.dropout": 0.12,
        "clients.min_replies": 4,
        "seed": 30,
    }
    method = {
        "name": "fedavg",
        "local_epochs": 1,
        "batch_size": 16,
        "client_optimizer": {"lr": 0.1},
    }
    built = build_run(load_config(tiny(method={**method, "secure_aggregation": True}, **over)))
    sim = built.simulation()
    recorded = record_replies(sim)
    line = sim.run_round(1)
    got = {phase: ids for (_, phase), ids in recorded.items()}
    survivors = got[
        2
    ]  # U3: their masked inputs are in the sum (this seed loses one client at each step)
    assert [
        10 - len(got[0]),
        len(got[0]) - len(got[1]),
        len(got[1]) - len(survivors),
        len(survivors) - len(got[3]),
    ] == [1, 1, 1, 1]
    assert line["secagg_survivors"] == len(survivors) and line["clients_failed"] == 10 - len(got[3])
    assert (
        sim.strategy.aggregated_clients() == sorted(survivors) != sorted(got[3])
    )  # a survivor lost at unmasking is in
    plain = build_run(load_config(tiny(method=method, **{**over, "clients.dropout": 0.0})))
    oracle = plain.simulation()
    oracle.sample = lambda rnd: survivors
    oracle.run_round(1)
    sizes = [len(plain.parts[c]) for c in survivors]
    fixed = len(sizes) * 2.0 ** -(FIXED_POINT.frac_bits + 1) / sum(sizes)
    for (k, a), b in zip(
        oracle.strategy.model.state_dict().items(), sim.strategy.model.state_dict().values()
    ):
        assert float((a - b).abs().max()) <= 2 * (fixed + 2e-7 * float(a.abs().max()) + 1e-7), k


def test_a_round_below_the_threshold_is_skipped_and_leaves_the_model_as_it_was(tiny):
    """At dropout 0.15 per exchange, 10 clients and t = 6, most secure rounds end with fewer than
    t masked inputs or shares (seed 2: rounds 1, 2 and 4): under clients.min_replies such a round
    is skipped (the model exactly as before it, the reason recorded) and the run goes on."""
    method = {
        "name": "fedavg",
        "local_epochs": 1,
        "batch_size": 16,
        "client_optimizer": {"lr": 0.1},
        "secure_aggregation": True,
    }
    over = {
        "clients.num": 10,
        "clients.per_round": 10,
        "clients.dropout": 0.15,
        "clients.min_replies": 2,
        "seed": 2,
    }
    sim = build_run(load_config(tiny(method=method, **over))).simulation()
    states = [{k: v.clone() for k, v in sim.strategy.model.state_dict().items()}]
    lines = []
    for r in range(1, 5):
        lines.append(sim.run_round(r))
        states.append({k: v.clone() for k, v in sim.strategy.model.state_dict().items()})
    assert [x.get("round_skipped", 0) for x in lines] == [1, 1, 0, 1]
    for r, line in enumerate(lines, start=1):
        same = all(torch.equal(states[r][k], states[r - 1][k]) for k in states[r])
        assert same == bool(line.get("round_skipped")), r
    assert lines[2]["secagg_survivors"] >= 6 and "secagg_survivors" not in lines[3]
    reasons = sim.record.extra["skipped_rounds"]
    assert sorted(reasons) == ["1", "2", "4"] and all(
        "threshold t=6" in why for why in reasons.values()
    )
