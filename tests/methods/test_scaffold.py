"""SCAFFOLD against its oracles: the control-variate updates of two rounds on a two-client
quadratic computed by hand, under option II and option I (and option I's c_i against autograd's
gradient over the local data); round 1 (c = c_i = 0) is FedAvg's round 1 bit for bit; the client
control variates survive a resume; its messages are about twice FedAvg's both ways; a client
optimizer option II cannot use is refused; secure aggregation and DP compose by configuration."""

from __future__ import annotations

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.context import ClientContext, ClientData
from fedge.core.errors import ConfigError
from fedge.core.meter import Meter
from fedge.experiment.build import build_run
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from fedge.methods.base import ServerOptimizerConfig
from fedge.methods.scaffold import (
    C_PREFIX,
    DC_PREFIX,
    ScaffoldAveraging,
    ScaffoldClient,
    ScaffoldConfig,
)
from tests_helpers import metrics_without_wall, run_cut_after


def _cfg(tiny, privacy=None, **method):
    base = {"local_epochs": 2, "batch_size": 8, "client_optimizer": {"lr": 0.1}}
    extra = {"privacy": privacy} if privacy else {}
    return load_config(tiny(method={**base, **method}, **extra))


def _train(tiny, rounds=2, **method):
    built = build_run(_cfg(tiny, **method))
    sim = built.simulation()
    lines = [sim.run_round(r) for r in range(1, rounds + 1)]
    sim.close()
    return built, lines, sim.strategy.eval_model().state_dict()


# F_i(w) = ½(w − a_i)² on one weight
TARGETS = {0: 3.0, 1: 0.0}


def _quadratic_federation(
    num_clients: int, *, curvature=None, local_epochs: int = 2, control_variate: str = "option2"
):
    """Clients minimising F_i(w) = ½ h_i (w − a_i)² (h_i = ``curvature[i]``, 1 by default)."""
    h = curvature or {}

    def gradient(model, batch, ctx, masks):
        w = model.weight.detach()
        return None, {"weight": (h.get(ctx.cid, 1.0) * (w - TARGETS[ctx.cid])).clone()}

    def one_weight():
        m = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            m.weight.fill_(1.0)
        return m

    cfg = ScaffoldConfig(
        local_epochs=local_epochs,
        batch_size=1,
        client_optimizer={"lr": 0.1},
        control_variate=control_variate,
    )
    server = ScaffoldAveraging(
        one_weight(),
        ServerOptimizerConfig(name="sgd", lr=1.0).build(),
        weighting="uniform",
        client_sizes=[1] * num_clients,
    )
    client = ScaffoldClient(one_weight, cfg, base=gradient)
    x, y = torch.ones(1, 1), torch.zeros(1, dtype=torch.int64)
    states: dict[int, dict] = {0: {}, 1: {}}

    def round_(rnd):
        replies = {}
        for cid, msg in server.configure_round(rnd, [0, 1]).items():
            ctx = ClientContext(
                cid=cid,
                rnd=rnd,
                data=ClientData(x, y, torch.arange(1)),
                generator=torch.Generator().manual_seed(0),
                meter=Meter(),
                state=states[cid],
            )
            replies[cid] = client.run(msg, ctx)
        server.aggregate_round(rnd, replies)
        return replies

    return server, states, round_


