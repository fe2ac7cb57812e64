"""EPPFL (fedge.methods.eppfl): split exactness, selection, masks, accounting, bad input."""

from __future__ import annotations

import json
import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.core.rng import generator
from fedge.experiment.build import build_run, method_config
from fedge.methods.eppfl import FIXED_POINT
from fedge.methods.eppfl.parties import MaskKeys, seeded_rng
from fedge.methods.eppfl.split import gradient_positions, split_model
from fedge.privacy.dp.laplace import laplace_epsilon
from tests.conftest import tiny_config
from tests_helpers import record_replies


def _cfg(**over):
    base = {
        "rounds": 2,
        "clients.num": 3,
        "clients.per_round": 3,
        "dataset.limit_train": 96,
        "dataset.limit_test": 50,
        "model": {"name": "vgg9", "dropout": False},
        "method": {"name": "eppfl", "local_epochs": 1, "batch_size": 16},
    }
    base.update(over)
    return tiny_config(**base)


def _built(**over):
    return build_run(load_config(_cfg(**over)))


def test_gradient_selection_hand_computed_with_ties():
    # one sample, two channels, N_c = 5, θ_g·N_c = 2 (kept 2 of 5)
    g = torch.tensor([[[0.1, -3.0, 2.0, -2.0, 2.0], [1.0, 1.0, 1.0, 1.0, -1.0]]])
    pos = gradient_positions(g, 2)
    # ch 0: |−3| first; then 2.0 at 2, −2.0 at 3, 2.0 at 4 tie -> lowest index 2
    # ch 1: all tie -> indices 0, 1
    assert pos.tolist() == [[[1, 2], [0, 1]]]


def test_default_cut_is_first_conv_and_relu_and_bad_cut_is_a_config_error():
    built = _built()
    model = built.model_fn()
    sp = split_model(model, None)
    assert sp.cut == "features.conv1.act"
    assert set(sp.device_keys) == {"features.conv1.conv.weight", "features.conv1.conv.bias"}
    x = torch.randn(2, 1, 8, 8)
    assert torch.allclose(sp.edge(sp.device(x)), model(x))
    with pytest.raises(ConfigError, match="method.cut='nope'"):
        _built(**{"method.cut": "nope"})
    with pytest.raises(ConfigError, match="nothing for the edge"):
        _built(**{"method.cut": "classifier"})


@pytest.mark.parametrize(
    "key,value",
    [
        ("theta_a", 0.0),
        ("theta_a", 1.5),
        ("theta_g", -0.1),
        ("dp", {"epsilon": 0, "clip": 1.0}),
        ("dp", {"epsilon": -2, "clip": 1.0}),
    ],
)
def test_bad_config_is_a_config_error_naming_the_key(key, value):
    cfg = load_config(_cfg(**{f"method.{key}": value}))
    with pytest.raises(ConfigError, match=f"method.{key}"):
        method_config(cfg)


def _unsplit_reference(built, cid, rnd, epochs, lr, momentum):
    model = built.model_fn()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = generator(built.config.seed, "client", rnd, cid)
    seeded_rng(gen)  # the device's first draw seeds its selection/noise generator
    for _ in range(epochs):
        for x, y in built.clients[cid].batches(16, generator=gen):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return model.state_dict()


def test_split_is_exact_one_client_no_privacy_no_masks():
    built = _built(
        **{
            "clients.num": 1,
            "clients.per_round": 1,
            "method.local_epochs": 2,
            "method.masks": False,
        }
    )
    sim = built.simulation()
    sim.run_round(1)
    got = sim.strategy.eval_model().state_dict()
    want = _unsplit_reference(built, 0, 1, 2, 0.01, 0.5)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-6, rtol=1e-5), k
    assert any(
        (got[k] - built.model_fn().state_dict()[k]).abs().max() > 1e-4 for k in want
    )  # it did train


