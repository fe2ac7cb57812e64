"""DeComFL: the client's scalars against two-point differences by hand along the drawn
directions, the server's broadcast against the per-(step, direction) mean, the replay of missed
rounds against the server's model bit for bit (in process, in worker processes, after a resume),
one local step against BAFFLE's batch mode with the seeds downlink, the bytes against steps × P
scalars (float32, or 64-bit ring elements up under secure aggregation), and a short run that
lowers the loss."""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fedge.core.config import load_config
from fedge.core.messages import Message
from fedge.estimators.perturbation import normal_chunk
from fedge.experiment.build import build_run
from fedge.methods import decomfl as decomfl_module
from fedge.methods.base import GlobalModel, model_arrays
from fedge.methods.decomfl import DeComFLClient, DeComFLConfig, DeComFLStrategy
from fedge.runtime.engine import decode_state
from tests_helpers import check_scalar_bytes, missed_rounds, record_downlink

P, STEPS = 3, 4


def _method(**kw):
    return {
        "name": "decomfl",
        "p": P,
        "mu": 1e-3,
        "local_steps": STEPS,
        "batch_size": 16,
        "optimizer": {"name": "sgd", "lr": 0.05},
        **kw,
    }


def _sim(tiny, *, per_round=2, num=8, workers=0, draws="torch", dropout=0.0, **method):
    clients = {"clients.num": num, "clients.per_round": per_round, "clients.workers": workers}
    if dropout:
        clients.update({"clients.dropout": dropout, "clients.min_replies": 1})
    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method=_method(**method),
            draws=draws,
            **clients,
        )
    )
    run = build_run(cfg)
    return run.simulation(), run.model_fn


def _inner(sim):
    s = sim.strategy
    while not isinstance(s, DeComFLStrategy):
        s = s.inner
    return s


def _tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


@pytest.mark.parametrize("draws", ["torch", "portable"])
@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_scalars_are_two_point_differences_along_the_drawn_directions(draws, scheme):
    """Step k's scalar p is [f(x + μz) − f(x − μz)] / (2μ) (forward: [f(x + μz) − f(x)] / μ)
    at the local model, z direction kP + p of the round seed from the run's generator; the
    local model moves by the optimizer on (1/P) Σ_p g_p z_p between steps."""
    model = _tiny_model().double()
    cfg = DeComFLConfig(p=P, local_steps=2, mu=1e-4, scheme=scheme, estimator="lean")
    client = DeComFLClient(lambda: model, cfg, draws=draws)
    local = GlobalModel(model, cfg.optimizer.build())
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randint(3, (8,))
    params = dict(model.named_parameters())
    draw = normal_chunk(draws)
    seed, mu = 1234, cfg.mu

    def f(shift):
        with torch.no_grad():
            for n, p in params.items():
                p.add_(shift[n])
            loss = float(F.cross_entropy(model(x), y))
            for n, p in params.items():
                p.sub_(shift[n])
        return loss

    for step in range(2):
        g = client.scalars(local, seed, step, (x, y))
        zs = [
            {n: draw(seed, [step * P + p], n, q.shape)[0].double() for n, q in params.items()}
            for p in range(P)
        ]
        for p, z in enumerate(zs):
            plus = f({n: mu * v for n, v in z.items()})
            if scheme == "central":
                want = (plus - f({n: -mu * v for n, v in z.items()})) / (2 * mu)
            else:
                want = (plus - f({n: 0 * v for n, v in z.items()})) / mu
            assert float(g[p]) == pytest.approx(want, rel=1e-5, abs=1e-6)
        before = {n: q.detach().clone() for n, q in params.items()}
        client.steps.step(local, seed, step, g)
        for n, q in params.items():  # SGD, η = 1e-3, on ĝ = (1/P) Σ_p g_p z_p
            ghat = sum(float(g[p]) * zs[p][n] for p in range(P)) / P
            assert torch.allclose(q.detach(), before[n] - 1e-3 * ghat, atol=1e-9)


@pytest.mark.parametrize("estimator, rel", [("lean", 1e-4), ("jvp", 1e-6)])
def test_central_scalar_is_the_directional_derivative(estimator, rel):
    """Against autograd: g ≈ ∇f·z within the central difference's O(μ²); with ``estimator:
    jvp`` g = ∇f·z up to float32 rounding."""
    model = _tiny_model().double()
    cfg = DeComFLConfig(p=P, local_steps=1, mu=1e-4, estimator=estimator)
    client = DeComFLClient(lambda: model, cfg)
    local = GlobalModel(model, cfg.optimizer.build())
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randint(3, (8,))
    g = client.scalars(local, 7, 0, (x, y))
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(params.values()))
    for p in range(P):
        want = sum(
            float((gr * normal_chunk()(7, [p], n, q.shape)[0].double()).sum())
            for gr, (n, q) in zip(grads, params.items())
        )
        assert float(g[p]) == pytest.approx(want, rel=rel)