def test_control_variates_of_two_rounds_by_hand():
    """a_1 = 3, a_2 = 0, x = 1, η_l = 0.1, K = 2 (two epochs of one sample), η_g = 1, N = 2.
    Round 1 (c = c_i = 0): client 1 steps 1 → 1.2 → 1.38 (Δy = 0.38, c_1 = −0.38/0.2 = −1.9);
    client 2 steps 1 → 0.9 → 0.81 (Δy = −0.19, c_2 = 0.95); x = 1.095, c = −0.475.
    Round 2: client 1 corrects by c − c_1 = 1.425: 1.095 → 1.143 → 1.1862 (Δy = 0.0912),
    c_1 = −1.9 + 0.475 − 0.456 = −1.881; client 2 by −1.425: 1.095 → 1.128 → 1.1577
    (Δy = 0.0627), c_2 = 0.95 + 0.475 − 0.3135 = 1.1115; x = 1.17195, c = −0.38475 (the mean
    of c_1 and c_2)."""
    server, states, round_ = _quadratic_federation(2)
    close = dict(rtol=0, atol=1e-5)
    r1 = round_(1)
    torch.testing.assert_close(r1[0].arrays["weight"], torch.tensor([[0.38]]), **close)
    torch.testing.assert_close(r1[1].arrays["weight"], torch.tensor([[-0.19]]), **close)
    torch.testing.assert_close(r1[0].arrays[DC_PREFIX + "weight"], torch.tensor([[-1.9]]), **close)
    torch.testing.assert_close(r1[1].arrays[DC_PREFIX + "weight"], torch.tensor([[0.95]]), **close)
    torch.testing.assert_close(server.model.weight.detach(), torch.tensor([[1.095]]), **close)
    torch.testing.assert_close(server.c["weight"], torch.tensor([[-0.475]]), **close)

    r2 = round_(2)
    torch.testing.assert_close(r2[0].arrays["weight"], torch.tensor([[0.0912]]), **close)
    torch.testing.assert_close(r2[1].arrays["weight"], torch.tensor([[0.0627]]), **close)
    torch.testing.assert_close(r2[0].arrays[DC_PREFIX + "weight"], torch.tensor([[0.019]]), **close)
    torch.testing.assert_close(
        r2[1].arrays[DC_PREFIX + "weight"], torch.tensor([[0.1615]]), **close
    )
    c_1, c_2 = states[0]["scaffold.c_i.weight"], states[1]["scaffold.c_i.weight"]
    torch.testing.assert_close(c_1, torch.tensor([[-1.881]]), **close)
    torch.testing.assert_close(c_2, torch.tensor([[1.1115]]), **close)
    torch.testing.assert_close(server.model.weight.detach(), torch.tensor([[1.17195]]), **close)
    torch.testing.assert_close(server.c["weight"], torch.tensor([[-0.38475]]), **close)
    torch.testing.assert_close(server.c["weight"], (c_1 + c_2) / 2, **close)


def test_option_one_control_variates_of_two_rounds_by_hand():
    """Option I: c_i⁺ = ∇F_i(x) = x − a_i at the round's global model. Round 1 (x = 1): the steps
    are option II's (x becomes 1.095), c_1 = −2, c_2 = 1, c = −0.5. Round 2: c − c_1 = 1.5 and
    c − c_2 = −1.5 make both clients step on the global gradient y − 1.5: 1.095 → 1.1355 →
    1.17195 (Δy = 0.07695 each); c_1 = 1.095 − 3 = −1.905, c_2 = 1.095, c = −0.405."""
    server, states, round_ = _quadratic_federation(2, control_variate="option1")
    close = dict(rtol=0, atol=1e-5)
    r1 = round_(1)
    torch.testing.assert_close(r1[0].arrays[DC_PREFIX + "weight"], torch.tensor([[-2.0]]), **close)
    torch.testing.assert_close(r1[1].arrays[DC_PREFIX + "weight"], torch.tensor([[1.0]]), **close)
    torch.testing.assert_close(server.model.weight.detach(), torch.tensor([[1.095]]), **close)
    torch.testing.assert_close(server.c["weight"], torch.tensor([[-0.5]]), **close)
    r2 = round_(2)
    for cid in (0, 1):
        torch.testing.assert_close(r2[cid].arrays["weight"], torch.tensor([[0.07695]]), **close)
    torch.testing.assert_close(states[0]["scaffold.c_i.weight"], torch.tensor([[-1.905]]), **close)
    torch.testing.assert_close(states[1]["scaffold.c_i.weight"], torch.tensor([[1.095]]), **close)
    torch.testing.assert_close(server.c["weight"], torch.tensor([[-0.405]]), **close)