def test_masked_aggregate_equals_fixed_point_mean_and_float_mean_within_bound():
    keys = MaskKeys(bytes(range(32)), 50, FIXED_POINT)
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=50) for _ in range(4)]
    q = [FIXED_POINT.encode(w, n_summands=4) for w in ws]
    uploads = [FIXED_POINT.add(qi, keys.mask(3, c)) for c, qi in enumerate(q)]
    unmasked = FIXED_POINT.sub(FIXED_POINT.ring_sum(uploads), keys.mask_sum(3, [0, 1, 2, 3]))
    assert np.array_equal(unmasked, FIXED_POINT.ring_sum(q))  # exact in the ring
    mean = FIXED_POINT.decode(unmasked) / 4
    assert np.max(np.abs(mean - np.mean(ws, axis=0))) <= 2.0**-33


def test_run_with_masks_equals_run_without_within_the_bound():
    a, b = _built(**{"method.masks": True}), _built(**{"method.masks": False})
    sa, sb = a.simulation(), b.simulation()
    for r in (1, 2):
        la, lb = sa.run_round(r), sb.run_round(r)
    ma, mb = sa.strategy.eval_model().state_dict(), sb.strategy.eval_model().state_dict()
    for k in ma:
        assert torch.allclose(ma[k], mb[k], atol=1e-5), k
    assert la["bytes.sr->client"] > 0 and "bytes.sr->client" not in lb
    assert la["bytes_up"] > 0 and la["bytes.client->edge"] > 0 and la["bytes.server->edge"] > 0


def test_single_masked_upload_is_uniform_whatever_w_c():
    """y = encode(W_c) + r_i^t over 400 rounds, for W_c = 0 and W_c huge: both uniform on
    Z_{2^64} (chi-square on the top 4 bits, KS on y / 2^64), and indistinguishable."""
    keys = MaskKeys(bytes(32), 16, FIXED_POINT)
    big = np.full(16, 0.9 * FIXED_POINT.max_abs(10))
    ys = {
        name: np.stack(
            [
                FIXED_POINT.add(FIXED_POINT.encode(w, n_summands=10), keys.mask(t, 7))
                for t in range(400)
            ]
        )
        for name, w in (("zero", np.zeros(16)), ("big", big))
    }
    for v in ys.values():
        top = np.bincount((v >> np.uint64(60)).astype(np.int64).ravel(), minlength=16)
        assert stats.chisquare(top).pvalue > 1e-3
        assert stats.kstest(v.ravel().astype(np.float64) / 2.0**64, "uniform").pvalue > 1e-3
    a, b = (ys[n].ravel().astype(np.float64) / 2.0**64 for n in ("zero", "big"))
    assert stats.ks_2samp(a, b).pvalue > 1e-3


def test_dp_run_logs_epsilon_equal_to_the_accountant_and_works_with_two_workers():
    over = {
        "method.dp": {"epsilon": 3.0, "clip": 10.0},
        "method.theta_a": 0.5,
        "method.theta_g": 0.5,
        "clients.per_round": 2,
    }
    lines = {}
    for workers in (0, 2):
        built = _built(**over, **{"clients.workers": workers})
        sim = built.simulation()
        try:
            lines[workers] = [sim.run_round(r) for r in (1, 2)]
        finally:
            sim.close()
    last = lines[0][-1]
    releases = last["dp_releases_max"]
    assert releases in (1, 2)
    assert last["dp_epsilon_rdp"] == laplace_epsilon(3.0, releases, 1e-5)["rdp"]
    assert last["dp_epsilon_pld"] == laplace_epsilon(3.0, releases, 1e-5)["pld"]
    for l0, l2 in zip(lines[0], lines[2], strict=True):
        assert l0["test_accuracy"] == l2["test_accuracy"] and l0["train_loss"] == pytest.approx(
            l2["train_loss"], rel=1e-5
        )
        assert l0["bytes.client->edge"] == l2["bytes.client->edge"]