def test_broadcast_is_the_weighted_mean_per_step_and_direction():
    """The server's ḡ (what it records and sends) is Σ_c (N_c/N) g_c entry by entry; with equal
    N_c the paper's plain mean."""
    model = _tiny_model()
    cfg = DeComFLConfig(p=P, local_steps=STEPS)
    gen = torch.Generator().manual_seed(3)
    gs = [torch.randn(STEPS * P, generator=gen) for _ in range(3)]
    for ns in ([10, 10, 10], [10, 30, 60]):
        strat = DeComFLStrategy(model, cfg, seed=0, population=3)
        replies = {
            c: Message({"g": g}, config={"num_samples": n}) for c, (g, n) in enumerate(zip(gs, ns))
        }
        strat.configure_round(1, [0, 1, 2])
        strat.aggregate_round(1, replies)
        want = sum(g.double() * (n / sum(ns)) for g, n in zip(gs, ns)).float()
        seed, got = strat.downlink.history[1]
        assert seed == decomfl_module.round_seed(strat.base, 1)
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7)
        if ns[0] == ns[1]:
            assert torch.allclose(got, torch.stack(gs).mean(0), rtol=1e-6, atol=1e-7)
        # the next round's replay message carries exactly this ḡ
        msg = strat.configure_round(2, [0])[0]
        assert torch.equal(msg.arrays["replay_g"][0], got)


@pytest.mark.parametrize(
    "workers, secure, draws, dropout",
    [
        (0, True, "torch", 0.0),
        (2, True, "torch", 0.0),
        (0, False, "portable", 0.0),
        (0, True, "torch", 0.15),
    ],
)
def test_clients_that_missed_rounds_rebuild_the_servers_model_bit_for_bit(
    tiny, workers, secure, draws, dropout
):
    """5 rounds, 2 of 8 clients a round (4, with dropouts in some exchanges): every client holds
    W of the last round it took part in exactly; a client never sampled rebuilds W_6 from the
    seeded W_1 and rounds 1..5; the optimizer (momentum) state is rebuilt too."""
    sim, model_fn = _sim(
        tiny,
        per_round=4 if dropout else 2,
        workers=workers,
        draws=draws,
        dropout=dropout,
        secure_aggregation=secure,
        optimizer={"name": "sgd", "lr": 0.01, "momentum": 0.9},
    )
    strategy = _inner(sim)
    snapshots = {1: model_arrays(strategy.model)}
    failed = 0
    for rnd in range(1, 6):
        failed += sim.run_round(rnd).get("clients_failed", 0)
        snapshots[rnd + 1] = model_arrays(strategy.model)
    sim.close()
    assert (failed > 0) == (dropout > 0)
    held = {c: decode_state(s) for c, s in sim.client_states.items()}
    assert len(held) >= 4
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        want = snapshots[st["at"]]
        assert all(torch.equal(w[k], want[k]) for k in want), (
            f"client {c} differs from W_{st['at']}"
        )
    unseen = [c for c in range(8) if c not in strategy.downlink.synced]
    assert unseen
    msg = strategy.configure_round(6, unseen[:1])[unseen[0]]
    if not dropout:  # with dropouts a round may have failed: no record, so the model is sent
        assert msg.config["new"] is True and msg.arrays["replay_g"].shape == (5, STEPS * P)
    client = DeComFLClient(model_fn, strategy.cfg, draws=draws)
    ctx = SimpleNamespace(rnd=6, cid=unseen[0], state={})
    rebuilt = model_arrays(client.replica.sync(msg, ctx))  # type: ignore[arg-type]
    assert all(torch.equal(rebuilt[k], snapshots[6][k]) for k in snapshots[6])
    opt = strategy.server.opt_state
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            torch.utils._pytree.tree_leaves(client.replica.server.opt_state),
            torch.utils._pytree.tree_leaves(opt),
        )
    )