def test_option_one_is_the_autograd_gradient_over_the_local_data_at_x():
    """Oracle: autograd's gradient of the mean cross-entropy over all 10 local samples at the
    global model (batches of 4, 4 and 2, weighted by size). The extra pass leaves the client's
    generator alone: its local steps (round 1, c = c_i = 0) equal option II's bit for bit."""

    def mlp():
        return torch.nn.Sequential(
            torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 4)
        ).requires_grad_(True)

    torch.manual_seed(0)
    init = mlp().state_dict()
    x, y = torch.randn(10, 3), torch.randint(0, 4, (10,))
    replies, states = {}, {}
    for option in ("option1", "option2"):

        def model_fn():
            m = mlp()
            m.load_state_dict(init)
            return m

        cfg = ScaffoldConfig(batch_size=4, client_optimizer={"lr": 0.1}, control_variate=option)
        server = ScaffoldAveraging(
            model_fn(), ServerOptimizerConfig().build(), weighting="uniform", client_sizes=[10]
        )
        state: dict = {}
        ctx = ClientContext(
            cid=0,
            rnd=1,
            data=ClientData(x, y, torch.arange(10)),
            generator=torch.Generator().manual_seed(7),
            meter=Meter(),
            state=state,
        )
        replies[option] = ScaffoldClient(model_fn, cfg).run(server.configure_round(1, [0])[0], ctx)
        states[option] = state
    oracle = model_fn()
    loss = torch.nn.functional.cross_entropy(oracle(x), y)
    grads = dict(
        zip(
            dict(oracle.named_parameters()),
            torch.autograd.grad(loss, list(oracle.parameters())),
            strict=True,
        )
    )
    for k, g in grads.items():
        torch.testing.assert_close(states["option1"]["scaffold.c_i." + k], g, rtol=1e-5, atol=1e-6)
        assert torch.equal(replies["option1"].arrays[k], replies["option2"].arrays[k])
        assert not torch.equal(
            states["option1"]["scaffold.c_i." + k], states["option2"]["scaffold.c_i." + k]
        )


def test_option_one_takes_any_client_optimizer(tiny):
    """Option I's c_i does not depend on the steps, so momentum (or Adam) is accepted; option II
    refuses it and names option I as a fix."""
    build_run(
        _cfg(
            tiny,
            name="scaffold",
            control_variate="option1",
            client_optimizer={"lr": 0.1, "momentum": 0.9},
        )
    )
    with pytest.raises(ConfigError, match="control_variate=option1"):
        build_run(_cfg(tiny, name="scaffold", client_optimizer={"lr": 0.1, "momentum": 0.9}))


def test_many_local_steps_reach_the_global_optimum_where_fedavg_drifts():
    """Heterogeneous curvature (h = 1, 4; a = 3, 0) and K = 10 local steps of η_l = 0.1: the
    global optimum of F_1 + F_2 is Σ h_i a_i / Σ h_i = 0.6. FedAvg's fixed point is off it:
    client 1 maps w to 3 + 0.9¹⁰ (w − 3), client 2 to 0.6¹⁰ w, and the mean of the two has its
    fixed point at w = 1.5 (1 − 0.9¹⁰) / (1 − (0.9¹⁰ + 0.6¹⁰)/2) ≈ 1.188. SCAFFOLD's corrected
    steps follow the global gradient, so it converges to 0.6 whatever K (with exact gradients,
    as here); round 1 (c = c_i = 0) is FedAvg's, so its first move heads for the drift."""
    server, _, round_ = _quadratic_federation(2, curvature={0: 1.0, 1: 4.0}, local_epochs=10)
    q, r = 0.9**10, 0.6**10
    fedavg_fixed_point = 1.5 * (1 - q) / (1 - (q + r) / 2)
    round_(1)
    w1 = float(server.model.weight.detach())
    assert w1 == pytest.approx((3 + q * (1 - 3) + r * 1) / 2, abs=1e-6)  # FedAvg's round 1
    for rnd in range(2, 61):
        round_(rnd)
    w = float(server.model.weight.detach())
    assert w == pytest.approx(0.6, abs=1e-4)
    assert abs(fedavg_fixed_point - 0.6) > 0.5  # the drift it corrects is large


def test_server_control_variate_moves_by_the_sampled_fraction():
    """N = 3 clients, 2 sampled: c += (2/3) · mean Δc_i = (2/3) · (−1.9 + 0.95)/2."""
    server, _, round_ = _quadratic_federation(3)
    round_(1)
    torch.testing.assert_close(server.c["weight"], torch.tensor([[-0.475 * 2 / 3]]))


def test_first_round_is_fedavgs_first_round_bit_for_bit(tiny):
    _, plain, w_plain = _train(tiny, rounds=1, name="fedavg", weighting="uniform")
    _, scaf, w_scaf = _train(tiny, rounds=1, name="scaffold")
    assert w_plain.keys() == w_scaf.keys()
    assert all(torch.equal(w_plain[k], w_scaf[k]) for k in w_plain)
    for key in ("test_accuracy", "test_loss", "train_loss"):
        assert plain[0][key] == scaf[0][key]
    # and the second round differs: the control variates are no longer zero
    _, _, w_plain2 = _train(tiny, rounds=2, name="fedavg", weighting="uniform")
    _, _, w_scaf2 = _train(tiny, rounds=2, name="scaffold")
    assert any(not torch.equal(w_plain2[k], w_scaf2[k]) for k in w_plain2)