def test_cli_bad_theta_exits_2(tmp_path):
    from typer.testing import CliRunner

    from fedge.cli.main import app

    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(_cfg(**{"method.theta_g": 2.0})))
    res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run"), "-q"])
    assert res.exit_code == 2, res.output
    assert "theta_g" in res.output
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_each_protection_left_off_is_a_privacy_warning_naming_it():
    import warnings

    from fedge.core.errors import PrivacyWarning

    def warned(**over):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _built(**over)
        return [str(w.message) for w in seen if issubclass(w.category, PrivacyWarning)]

    dp = {"epsilon": 5.0, "clip": 100.0}
    assert warned(**{"method.dp": dp}) == []  # both on, as the preset
    (no_dp,) = warned()
    assert no_dp.startswith("method.dp is not set") and "inverted" in no_dp
    (no_masks,) = warned(**{"method.dp": dp, "method.masks": False})
    assert no_masks.startswith("method.masks=false") and "in the clear" in no_masks
    assert len(warned(**{"method.masks": False})) == 2


def test_a_device_that_fails_is_left_out_as_the_replies_that_arrived_say():
    """clients.dropout loses device 1 in round 1 and device 2 in round 2 (seed 2): S_a aggregates
    the others and S_r's mask sum covers just them, so the global model is the one of a run
    whose rounds sample only the devices that replied (the oracle, up to the fixed-point step);
    a failed device still counts for DP accounting (it may have released activations)."""
    over = {"clients.num": 4, "clients.per_round": 4, "seed": 2, "method.masks": True}
    built = _built(**over, **{"clients.dropout": 0.3, "clients.min_replies": 2})
    sim = built.simulation()
    got = record_replies(sim)
    lines = [sim.run_round(r) for r in (1, 2)]
    replied = {rnd: ids for (rnd, _), ids in got.items()}  # one exchange a round
    assert replied == {1: [0, 2, 3], 2: [0, 1, 3]} and [x["clients_failed"] for x in lines] == [
        1,
        1,
    ]
    assert [x["eppfl_aggregated"] for x in lines] == [3, 3]
    oracle = _built(**over).simulation()
    oracle.sample = lambda rnd: replied[rnd]
    for r in (1, 2):
        oracle.run_round(r)
    got, want = sim.strategy.eval_model().state_dict(), oracle.strategy.eval_model().state_dict()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5), k
    assert sim.strategy.participation.tolist() == [
        2,
        2,
        2,
        2,
    ] and oracle.strategy.participation.tolist() == [
        2,
        1,
        1,
        2,
    ]


def test_aggregated_clients_leave_out_the_lost_uploads():
    """``upload_dropout`` loses a seeded third of the replies that arrived (oracle: the same
    draw); the devices aggregated, whose data trained both M_c and M_s, are the others."""
    built = _built(**{"clients.num": 3, "rounds": 1, "method.upload_dropout": 0.34})
    sim = built.simulation()
    line = sim.run_round(1)
    lost = torch.randperm(3, generator=generator(built.config.seed, "eppfl-dropout", 1))[
        :1
    ].tolist()
    assert sim.strategy.aggregated_clients() == sorted(set(range(3)) - set(lost))
    assert line["eppfl_aggregated"] == 2 and line["eppfl_dropped"] == 1


def test_dp_with_batch_statistics_on_the_device_is_a_privacy_warning():
    """BatchNorm in the device half couples a batch's releases (the per-release ε would understate
    a sample's loss); GroupNorm does not, and gets no warning."""
    import warnings

    from fedge.core.errors import PrivacyWarning

    def warned(norm):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _built(
                **{
                    "method.dp": {"epsilon": 5.0, "clip": 100.0},
                    "model": {"name": "vgg9", "dropout": False, "norm": norm},
                }
            )
        return [str(w.message) for w in seen if issubclass(w.category, PrivacyWarning)]

    (msg,) = warned("batch")
    assert (
        "BatchNorm2d in the device half" in msg
        and "all 16 samples of its batch" in msg
        and "16·ε" in msg
    )
    assert warned("group") == []


def test_secure_noise_draws_laplace_noise_the_seed_does_not_fix():
    """Reproducible by default (same seed, same released activations, same model); with
    ``method.dp.secure_noise`` two runs of one config train on different noise."""

    def round_one(secure):
        over = {
            "method.dp": {"epsilon": 1.0, "clip": 10.0, "secure_noise": secure},
            "clients.per_round": 1,
        }
        sim = _built(**over).simulation()
        try:
            return sim.run_round(1)["train_loss"]
        finally:
            sim.close()

    assert round_one(False) == round_one(False)
    assert round_one(True) != round_one(True)