def test_one_local_step_is_baffle_batch_mode_with_the_seeds_downlink(tiny, monkeypatch):
    """K = 1: the same seeds, μ = σ = 2⁻¹⁰ (so ΔL = 2μ·g both ways is exact), central
    differences, one mini-batch a round, the same optimizer, no clip: the same losses every
    round and the same final model, bit for bit."""
    mu = 2.0**-10
    common = {"clients.num": 5, "clients.per_round": 3, "rounds": 4}

    def run(method):
        cfg = load_config(tiny(model={"name": "mlp", "hidden": [16]}, method=method, **common))
        return build_run(cfg).simulation()

    opt = {"name": "adam", "lr": 0.01, "b1": 0.9, "b2": 0.99}
    baffle = run(
        {
            "name": "baffle",
            "mode": "batch",
            "k": P,
            "sigma": mu,
            "scheme": "central",
            "estimator": "lean",
            "delta_loss_on": "batch",
            "batch_size": 16,
            "clip": None,
            "ema": None,
            "downlink": "seeds",
            "secure_aggregation": False,
            "server_optimizer": opt,
        }
    )
    decomfl = run(
        _method(
            local_steps=1,
            mu=mu,
            estimator="lean",
            optimizer=opt,
            secure_aggregation=False,
        )
    )

    def baffles(base, rnd):  # BAFFLE's s_t, on the server and in every client's replay
        return baffle.strategy.round_seed(rnd)

    monkeypatch.setattr(decomfl_module, "round_seed", baffles)
    program = decomfl.program
    while not isinstance(program, DeComFLClient):
        program = program.inner
    program.replica.round_seed = baffles
    for rnd in range(1, 5):
        a, b = baffle.run_round(rnd), decomfl.run_round(rnd)
        assert a["test_loss"] == b["test_loss"], rnd
    wa, wb = model_arrays(baffle.strategy.model), model_arrays(_inner(decomfl).model)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    baffle.close()
    decomfl.close()


@pytest.mark.filterwarnings("ignore::fedge.core.errors.PrivacyWarning")
@pytest.mark.parametrize("secure", [False, True])
def test_bytes_are_steps_times_p_scalars(tiny, monkeypatch, secure):
    """Up: K·P float32 scalars (4KP bytes), or under secure aggregation the masked [N_i·g, N_i],
    KP + 1 64-bit ring elements (8(KP + 1) bytes); down, each client's message: the run's
    DeComFL seed (8 bytes) and per round it missed that round's KP averaged float32 scalars
    (its round seed derived, not sent; round 1: nothing to replay, every client builds the
    seeded model). Each within 64 bytes of framing a message; the protocol's other messages
    are logged apart (``secagg_bytes_*``)."""
    sent = record_downlink(monkeypatch, DeComFLStrategy)
    sim, _ = _sim(tiny, per_round=3, num=6, secure_aggregation=secure)
    lines = [sim.run_round(rnd) for rnd in (1, 2, 3, 4)]
    sim.close()
    missed = missed_rounds(0, 4, 6, 3)
    assert any(m > 1 for ms in missed.values() for m in ms.values())  # some missed rounds
    up = 8 * (STEPS * P + 1) if secure else 4 * STEPS * P
    check_scalar_bytes(lines, missed, sent, up=up, down=4 * STEPS * P, secure=secure)


@pytest.mark.filterwarnings("ignore::fedge.core.errors.PrivacyWarning")
@pytest.mark.parametrize("secure", [True, False])
def test_the_preset_logs_steps_times_p_scalars(fake_fashion_mnist, tmp_path, monkeypatch, secure):
    """``fedge run decomfl-fmnist-lenet`` (shrunk: 3 rounds, fewer samples; K = 10 steps and P
    = 5 as shipped, 5 of 10 clients a round): its metrics.jsonl's payload bytes are the formula
    of :func:`test_bytes_are_steps_times_p_scalars` for each round's sampled clients."""
    import fedge

    sent = record_downlink(monkeypatch, DeComFLStrategy)
    over = {"rounds": 3, "dataset.limit_train": 100, "dataset.limit_test": 50}
    run = fedge.run(
        "decomfl-fmnist-lenet",
        overrides={**over, "method.secure_aggregation": secure},
        out=tmp_path / "run",
    )
    cfg = run.config
    kp = cfg["method"]["local_steps"] * cfg["method"]["p"]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    missed = missed_rounds(cfg["seed"], 3, cfg["clients"]["num"], cfg["clients"]["per_round"])
    assert any(m > 1 for ms in missed.values() for m in ms.values())
    up = 8 * (kp + 1) if secure else 4 * kp
    check_scalar_bytes(lines, missed, sent, up=up, down=4 * kp, secure=secure)


def test_secure_aggregation_is_on_by_default_and_gives_the_plain_update(tiny):
    """Oracle: the same run with secure aggregation off; the masked sum gives ḡ up to the
    fixed-point step, so the model after two rounds is the same within rounding."""

    def build(**method):
        cfg = load_config(tiny(model={"name": "mlp", "hidden": [16]}, method=_method(**method)))
        return build_run(cfg)

    secure, plain = build(), build(secure_aggregation=False)
    assert secure.method.applied == ("secure_aggregation",) and plain.method.applied == ()
    ws = []
    for built in (secure, plain):
        sim = built.simulation()
        for rnd in (1, 2):
            sim.run_round(rnd)
        ws.append(model_arrays(_inner(sim).model))
        sim.close()
    moved = model_arrays(secure.model_fn())
    for k in ws[1]:
        assert float((ws[0][k] - ws[1][k]).abs().max()) < 1e-5, k
    assert any(not torch.equal(ws[1][k], moved[k]) for k in moved)


