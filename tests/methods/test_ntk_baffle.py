"""NTK-pruned BAFFLE: exact density, pruned weights stay zero, sparse wire format, unchanged
K-scalar uplink, client-data pruning as phases of round 1."""

import json

import pytest
import torch
from safetensors.torch import load_file

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.build import build_run
from fedge.experiment.run import run_experiment
from fedge.pruning import prunable_parameters


def _cfg(tiny, **method):
    base = {
        "name": "ntk-baffle",
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


def test_preset_validates():
    cfg = load_config("ntk-baffle-fmnist-lenet")
    assert cfg.method.name == "ntk-baffle"


def test_final_model_has_the_density_and_pruned_weights_are_zero(tmp_path, tiny):
    out = run_experiment(_cfg(tiny, mode="epoch"), out=tmp_path / "r", render=False)
    tensors = load_file(out / "model.safetensors")
    built = build_run(_cfg(tiny, mode="epoch"))
    names = prunable_parameters(built.model_fn())
    kept = sum(int((tensors[n] != 0).sum()) for n in names)
    total = sum(tensors[n].numel() for n in names)
    assert kept == round(0.2 * total)  # exact: trained kept weights are never exactly 0 here
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(x["density"] == pytest.approx(0.2, abs=1e-3) for x in lines)
    assert all(x["client_flops_effective"] < x["client_flops"] for x in lines)


def test_batch_uplink_is_unchanged_and_downlink_is_sparse(tiny):
    sparse = build_run(_cfg(tiny, mode="batch", secure_aggregation=False)).simulation().run_round(1)
    dense = (
        build_run(
            load_config(
                tiny(
                    model={"name": "mlp", "hidden": [32]},
                    method={
                        "name": "baffle",
                        "mode": "batch",
                        "k": 8,
                        "batch_size": 16,
                        "secure_aggregation": False,
                    },
                    **{"clients.num": 4, "clients.per_round": 4},
                )
            )
        )
        .simulation()
        .run_round(1)
    )
    assert sparse["bytes_up"] == dense["bytes_up"]
    assert sparse["bytes_down"] < 0.5 * dense["bytes_down"]


def test_estimates_touch_only_kept_coordinates(tiny):
    built = build_run(_cfg(tiny, mode="batch", ema=None, secure_aggregation=False))
    sim = built.simulation()
    strategy = sim.strategy.inner
    before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    sim.run_round(1)
    for name, mask in strategy.server.masks.items():
        w0, w1 = before[name], strategy.model.state_dict()[name]
        assert torch.all(w1[~mask] == 0) and torch.all(w0[~mask] == 0)
        assert bool((w1[mask] != w0[mask]).any())


def test_client_data_pruning_runs_as_phases_of_round_one(tiny):
    sim = build_run(
        _cfg(tiny, mode="batch", prune_data="client", prune_k=6, secure_aggregation=False)
    ).simulation()
    line = sim.run_round(1)
    assert line["phases"] == 3 + 1 and line["density"] == pytest.approx(0.2, abs=1e-3)
    assert "phases" not in sim.run_round(2)


def test_client_data_pruning_needs_the_ntk_score():
    with pytest.raises(ValueError, match="prune_data=random"):
        from fedge.methods.ntk_baffle import NtkBaffleConfig

        NtkBaffleConfig(prune_data="client", prune_score="magnitude")


@pytest.mark.parametrize("score", ["magnitude", "random"])
def test_baseline_scores_prune_to_the_same_density(tiny, score):
    line = build_run(_cfg(tiny, mode="batch", prune_score=score)).simulation().run_round(1)
    assert line["density"] == pytest.approx(0.2, abs=1e-3)


def test_unknown_pruning_key(tiny):
    with pytest.raises(ConfigError, match="prune_round"):
        build_run(_cfg(tiny, prune_round=3))


def test_zeroth_order_route_for_ntk_rand_scores_what_autograd_scores(tiny):
    """prune_route=zeroth_order (NTK-Ori's scoring, on Gaussian inputs): the exact density, and
    a kept set that agrees with the autograd route's well beyond chance (oracle: autograd)."""
    from fedge.methods.ntk_baffle import NtkBaffleConfig, data_free_masks

    built = build_run(_cfg(tiny, mode="batch", prune_rounds=1, prune_inputs=64))
    cfg = built.method_config
    shape = tuple(built.dataset.input_shape)
    exact = data_free_masks(cfg, built.model_fn(), seed=0, input_shape=shape)
    zo = data_free_masks(
        cfg.model_copy(update={"prune_route": "zeroth_order", "prune_k": 1000}),
        built.model_fn(),
        seed=0,
        input_shape=shape,
    )
    kept = {n: int(m.sum()) for n, m in exact.items()}
    assert sum(int(m.sum()) for m in zo.values()) == sum(kept.values())
    both = sum(int((exact[n] & zo[n]).sum()) for n in exact)
    total = sum(m.numel() for m in exact.values())
    chance = (
        sum(kept.values()) ** 2 / total
    )  # expected overlap of two independent draws at this density
    assert both > 1.4 * chance  # measured 153 against a chance 95 (sd ~8); K = 100 gives 97
    with pytest.raises(ValueError, match="prune_route=zeroth_order"):
        NtkBaffleConfig(prune_route="zeroth_order", prune_score="magnitude")


@pytest.mark.parametrize("mode", ["batch", "epoch"])
def test_freeze_composes_with_ntk_baffle(tiny, mode):
    """method.freeze on a pruned model: the frozen tensor keeps its (pruned) initial value and is
    not uploaded; the kept coordinates of the other tensors train, the pruned ones stay zero.
    (Epoch mode used to fail: the client masked the delta of a frozen tensor it never sends.)"""
    from fedge.models.blocks import resolve_freeze

    built = build_run(
        _cfg(tiny, mode=mode, ema=None, secure_aggregation=False, freeze=["features.fc1"])
    )
    frozen = resolve_freeze(built.model_fn(), ["features.fc1"])
    sim = built.simulation()
    strategy = sim.strategy.inner
    before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    for r in (1, 2):
        sim.run_round(r)
    after = strategy.model.state_dict()
    assert frozen and all(torch.equal(after[n], before[n]) for n in frozen)
    trained = [
        n
        for n in after
        if n not in frozen and after[n].is_floating_point() and not torch.equal(after[n], before[n])
    ]
    assert trained
    for name, mask in strategy.server.masks.items():
        assert torch.all(after[name][~mask] == 0)
    sim.close()


def test_a_resumed_run_keeps_the_masks_it_was_trained_with(tmp_path, tiny, monkeypatch):
    """Another machine can round the iterative data-free pruning to another mask; the resumed run
    must go on with the checkpoint's (and end as the uninterrupted run), not switch mid-way."""
    from fedge.experiment.resume import resume_experiment
    from fedge.methods import ntk_baffle

    cfg = _cfg(tiny, mode="epoch")
    full = run_experiment(
        _cfg(tiny, mode="epoch").model_copy(update={"rounds": 3}),
        out=tmp_path / "full",
        render=False,
    )
    short = run_experiment(
        cfg.model_copy(update={"rounds": 2}), out=tmp_path / "short", render=False
    )
    original = ntk_baffle.data_free_masks

    def elsewhere(mcfg, w0, *, seed, input_shape, draws="torch"):  # another CPU's pruning
        return original(
            mcfg.model_copy(update={"prune_score": "magnitude"}),
            w0,
            seed=seed,
            input_shape=input_shape,
            draws=draws,
        )

    built = build_run(cfg)
    args = {"seed": cfg.seed, "input_shape": tuple(built.dataset.input_shape)}
    mcfg = built.method_config
    ours, theirs = (
        original(mcfg, built.model_fn(), **args),
        elsewhere(mcfg, built.model_fn(), **args),
    )
    assert any(not torch.equal(ours[k], theirs[k]) for k in ours)  # the stand-in really differs
    monkeypatch.setattr(ntk_baffle, "data_free_masks", elsewhere)
    with pytest.warns(RuntimeWarning, match="continues with the checkpoint's masks"):
        resume_experiment(short, rounds=3, render=False)
    got, want = load_file(short / "model.safetensors"), load_file(full / "model.safetensors")
    assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)