def test_releases_in_a_skipped_round_stay_counted():
    """Seed 2, 2 of 4 devices a round, clients.dropout 0.3, clients.min_replies 2: round 1
    (devices 1, 3) loses a reply and is skipped, S_a put back as before it; rounds 2 (1, 3) and
    3 (1, 2) complete. The devices addressed in round 1 released E epochs of activations all
    the same, so the worst device (1) has released 3·E times after round 3, not 2·E. Oracle:
    the releases counted from the exchanges' addressees, and ε from dp-accounting directly."""
    import dp_accounting as dpa

    over = {
        "method.dp": {"epsilon": 3.0, "clip": 10.0},
        "method.local_epochs": 2,
        "clients.num": 4,
        "clients.per_round": 2,
        "seed": 2,
        "clients.dropout": 0.3,
        "clients.min_replies": 2,
    }
    sim = _built(**over).simulation()
    addressed: list[list[int]] = []
    exchange = sim._exchange

    def recording(rnd, phase, messages, acc):
        addressed.append(sorted(messages))  # before the exchange: a skipped one is recorded too
        return exchange(rnd, phase, messages, acc)

    sim._exchange = recording
    lines = [sim.run_round(r) for r in (1, 2, 3)]
    assert [x.get("round_skipped", 0) for x in lines] == [1, 0, 0] and addressed == [
        [1, 3],
        [1, 3],
        [1, 2],
    ]
    for r, line in enumerate(lines, start=1):
        per_device = [sum(c in ids for ids in addressed[:r]) for c in range(4)]
        releases = max(per_device) * 2
        rdp = dpa.rdp.RdpAccountant()
        rdp.compose(dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(1 / 3.0), releases))
        pld = dpa.pld.PLDAccountant()
        pld.compose(dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(1 / 3.0), releases))
        assert line["dp_releases_max"] == releases == 2 * r
        assert line["dp_epsilon_pure"] == 3.0 * releases
        assert line["dp_epsilon_rdp"] == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-12)
        assert line["dp_epsilon_pld"] == pytest.approx(pld.get_epsilon(1e-5), rel=1e-9)
    assert sim.strategy.participation.tolist() == [0, 3, 1, 2]


def _keep_top_k(g, k):
    """g with all but its k largest |entries| per row (last dim) zeroed."""
    idx = g.abs().topk(k, dim=-1).indices
    return torch.zeros_like(g).scatter(-1, idx, g.gather(-1, idx))


def _masked_reference(built, *, theta_a, theta_g, lr=0.01, momentum=0.5):
    """One round of one device trained unsplit: M_s reads ``scatter(gather(A, pos))`` (θ_a's
    positions, drawn as the device draws them) and the gradient reaching M_c through the k_a
    released values keeps only the top k_g = round(θ_g·k_a) of them by |dA'| per sample and
    channel. M_s's own gradient is the full one."""
    from fedge.methods.eppfl.split import activation_positions, kept, scatter

    model = built.model_fn()
    sp = split_model(model, None)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = generator(built.config.seed, "client", 1, 0)
    noise_gen = torch.Generator().manual_seed(seeded_rng(gen))
    for x, y in built.clients[0].batches(16, generator=gen):
        seeded_rng(noise_gen)  # the device's dropout seed
        seed = seeded_rng(noise_gen)
        a = sp.device(x)
        b, c = a.shape[:2]
        n = a[0].numel() // c
        pos = activation_positions(seed, (b, c, n), kept(n, theta_a))
        released = a.reshape(b, c, n).gather(-1, pos)
        k_g = kept(released.shape[-1], theta_g)
        if k_g < released.shape[-1]:
            released.register_hook(partial(_keep_top_k, k=k_g))
        opt.zero_grad()
        F.cross_entropy(sp.edge(scatter(released, pos, n).reshape(a.shape)), y).backward()
        opt.step()
    return model.state_dict()