def test_dp_and_freezing_compose_by_configuration(tiny):
    """DP on the summed scalars; a frozen layer is neither perturbed nor moved."""
    dp = {"mechanism": "gaussian", "noise_multiplier": 0.5, "clip": 1.0}
    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method=_method(freeze=["features.fc1"]),
            privacy=dp,
        )
    )
    built = build_run(cfg)
    assert "dp" in built.method.applied and "freeze" in built.method.applied
    before = built.model_fn().state_dict()
    sim = built.simulation()
    line = sim.run_round(1)
    after = _inner(sim).model.state_dict()
    sim.close()
    assert line["epsilon"] > 0
    frozen = [k for k in before if k.startswith("features.fc1.")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in frozen)


def test_a_resumed_run_equals_the_uninterrupted_one(tiny, tmp_path):
    """3 rounds, then ``resume`` to 5: the history of ḡ, the optimizer state and each client's
    held model come back, so every round's loss and bytes and the final model are the same."""
    import fedge

    def cfg(rounds):
        return tiny(
            rounds=rounds,
            model={"name": "mlp", "hidden": [16]},
            method=_method(optimizer={"name": "sgd", "lr": 0.01, "momentum": 0.9}),
            **{"clients.num": 6, "clients.per_round": 2},
        )

    full = fedge.run(cfg(5), out=tmp_path / "full")
    fedge.run(cfg(3), out=tmp_path / "cut")
    resumed = fedge.resume(tmp_path / "cut", rounds=5)

    def curve(run):
        return [(m["round"], m["test_loss"], m["bytes_up"], m["bytes_down"]) for m in run.metrics]

    assert curve(resumed) == curve(full)
    a, b = resumed.model.state_dict(), full.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_after_a_resume_with_workers_every_client_holds_the_servers_model(tiny, tmp_path):
    """5 rounds, 2 of 8 clients a round (so clients miss rounds), ``clients.workers=2``, SGD with
    momentum, secure aggregation on (the default): cut after round 3 and resumed
    (``fedge.resume``, as ``fedge run --resume``) to 5. Every client's held model and optimizer
    state in the final checkpoint equal bit for bit the server's of the round it holds, the
    server's taken round by round from an uninterrupted run in the engine's process; the resumed
    run's final model is that run's."""
    import fedge
    from fedge.core import transforms as T

    def cfg(rounds, workers):
        return tiny(
            rounds=rounds,
            model={"name": "mlp", "hidden": [16]},
            method=_method(optimizer={"name": "sgd", "lr": 0.01, "momentum": 0.9}),
            **{"clients.num": 8, "clients.per_round": 2, "clients.workers": workers},
        )

    sim = build_run(load_config(cfg(5, 0))).simulation()
    strategy = _inner(sim)

    def server_state():
        opt = T.state_to_arrays(strategy.server.opt_state, prefix="opt/")
        return {**{"w/" + k: v for k, v in model_arrays(strategy.model).items()}, **opt}

    snapshots = {1: server_state()}
    for rnd in range(1, 6):
        sim.run_round(rnd)
        snapshots[rnd + 1] = server_state()
    sim.close()

    fedge.run(cfg(3, 2), out=tmp_path / "cut")
    resumed = fedge.resume(tmp_path / "cut", rounds=5)
    state = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert state["record"]["round"] == 5
    held = {c: decode_state(b) for c, b in state["client_states"].items()}
    assert len(held) >= 4 and any(st["at"] < 5 for st in held.values())  # some missed rounds
    for c, st in held.items():
        want = snapshots[st["at"]]
        assert any(k.startswith("opt/") for k in want)  # the momentum buffers
        got = {k: v for k, v in st.items() if k.startswith(("w/", "opt/"))}
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), c
    final = model_arrays(resumed.model)
    assert all(torch.equal(final[k], snapshots[6]["w/" + k]) for k in final)


def test_a_short_run_lowers_the_loss(tiny):
    sim, _ = _sim(tiny, per_round=4, num=4, optimizer={"name": "sgd", "lr": 0.05})
    losses = [sim.run_round(rnd)["test_loss"] for rnd in range(1, 7)]
    sim.close()
    assert losses[-1] < losses[0] - 0.2, losses


def test_reply_of_the_wrong_shape_is_refused():
    strat = DeComFLStrategy(_tiny_model(), DeComFLConfig(p=2, local_steps=3), seed=0, population=1)
    with pytest.raises(Exception, match=r"expected g of shape \(6,\)"):
        strat.check_reply(1, 0, Message({"g": torch.zeros(3)}, config={"num_samples": 1}))
