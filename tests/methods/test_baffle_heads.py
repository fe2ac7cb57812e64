"""Local heads for activity perturbation (fedge.methods.baffle.heads): blocks resolved from module
names with the mistakes refused, heads shaped and seeded, the server's step against the mean head
delta written out, the client stepping its heads by the estimate, and a run that trains, reruns
and resumes to the same numbers."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.estimators.activity import HEAD_PREFIX, activity_gradient, activity_layers
from fedge.experiment.build import build_run
from fedge.methods.baffle import BaffleConfig
from fedge.methods.baffle.heads import HeadAveraging, block_ends, build_heads
from fedge.methods.base import ServerOptimizerConfig
from fedge.models.registry import build_model


def _lenet():
    return build_model("lenet", input_shape=(1, 12, 12), num_classes=10, seed=0)


def _section(**extra):
    from tests_helpers import local_heads_section

    return local_heads_section(**{"head_pool": 2, **extra})


def test_blocks_end_at_the_named_modules_last_layer_and_mistakes_are_refused():
    model = _lenet()
    every = activity_layers(model)  # conv1 (0), conv2 (4), the classifier's linear (9)
    assert every == [0, 4, 9]
    assert block_ends(model, ["features.conv1"], every) == [3]  # conv, norm, act, pool
    assert block_ends(model, ["features.conv1.conv", "features.conv2"], every) == [0, 6]
    with pytest.raises(
        ConfigError, match="'features.conv9', which is not a module.*features.conv1"
    ):
        block_ends(model, ["features.conv9"], every)
    with pytest.raises(ConfigError, match="ends with the network's last layer"):
        block_ends(model, ["classifier"], every)
    with pytest.raises(ConfigError, match="already closed"):
        block_ends(model, ["features.conv1", "features.conv1.pool"], every)
    with pytest.raises(ConfigError, match="holds no perturbed layer"):
        block_ends(model, ["features.conv1"], [9])  # only the classifier perturbed


def test_a_module_inside_a_layer_run_as_a_whole_closes_that_layers_block():
    class Block(torch.nn.Module):  # not a plain Sequential: run as one layer
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.ReLU()

        def forward(self, x):
            return self.inner(x)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Block(), torch.nn.Linear(4, 2))
    assert block_ends(model, ["1.inner"], [0, 2]) == [1]


def test_heads_pool_then_classify_and_are_seeded():
    model = _lenet()
    heads = build_heads(model, [3, 6], input_shape=(1, 12, 12), num_classes=10, pool=2, seed=4)
    assert list(heads) == ["3", "6"]
    assert heads["3"][-1].weight.shape == (10, 16 * 2 * 2)  # conv1's 16 channels, pooled to 2x2
    assert heads["6"][-1].weight.shape == (10, 64 * 2 * 2)
    again = build_heads(model, [3, 6], input_shape=(1, 12, 12), num_classes=10, pool=2, seed=4)
    other = build_heads(model, [3, 6], input_shape=(1, 12, 12), num_classes=10, pool=2, seed=5)
    portable = build_heads(
        model, [3], input_shape=(1, 12, 12), num_classes=10, pool=1, seed=4, draws="portable"
    )
    assert all(torch.equal(a, b) for a, b in zip(heads.parameters(), again.parameters()))
    assert not torch.equal(heads["3"][-1].weight, other["3"][-1].weight)
    assert portable["3"][-1].weight.shape == (10, 16)


def test_group_heads_hold_one_classifier_a_channel_group():
    model = _lenet()
    heads = build_heads(
        model, [3, 6], input_shape=(1, 12, 12), num_classes=10, pool=2, seed=4, groups=4
    )
    assert heads["3"][-1].weight.shape == (4 * 10, 16 * 2 * 2)  # 4 classifiers over 16 channels
    assert heads["6"][-1].weight.shape == (4 * 10, 64 * 2 * 2)
    with pytest.raises(ConfigError, match="head_groups=3 must divide.*outputs 16; choose"):
        build_heads(model, [3], input_shape=(1, 12, 12), num_classes=10, pool=2, seed=4, groups=3)
    with pytest.raises(ValueError, match="head_groups=2 .* local_heads is empty"):
        BaffleConfig(mode="epoch", estimator="activity", head_groups=2)


def test_patch_losses_need_global_pooling_and_sides_they_divide():
    model = _lenet()  # conv1's block outputs 16 x 6 x 6 on 12 x 12 inputs
    heads = build_heads(
        model, [3], input_shape=(1, 12, 12), num_classes=10, pool=1, seed=4, patches=3
    )
    assert heads["3"][-1].weight.shape == (10, 16)  # patches change the scoring, not the head
    with pytest.raises(ConfigError, match="head_patches=4 .* outputs \\(16, 6, 6\\); choose"):
        build_heads(model, [3], input_shape=(1, 12, 12), num_classes=10, pool=1, seed=4, patches=4)
    with pytest.raises(ValueError, match="head_patches=2 .* head_pool=1 \\(got 2\\)"):
        BaffleConfig(
            mode="epoch", estimator="activity", local_heads=["features.conv1"], head_pool=2,
            head_patches=2,
        )  # fmt: skip


def test_the_server_steps_the_heads_by_the_weighted_mean_delta():
    """FedAvg's server (SGD, lr 1) on two replies of 1 and 3 samples: model and heads each move by
    their sample-weighted mean delta; the heads travel in the broadcast and the checkpoint."""
    model = _lenet()
    heads = build_heads(model, [3], input_shape=(1, 12, 12), num_classes=10, pool=1, seed=0)
    sgd = ServerOptimizerConfig(name="sgd", lr=1.0)
    server = HeadAveraging(model, sgd.build(), heads, sgd.build())
    sent = server.configure_round(1, [0, 1])[0].arrays
    start = {k: v.clone() for k, v in sent.items()}
    assert {HEAD_PREFIX + "3.2.weight", HEAD_PREFIX + "3.2.bias"} <= set(sent)
    g = torch.Generator().manual_seed(0)
    replies = {
        cid: Message(
            {k: torch.randn(v.shape, generator=g) for k, v in start.items()},
            config={"num_samples": n},
        )
        for cid, n in ((0, 1), (1, 3))
    }
    server.aggregate_round(1, replies)
    now = server.configure_round(2, [0])[0].arrays
    for k in start:
        want = start[k] + 0.25 * replies[0].arrays[k] + 0.75 * replies[1].arrays[k]
        assert torch.allclose(now[k], want, atol=1e-6), k
    state = server.state_dict()
    fresh = HeadAveraging(
        _lenet(),
        sgd.build(),
        build_heads(model, [3], input_shape=(1, 12, 12), num_classes=10, pool=1, seed=9),
        sgd.build(),
    )
    fresh.load_state_dict(state)
    assert all(torch.equal(v, fresh.configure_round(2, [0])[0].arrays[k]) for k, v in now.items())


def test_the_client_steps_its_heads_by_their_estimate():
    """One local step of plain SGD: the client's upload is −lr times the clipped activity
    estimate, the heads' part included, on the batch and seed its generator draws, from the
    model and heads the server sent (an oracle that runs the same draws by hand)."""
    import copy

    from fedge.core.context import ClientData
    from fedge.core.meter import Meter
    from fedge.methods.baffle import activity_gradient_fn, clip_inf_norm
    from fedge.methods.local import ClientOptimizerConfig, LocalTraining

    section = {k: v for k, v in _section().items() if k != "ema"}
    cfg = BaffleConfig(**{**section, "client_optimizer": {"name": "sgd", "lr": 0.5}})
    model = _lenet()
    heads = build_heads(model, [3], input_shape=(1, 12, 12), num_classes=10, pool=2, seed=0)
    sgd = ServerOptimizerConfig(name="sgd", lr=1.0)
    message = HeadAveraging(_lenet(), sgd.build(), copy.deepcopy(heads), sgd.build())
    message = message.configure_round(1, [0])[0]
    g = torch.Generator().manual_seed(1)
    data = ClientData(torch.randn(20, 1, 12, 12, generator=g), torch.randint(0, 10, (20,), generator=g),
                      torch.arange(20))  # fmt: skip

    def ctx():
        return ClientContext(cid=0, rnd=1, data=data, generator=torch.Generator().manual_seed(5),
                             meter=Meter())  # fmt: skip

    client = LocalTraining(
        _lenet,
        local_epochs=1,
        batch_size=16,
        max_steps=1,
        optimizer=ClientOptimizerConfig(name="sgd", lr=0.5),
        gradient_fn=activity_gradient_fn(cfg, 1, heads=heads),
        companion=heads,
        companion_prefix=HEAD_PREFIX,
    )
    reply = client.run(message, ctx())
    # the oracle: the same batch and seed drawn from a fresh copy of the client's generator
    by_hand = ctx()
    batch = next(iter(data.batches(16, generator=by_hand.generator)))
    seed = int(torch.randint(0, 2**62, (1,), generator=by_hand.generator))
    want = clip_inf_norm(
        activity_gradient(_lenet(), batch, k=8, sigma=1e-3, scheme="forward", seed=seed,
                          heads=build_heads(model, [3], input_shape=(1, 12, 12), num_classes=10,
                                            pool=2, seed=0)),
        cfg.clip,
    )  # fmt: skip
    assert set(reply.arrays) == set(want)
    assert any(k.startswith(HEAD_PREFIX) for k in want)
    for k, v in want.items():
        assert torch.allclose(reply.arrays[k], -0.5 * v, atol=1e-7), k


def test_local_heads_need_the_activity_estimator():
    with pytest.raises(ValueError, match="local_heads=.*set method.estimator=activity"):
        BaffleConfig(mode="epoch", local_heads=["features.conv1"])


def test_a_run_with_local_heads_trains_reruns_and_resumes(tmp_path, tiny, monkeypatch):
    """BAFFLE's LeNet with a head closing conv1's block, persistent client Adam: the test loss
    falls, the downlink carries the heads, a rerun gives the same metrics and a run cut after
    round 2 resumes to them (heads and their optimizer state are checkpointed on both sides)."""
    from fedge.experiment.resume import resume_experiment
    from fedge.experiment.run import run_experiment
    from tests_helpers import metrics_without_wall, run_cut_after

    cfg = tiny(rounds=4, model={"name": "lenet"}, method=_section())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
        run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
        resume_experiment(tmp_path / "cut", render=False)
        plain = tiny(rounds=4, model={"name": "lenet"}, method=_section(local_heads=[]))
        headless = run_experiment(load_config(plain), out=tmp_path / "plain", render=False)
    lines = metrics_without_wall(full)
    rounds = [line for line in lines if "test_loss" in line]
    assert rounds[-1]["test_loss"] < rounds[0]["test_loss"]
    assert metrics_without_wall(tmp_path / "cut") == lines
    assert metrics_without_wall(headless) != lines
    down = [line["bytes_down"] for line in lines if "bytes_down" in line]
    down_plain = [
        line["bytes_down"] for line in metrics_without_wall(headless) if "bytes_down" in line
    ]
    assert down and all(a > b for a, b in zip(down, down_plain, strict=True))


def test_a_run_with_group_heads_trains_and_sends_every_classifier(tmp_path, tiny):
    """head_groups=4 (with 2x2 patch losses) on the same run: it trains, and each round's
    downlink carries the head's 4 classifiers (3 more 10 x 16 weights and 10 biases than one
    loss a head)."""
    from fedge.experiment.run import run_experiment
    from tests_helpers import metrics_without_wall

    runs, clients = {}, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for groups in (1, 4):  # the 4 groups with 2x2 patch losses too (no bytes of their own)
            extra = {"head_groups": groups, "head_pool": 1, "head_patches": 2 if groups > 1 else 1}
            cfg = tiny(rounds=3, model={"name": "lenet"}, method=_section(**extra))
            clients = cfg["clients"]["per_round"]
            out = run_experiment(load_config(cfg), out=tmp_path / str(groups), render=False)
            runs[groups] = metrics_without_wall(out)
    rounds = [line for line in runs[4] if "test_loss" in line]
    assert rounds[-1]["test_loss"] < rounds[0]["test_loss"]
    extra = 3 * (10 * 16 + 10) * 4  # float32 bytes, to each client
    for a, b in zip(*(
        [line["bytes_down"] for line in runs[g] if "bytes_down" in line] for g in (4, 1)
    ), strict=True):  # fmt: skip
        assert extra <= (a - b) / clients < extra + 64


def _server_heads(sim) -> dict[str, torch.Tensor]:
    strategy = sim.strategy
    while not isinstance(strategy, HeadAveraging):
        strategy = strategy.inner
    return {k: v.clone() for k, v in strategy.heads.params().items()}


@pytest.mark.parametrize(
    "mechanism",
    [
        {"method.secure_aggregation": True},
        {"privacy": {"mechanism": "gaussian", "noise_multiplier": 0.0, "clip": float("inf")}},
    ],
)
def test_secure_aggregation_and_dp_sum_the_heads_with_the_model(tiny, mechanism):
    """The heads' deltas are summands of the reply: masked sums (secure aggregation, fixed-point)
    give the plain mean's heads to its rounding, DP without noise or clipping gives them exactly;
    and the heads move from their start."""

    def heads(**over):
        cfg = load_config(tiny(rounds=2, model={"name": "lenet"}, method=_section(), **over))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sim = build_run(cfg).simulation()
        try:
            start = _server_heads(sim)
            for r in (1, 2):
                sim.run_round(r)
            return start, _server_heads(sim)
        finally:
            sim.close()

    start, plain = heads()
    _, other = heads(**mechanism)
    assert any(not torch.equal(start[k], plain[k]) for k in plain)
    exact = "privacy" in mechanism
    for k in plain:
        assert torch.allclose(other[k], plain[k], atol=0 if exact else 1e-5, rtol=0), k