def test_messages_are_about_twice_fedavgs_both_ways(tiny):
    """The downlink carries x and c, the uplink Δy_i and Δc_i (the model has no buffers): each is
    FedAvg's message plus one more array per parameter, metered by the real messages."""
    _, plain, _ = _train(tiny, rounds=1, name="fedavg")
    built, scaf, _ = _train(tiny, rounds=1, name="scaffold")
    params = sum(p.numel() * p.element_size() for p in built.model_fn().parameters())
    clients = 4
    for way in ("bytes_up", "bytes_down"):
        assert 1.95 < scaf[0][way] / plain[0][way] < 2.05
        assert scaf[0][way] - plain[0][way] >= clients * params


def test_client_control_variates_survive_a_resume(tmp_path, tiny, monkeypatch):
    """3 of 6 clients a round, cut after round 2: the c_i of the clients sampled so far are in
    the checkpoint (and c in the server's), so the resumed run equals the uninterrupted one."""
    method = {
        "name": "scaffold",
        "local_epochs": 1,
        "batch_size": 16,
        "client_optimizer": {"lr": 0.1},
    }
    cfg = tiny(rounds=4, method=method, **{"clients.num": 6, "clients.per_round": 3})
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)


@pytest.mark.parametrize(
    ("optimizer", "key"),
    [({"name": "adam"}, "client_optimizer.name"), ({"momentum": 0.9}, "client_optimizer.momentum")],
)
def test_a_client_optimizer_option_two_cannot_use_is_refused_by_name(tiny, optimizer, key):
    with pytest.raises(ConfigError, match=rf"{key}=.*SCAFFOLD"):
        build_run(_cfg(tiny, name="scaffold", client_optimizer={"lr": 0.1, **optimizer}))


def test_downlink_carries_the_server_control_variate(tiny):
    built = build_run(_cfg(tiny, name="scaffold"))
    msg = built.method.strategy.configure_round(1, [0])[0]
    names = [k for k, _ in built.model_fn().named_parameters()]
    assert sorted(k for k in msg.arrays if k.startswith(C_PREFIX)) == sorted(
        C_PREFIX + k for k in names
    )


def test_secure_aggregation_composes_by_configuration(tiny):
    """Oracle: plain SCAFFOLD; the secure sum of Δy_i and Δc_i equals it up to the fixed-point
    step, over two rounds (the second uses the c the first aggregated securely)."""
    built, lines, w_secure = _train(tiny, rounds=2, name="scaffold", secure_aggregation=True)
    _, _, w_plain = _train(tiny, rounds=2, name="scaffold")
    assert built.method.applied == ("secure_aggregation",) and lines[0]["phases"] == 4
    for k in w_plain:
        assert float((w_plain[k] - w_secure[k]).abs().max()) < 1e-4


def test_dp_composes_by_configuration(tiny):
    dp = {"mechanism": "gaussian", "noise_multiplier": 0.5, "clip": 1.0}
    built = build_run(_cfg(tiny, dp, name="scaffold"))
    assert built.method.applied == ("dp",)
    sim = built.simulation()
    line = sim.run_round(1)
    sim.close()
    assert line["epsilon"] > 0


def test_freezing_composes_control_variates_cover_the_trained_parameters(tiny):
    built = build_run(_cfg(tiny, name="scaffold", freeze=["features.fc1"]))
    assert built.method.applied == ("freeze",)
    before = built.model_fn().state_dict()
    sim = built.simulation()
    sim.run_round(1)
    sim.run_round(2)
    sim.close()
    after = sim.strategy.eval_model().state_dict()
    frozen = [k for k in before if k.startswith("features.fc1.")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in frozen)
    c = sim.strategy.c
    assert not set(c) & set(frozen) and set(c) == set(before) - set(frozen)


def test_worker_pool_carries_the_client_control_variates(tmp_path, tiny):
    """Clients run in worker processes: their c_i travel with their state, so the run equals
    the in-process one (3 of 6 clients a round: some clients come back with their c_i)."""
    method = {"name": "scaffold", "batch_size": 16, "client_optimizer": {"lr": 0.1}}
    common = {"clients.num": 6, "clients.per_round": 3}
    seq = run_experiment(
        load_config(tiny(rounds=3, method=method, **common)), out=tmp_path / "seq", render=False
    )
    pool = run_experiment(
        load_config(tiny(rounds=3, method=method, **common, **{"clients.workers": 2})),
        out=tmp_path / "pool",
        render=False,
    )
    assert metrics_without_wall(seq) == metrics_without_wall(pool)