def test_ntk_ori_pruning_with_dp_is_refused_and_data_free_pruning_takes_it(tiny):
    """NTK-Ori's pruning rounds upload statistics of client data outside DP's clipping, noise and ε:
    refused with DP on; data-free pruning (which sees no client data) builds under DP."""
    dp = {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0}

    def cfg(prune_data):
        return load_config(
            tiny(
                model={"name": "mlp", "hidden": [32]},
                privacy=dp,
                method={
                    "name": "ntk-baffle",
                    "mode": "batch",
                    "k": 8,
                    "batch_size": 16,
                    "density": 0.5,
                    "prune_rounds": 2,
                    "prune_data": prune_data,
                },
            )
        )

    with pytest.raises(
        ConfigError,
        match=r"prune_data=client: NTK-Ori's pruning rounds upload statistics .*outside DP"
        r".*use method.prune_data=random",
    ):
        build_run(cfg("client"))
    build_run(cfg("random"))


def test_ntk_ori_ema_starts_from_the_pruned_model(tiny):
    """NTK-Ori prunes, and rescales the kept weights, in the first exchanges of round 1, beneath the
    EMA: the average starts from the pruned model, where NTK-Rand's starts (oracle: one EMA step
    from the pruned, rescaled W0 to W1). It used to start from the dense W0, which left d·W0 in
    the kept weights instead of d·W0/sqrt(density) (0.14 off here with a constant decay)."""
    from fedge.pruning import apply_masks_, rescale_

    built = build_run(
        _cfg(
            tiny,
            mode="batch",
            prune_data="client",
            prune_k=6,
            secure_aggregation=False,
            ema=0.9,
            ema_warmup=False,
        )
    )
    sim = built.simulation()
    ema = sim.strategy.inner  # ReportEffectiveFlops(EMAEvaluation(...))
    sim.run_round(1)
    masks = ema.global_model.masks
    start = rescale_(apply_masks_(built.model_fn(), masks), masks).state_dict()
    w1 = ema.model.state_dict()
    assert ema.ema["avg"].keys() == {k for k, v in w1.items() if v.is_floating_point()}
    for name, avg in ema.ema["avg"].items():
        torch.testing.assert_close(avg, 0.9 * start[name] + 0.1 * w1[name], rtol=1e-6, atol=1e-7)
    sim.close()