@pytest.mark.parametrize("theta_g", [1.0, 0.5, 0.25])
def test_selection_trains_as_unsplit_training_on_the_released_activations(theta_g):
    """θ_a = 0.5: the edge server returns dA'_b, the gradients at the released values, and θ_g
    keeps the largest θ_g of *those*, none at a position the device did not release. Oracle:
    the unsplit model on the zero-filled released activations, with a top-k hook on their
    gradient (autograd). M_c moves by ~1e-6 in this round, so each entry is compared relative
    to its update."""
    built = _built(
        **{
            "clients.num": 1,
            "clients.per_round": 1,
            "method.masks": False,
            "method.theta_a": 0.5,
            "method.theta_g": theta_g,
        }
    )
    sim = built.simulation()
    sim.run_round(1)
    got = sim.strategy.eval_model().state_dict()
    want = _masked_reference(built, theta_a=0.5, theta_g=theta_g)
    init = built.model_fn().state_dict()
    for k in want:
        step = (want[k] - init[k]).abs().max()
        assert step > 0 and (got[k] - want[k]).abs().max() <= 1e-4 * step, k


@pytest.mark.parametrize("theta_g,indices", [(1.0, False), (0.5, True)])
def test_edge_to_device_bytes_are_the_released_activations_gradients(theta_g, indices):
    """θ_a = 0.5 (k_a = 32 of N_c = 64 per channel): each step's reply is one float32 gradient per
    released value (θ_g = 1: no indices), or k_g = 16 of them with their int16 indices among the
    released values (θ_g = 0.5); nothing for the 32 positions not released. Oracle: the encoded
    size of exactly that message per batch, summed over the round's batches."""
    from fedge.core.messages import Message

    built = _built(
        **{
            "clients.num": 1,
            "clients.per_round": 1,
            "method.theta_a": 0.5,
            "method.theta_g": theta_g,
        }
    )
    line = built.simulation().run_round(1)
    sp = split_model(built.model_fn(), None)
    c, h, w = sp.device(torch.zeros(1, 1, 8, 8)).shape[1:]
    k = 16 if indices else 32
    want = 0
    for x, _ in built.clients[0].batches(16, generator=torch.Generator().manual_seed(0)):
        arrays = {"g": torch.zeros(len(x), c, k)}
        if indices:
            arrays["pos"] = torch.zeros(len(x), c, k, dtype=torch.int16)
        want += len(Message(arrays, metrics={"loss": 0.0}).to_bytes())
    assert h * w == 64  # N_c: k_a = 32 released
    assert line["bytes.edge->client"] == want


def test_device_upload_to_the_aggregation_server_is_the_masked_m_c_alone():
    """S_a's view of a device (masks on, no integer buffers in M_c): the masked ring vector,
    no dataset size (Eq. 9 weighs uploads equally; S_a has no use for |d_i|)."""
    sim = _built(**{"rounds": 1}).simulation()
    seen = {}
    exchange = sim._exchange

    def recording(rnd, phase, messages, acc):
        replies = exchange(rnd, phase, messages, acc)
        seen.update(replies)
        return replies

    sim._exchange = recording
    sim.run_round(1)
    assert sorted(seen) == [0, 1, 2]
    for reply in seen.values():
        assert set(reply.config) == {"masked"} and reply.arrays == {}


# --- method.dp.sensitivity: the rigorous default and the paper's data-dependent scale ----------