def test_ntk_ori_pruning_uploads_outside_secure_aggregation_are_warned(tiny):
    """With secure aggregation on, the server learns only sums in the training rounds, but NTK-Ori's
    pruning rounds upload each client's K differences of the NTK statistic on its own inputs in the
    clear: a legal choice (Algorithm 1 sends F_i in the clear) that must say so, not pass silently.
    Data-free pruning sees no client data and is not warned."""
    import warnings

    from fedge.core.errors import PrivacyWarning

    with pytest.warns(PrivacyWarning, match=r"prune_data=client.*in the clear.*prune_data=random"):
        build_run(_cfg(tiny, mode="batch", prune_data="client", prune_k=6, secure_aggregation=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_run(_cfg(tiny, mode="batch", secure_aggregation=True))
    assert not [w for w in caught if "prune_data=client" in str(w.message)]


class _StopAtPruning(Exception):
    """Stands in for Ctrl-C inside NTK-Ori's pruning phase."""


def test_ntk_ori_pruning_rounds_are_checkpointed_and_a_resume_goes_on_from_the_last(tmp_path, tiny):
    """An interrupt inside round 1's pruning phase keeps the pruning rounds done; each resume
    goes on from the next one, and the run ends bit for bit as the uninterrupted one."""
    from fedge.experiment.progress import Progress
    from fedge.experiment.resume import resume_experiment
    from tests_helpers import metrics_without_wall

    def cfg():
        return _cfg(
            tiny, mode="batch", prune_data="client", prune_k=6, secure_aggregation=False
        ).model_copy(update={"rounds": 2})

    class Phases(Progress):
        def __init__(self, stop_at=None):
            self.seen, self.stop_at = [], stop_at

        def phase(self, rnd, name, done, total):
            self.seen.append((rnd, name, done, total))
            if done == self.stop_at:
                raise _StopAtPruning

    whole = Phases()
    full = run_experiment(cfg(), out=tmp_path / "full", progress=whole, render=False)
    assert whole.seen == [(1, "pruning", t, 3) for t in (1, 2, 3)]

    cut = tmp_path / "cut"
    with pytest.raises(_StopAtPruning):
        run_experiment(cfg(), out=cut, progress=Phases(stop_at=1), render=False)
    state = torch.load(cut / "checkpoint.pt", weights_only=True)
    assert state["record"]["round"] == 0 and state["partial"]["round"] == 1
    assert (cut / "metrics.jsonl").read_text() == ""  # round 1 not done, its pruning round 1 kept

    again = Phases(stop_at=2)
    with pytest.raises(_StopAtPruning):
        resume_experiment(cut, progress=again, render=False)
    assert again.seen == [(1, "pruning", 2, 3)]  # pruning round 1 was not redone
    rest = Phases()
    resume_experiment(cut, progress=rest, render=False)
    assert rest.seen == [(1, "pruning", 3, 3)]

    assert metrics_without_wall(cut) == metrics_without_wall(full)
    got, want = load_file(cut / "model.safetensors"), load_file(full / "model.safetensors")
    assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)
    masks = [
        torch.load(d / "checkpoint.pt", weights_only=True)["strategy"]["inner"]["inner"]
        for d in (cut, full)
    ]
    assert all(masks[0]["masks"][k].equal(m) for k, m in masks[1]["masks"].items())
    assert "partial" not in torch.load(cut / "checkpoint.pt", weights_only=True)


@pytest.mark.parametrize("rescale", [False, True])
def test_rescale_option_scales_kept_weights_by_one_over_sqrt_layer_density(tiny, rescale):
    """``method.rescale``: off, the kept weights of the pruned model the server starts from are
    the dense initialisation's; on (the default), each pruned tensor's kept weights are the dense
    init's times 1/sqrt(that tensor's density). Pruned weights are zero either way; tensors
    outside the masks (biases) are the dense init's (oracle: the dense W0 and the masks)."""
    built = build_run(_cfg(tiny, mode="batch", rescale=rescale))
    assert built.method_config.rescale is rescale
    w0 = dict(built.model_fn().named_parameters())  # the dense init (the run's model_fn)
    sim = built.simulation()
    gm = sim.strategy.global_model
    masks, start = gm.masks, dict(gm.model.named_parameters())
    assert masks
    for name, p in start.items():
        if name not in masks:
            torch.testing.assert_close(p, w0[name], rtol=0, atol=0)
            continue
        m = masks[name].bool()
        d = float(m.float().mean())
        assert 0 < d < 1
        factor = d**-0.5 if rescale else 1.0
        assert bool((p[~m] == 0).all())
        torch.testing.assert_close(p[m], w0[name][m] * factor, rtol=1e-6, atol=0)
    sim.close()