def _unit_laplace(shape, seed):
    """Unit Laplace draws as the samplers make them: Exp(1) − Exp(1) from float64 uniforms."""
    u = torch.rand((2, *shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    e = -torch.log1p(-u)
    return e[0] - e[1]


def test_paper_scale_is_each_sample_and_channels_max_magnitude_over_epsilon_hand_computed():
    from fedge.methods.eppfl.noise import PaperLaplace

    # 2 samples, 2 channels, 3 released values each; ε = 2
    v = torch.tensor(
        [[[0.5, 2.0, 1.0], [0.0, 0.0, 0.0]], [[3.0, 1.0, 0.0], [0.25, -4.0, 0.5]]],
        requires_grad=True,
    )
    mech = PaperLaplace(2.0)
    # by hand: max|a| per (sample, channel) / ε = 2/2, 0/2, 3/2, 4/2
    assert mech.scales(v).reshape(-1).tolist() == [1.0, 0.0, 1.5, 2.0]
    own, out = mech.release(v, generator=torch.Generator().manual_seed(7))
    want = (
        v.detach()
        + (
            _unit_laplace(v.shape, 7) * torch.tensor([1.0, 0.0, 1.5, 2.0]).reshape(2, 2, 1).double()
        ).float()
    )
    assert torch.equal(out, want)
    assert torch.equal(out[0, 1], v[0, 1].detach())  # a silent channel gets no noise
    assert own is v and not out.requires_grad  # the device differentiates its noise-free values


def test_paper_sensitivity_refuses_a_clip_and_rigorous_needs_one():
    for dp, words in (
        ({"epsilon": 5.0, "sensitivity": "paper", "clip": 100.0}, "remove clip"),
        ({"epsilon": 5.0}, "clip is required with sensitivity rigorous"),
        ({"epsilon": 5.0, "sensitivity": "loose"}, "sensitivity"),
    ):
        with pytest.raises(ConfigError, match="method.dp") as err:
            method_config(load_config(_cfg(**{"method.dp": dp})))
        assert words in str(err.value)


def test_paper_sensitivity_warns_no_dp_guarantee_trains_and_logs_no_cumulative_epsilon():
    import warnings

    from fedge.core.errors import PrivacyWarning
    from fedge.methods.eppfl.noise import PaperLaplace

    over = {
        "method.dp": {"epsilon": 5.0, "sensitivity": "paper"},
        "model": {"name": "vgg9", "dropout": False, "norm": "batch"},
    }
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        built = _built(**over)
    (msg,) = [str(w.message) for w in seen if issubclass(w.category, PrivacyWarning)]
    assert msg.startswith("NO DP GUARANTEE") and "depends on the data it protects" in msg
    assert isinstance(built.method.program.mech, PaperLaplace)
    sim = built.simulation()
    try:
        line = sim.run_round(1)
    finally:
        sim.close()
    assert line["dp_epsilon_step"] == 5.0 and line["dp_releases_max"] == 1
    assert not {"dp_epsilon_pure", "dp_epsilon_rdp", "dp_epsilon_pld"} & set(line)
    assert math.isfinite(line["train_loss"])


def test_rigorous_sensitivity_is_the_default_and_releases_clip_plus_laplace_2c_over_eps():
    """Without ``sensitivity`` the device releases clip_l1(v, C) + Lap(2C/ε), computed here by
    hand, and a run is the same whether the key is given or left out."""
    from fedge.privacy.dp.laplace import LaplaceMechanism

    dp = {"epsilon": 4.0, "clip": 3.0}
    built = _built(**{"method.dp": dp})
    assert built.method_config.dp.sensitivity == "rigorous"
    mech = built.method.program.mech
    assert mech == LaplaceMechanism(4.0, 3.0)
    v = torch.tensor([[[1.0, -2.0, 3.0]], [[0.5, 0.25, -0.25]]])  # L1 6 (clipped by 1/2) and 1
    clipped, out = mech.release(v, generator=torch.Generator().manual_seed(3))
    want_clipped = torch.tensor([[[0.5, -1.0, 1.5]], [[0.5, 0.25, -0.25]]])
    assert torch.allclose(clipped, want_clipped)
    assert torch.allclose(out, want_clipped + (1.5 * _unit_laplace(v.shape, 3)).float())

    def round_one(**d):
        sim = _built(**{"method.dp": d, "clients.per_round": 2}).simulation()
        try:
            return sim.run_round(1)
        finally:
            sim.close()

    a, b = round_one(**dp), round_one(**dp, sensitivity="rigorous")
    volatile = {k for k in a if "wall" in k or k.endswith("_s")}
    assert {k: v for k, v in a.items() if k not in volatile} == {
        k: v for k, v in b.items() if k not in volatile
    }
