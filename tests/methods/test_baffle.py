"""BAFFLE: protocol bytes, server estimate against Eq. (6)-(7) written out, secure aggregation
against the plain aggregate, the EMA against its recurrence, configuration rules."""

import warnings

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.errors import ConfigError, MessageError, PrivacyWarning
from fedge.core.messages import Message
from fedge.estimators import combine_loss_differences
from fedge.experiment.build import build_run
from fedge.methods import get_method
from fedge.methods.baffle import BaffleBatchStrategy, BaffleConfig, clip_inf_norm

#: the method.* section of a BAFFLE run: its config plus the mechanisms' options
BAFFLE_SECTION = get_method("baffle").section


def _cfg(tiny, **method):
    base = {"name": "baffle", "k": 8, "batch_size": 16, **method}
    return load_config(
        tiny(model={"name": "logreg"}, method=base, **{"clients.num": 4, "clients.per_round": 4})
    )


def _model():
    """Weights from an explicit generator (no global RNG)."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def test_a_partial_server_optimizer_tunes_the_modes_default():
    batch = BaffleConfig(mode="batch", server_optimizer={"lr": 0.03}).server_optimizer
    assert (batch.name, batch.lr, batch.b1, batch.b2) == (
        "adam",
        0.03,
        0.9,
        0.99,
    )  # not an SGD at lr 0.03
    epoch = BaffleConfig(
        server_optimizer={"momentum": 0.9}
    ).server_optimizer  # mode defaults to epoch
    assert (epoch.name, epoch.lr, epoch.momentum) == ("sgd", 1.0, 0.9)
    named = BaffleConfig(mode="batch", server_optimizer={"name": "sgd", "lr": 0.5}).server_optimizer
    assert (named.name, named.lr) == (
        "sgd",
        0.5,
    )  # naming the optimizer starts from its own defaults


def test_config_rules():
    assert BaffleConfig(mode="batch").server_optimizer.name == "adam"
    assert (
        BAFFLE_SECTION(mode="batch").secure_aggregation is True
    )  # the paper's Eq. (7) relies on it
    assert BAFFLE_SECTION(mode="epoch").secure_aggregation is False
    assert BAFFLE_SECTION(mode="batch", shared_perturbations=False).secure_aggregation is False
    assert BaffleConfig(mode="epoch").server_optimizer.name == "sgd"
    assert (
        BAFFLE_SECTION(mode="epoch", secure_aggregation=True).secure_aggregation is True
    )  # its model deltas, as fedavg's
    with pytest.raises(ValueError, match="shared_perturbations"):
        BAFFLE_SECTION(mode="batch", secure_aggregation=True, shared_perturbations=False)


def test_unknown_method_key_is_rejected(tiny):
    with pytest.raises(ConfigError, match="method.kk"):
        build_run(_cfg(tiny, kk=3))


def test_batch_uplink_is_4k_plus_small_framing(tiny):
    for k in (8, 100):
        built = build_run(_cfg(tiny, mode="batch", k=k, secure_aggregation=False))
        line = built.simulation().run_round(1)
        per_client = line["bytes_up"] / line["clients"]
        assert 4 * k <= per_client <= 4 * k + 64


def test_server_estimate_equals_oracle_on_two_clients():
    """Eq. (7) then Eq. (6), written out: ĝ = 1/(Kσ) Σ_k (Σ_c N_c/N ΔL_{c,k}) z_k (forward scheme),
    z_k from the shared perturbation stream of the round's seed."""
    from fedge.estimators.perturbation import standard_normal

    cfg = BaffleConfig(mode="batch", k=6, sigma=1e-3, clip=None)
    strat = BaffleBatchStrategy(_model(), cfg, seed=5)
    g = torch.Generator().manual_seed(0)
    d0, d1 = torch.randn(6, generator=g), torch.randn(6, generator=g)
    replies = {
        0: Message({"dL": d0}, {"num_samples": 1}),
        1: Message({"dL": d1}, {"num_samples": 3}),
    }
    got = strat.estimate(1, replies)
    combined = 0.25 * d0.double() + 0.75 * d1.double()
    seed = strat.round_seed(1)
    assert got.keys() == dict(strat.model.named_parameters()).keys()
    for name, p in strat.model.named_parameters():
        want = sum(
            float(combined[k]) * standard_normal(seed, k, name, p.shape).double() for k in range(6)
        ) / (6 * 1e-3)
        torch.testing.assert_close(got[name].double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        combine_loss_differences([d0, d1], [1, 3]).double(), combined, rtol=1e-6, atol=1e-7
    )


def test_independent_perturbations_use_one_seed_per_client():
    cfg = BaffleConfig(mode="batch", k=4, shared_perturbations=False)
    strat = BaffleBatchStrategy(_model(), cfg, seed=0)
    msgs = strat.configure_round(1, [0, 1])
    assert [msgs[c].config["seed"] for c in (0, 1)] == [
        strat.round_seed(1, 0),
        strat.round_seed(1, 1),
    ]
    assert msgs[0].config["seed"] != msgs[1].config["seed"]
    shared_strat = BaffleBatchStrategy(_model(), BaffleConfig(mode="batch", k=4), seed=0)
    shared = shared_strat.configure_round(1, [0, 1])
    assert shared[0].config["seed"] == shared[1].config["seed"] == shared_strat.round_seed(1)
    assert shared[0].to_bytes() == shared[1].to_bytes()  # one broadcast: the same bytes for all
    assert (
        shared_strat.configure_round(2, [0])[0].config["seed"] != shared[0].config["seed"]
    )  # fresh per round


def test_malformed_loss_differences_are_rejected():
    strat = BaffleBatchStrategy(_model(), BaffleConfig(mode="batch", k=4), seed=0)
    with pytest.raises(MessageError, match="client 3"):
        strat.estimate(1, {3: Message({"dL": torch.zeros(5)}, {"num_samples": 2})})


def test_clip_inf_norm():
    g = {"a": torch.tensor([0.6, -1.2]), "b": torch.tensor([0.3])}
    out = clip_inf_norm(g, 0.3)
    assert max(float(v.abs().max()) for v in out.values()) == pytest.approx(0.3, rel=1e-4)
    assert torch.allclose(out["a"] / out["b"], g["a"] / g["b"])
    assert clip_inf_norm(g, None) is g


def test_secure_aggregation_matches_plain_aggregate(tiny):
    plain = build_run(_cfg(tiny, mode="batch", ema=None, secure_aggregation=False)).simulation()
    secure = build_run(_cfg(tiny, mode="batch", ema=None, secure_aggregation=True)).simulation()
    for rnd in (1, 2):
        plain.run_round(rnd)
        line = secure.run_round(rnd)
    assert line["phases"] == 4 and line["secagg_survivors"] == 4
    start = (
        build_run(_cfg(tiny, mode="batch", ema=None, secure_aggregation=False))
        .model_fn()
        .state_dict()
    )
    moved = 0.0
    for (k, a), b in zip(
        plain.strategy.model.state_dict().items(), secure.strategy.model.state_dict().values()
    ):
        # Adam divides by sqrt(v): a coordinate whose estimate is near 0 turns the 2^-32
        # fixed-point step into ~1e-6 of weight; the loss differences themselves agree to 1e-9.
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), k
        moved = max(moved, float((a - start[k]).abs().max()))
    assert moved > 1e-3  # training moved the model far beyond the tolerance: the check has teeth


def test_secure_aggregation_with_dropout_uses_survivors_only(tiny):
    cfg = _cfg(tiny, mode="batch", ema=None, secure_aggregation=True, secagg_dropout=0.25)
    line = build_run(cfg).simulation().run_round(1)
    assert line["secagg_dropped"] == 1 and line["secagg_survivors"] == 3


def test_secure_aggregation_runs_in_worker_processes(tiny):
    """Client secrets live in the round state, so they cross worker processes between steps."""
    lines = []
    for workers in (0, 2):
        cfg = _cfg(tiny, mode="batch", ema=None, secure_aggregation=True)
        cfg = load_config(
            {**cfg.to_dict(), "clients": {**cfg.to_dict()["clients"], "workers": workers}}
        )
        sim = build_run(cfg).simulation()
        lines.append(sim.run_round(1))
        sim.close()
    assert lines[0]["secagg_survivors"] == lines[1]["secagg_survivors"] == 4
    assert lines[0]["test_loss"] == pytest.approx(lines[1]["test_loss"], abs=1e-6)


@pytest.mark.parametrize("mode", ["batch", "epoch"])
def test_lean_and_fast_estimators_give_the_same_run(tiny, mode):
    runs = []
    for est in ("lean", "fast"):
        sim = build_run(
            _cfg(tiny, mode=mode, estimator=est, max_steps=2, batch_size=8)
        ).simulation()  # batched path
        runs.append([sim.run_round(r)["test_loss"] for r in (1, 2)])
    # the two modes sum the forward in different orders: ΔL agree to ~1e-6 absolute, which
    # after division by σ and a few local steps moves the loss by ~1e-4 relative
    assert runs[0] == pytest.approx(runs[1], rel=1e-3)
    # round 2 moved the loss by several times the tolerance: agreement is not a tie by standing still
    assert abs(runs[0][1] - runs[0][0]) > 3e-3 * abs(runs[0][0])


def test_epoch_level_learns_and_ema_is_evaluated(tiny):
    """The evaluated model is the EMA of the global models after each round (warm-up decay
    min(0.995, (1+n)/(10+n)), n = previous updates), starting from the initial model."""
    built = build_run(_cfg(tiny, mode="epoch", k=20, sigma=1e-3))
    sim = built.simulation()
    avg = {k: v.detach().double().clone() for k, v in sim.strategy.model.state_dict().items()}
    losses = []
    for n, r in enumerate(range(1, 6)):
        losses.append(sim.run_round(r)["test_loss"])
        d = min(0.995, (1 + n) / (10 + n))
        for k, v in sim.strategy.model.state_dict().items():
            avg[k] = d * avg[k] + (1 - d) * v.double()
    assert losses[-1] < losses[0]
    ema = sim.strategy.eval_model().state_dict()
    now = sim.strategy.model.state_dict()
    for k in avg:
        torch.testing.assert_close(ema[k].double(), avg[k], rtol=1e-5, atol=1e-6)
    assert max(float((ema[k] - now[k]).abs().max()) for k in now) > 1e-3  # the average is not W


def test_batch_mode_without_secure_aggregation_warns_naming_the_risk(tiny):
    from fedge.core.errors import PrivacyWarning

    with pytest.warns(PrivacyWarning, match="directional derivatives"):
        build_run(_cfg(tiny, mode="batch", secure_aggregation=False))


def test_delta_loss_on_the_local_set_equals_one_forward_over_it(tiny):
    """Algorithm 1 line 12: ΔL over D_c. Chunked (batch_size 16) it must equal the loss
    differences of one pass over the whole local set (the oracle)."""
    import torch.nn.functional as F

    from fedge.estimators import loss_differences
    from fedge.methods.baffle import BaffleBatchClient

    built = build_run(
        _cfg(tiny, mode="batch", ema=None, secure_aggregation=False, delta_loss_on="local_set")
    )
    msg = built.method.strategy.configure_round(1, [0])[0]
    client = BaffleBatchClient(built.model_fn, built.method_config)
    sim = built.simulation()
    from fedge.runtime.executor import ClientTask, execute_client

    res = execute_client(
        client,
        built.clients[0],
        ClientTask(0, 1, 0, msg.to_bytes(), None, None, {}),
        seed=0,
        measure_flops=False,
        measure_memory=False,
        parties={},
    )
    got = Message.from_bytes(res.reply).arrays["dL"]
    x, y = built.clients[0].tensors()
    model = built.model_fn()
    want = loss_differences(
        model,
        F.cross_entropy,
        (x, y),
        k=8,
        sigma=built.method_config.sigma,
        seed=msg.config["seed"],
        scheme="forward",
    )
    assert x.shape[0] > 16  # several chunks
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    sim.close()


@pytest.mark.parametrize("mode", ["batch", "epoch"])
def test_freeze_composes_with_baffle(tiny, mode):
    """method.freeze on BAFFLE: frozen coordinates are never perturbed (the estimate holds no
    entry for them) and never change; the rest trains."""
    from fedge.core.config import load_config
    from fedge.models.blocks import resolve_freeze

    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method={
                "name": "baffle",
                "mode": mode,
                "k": 8,
                "batch_size": 16,
                "ema": None,
                "secure_aggregation": False,
                "freeze": ["features.fc1"],
                "max_steps": 2,
            },
        )
    )
    built = build_run(cfg)
    frozen = resolve_freeze(built.model_fn(), ["features.fc1"])
    assert frozen and all(
        not dict(built.method.strategy.model.named_parameters())[n].requires_grad for n in frozen
    )
    before = {k: v.clone() for k, v in built.method.strategy.model.state_dict().items()}
    sim = built.simulation()
    if mode == "batch":
        strategy = built.method.strategy
        replies = {0: Message({"dL": torch.ones(8)}, {"num_samples": 3})}
        g = strategy.estimate(1, replies)
        assert set(g).isdisjoint(frozen) and g  # no perturbation, no estimate for frozen tensors
    for r in (1, 2):
        sim.run_round(r)
    after = sim.strategy.model.state_dict()
    assert all(torch.equal(after[n], before[n]) for n in frozen)
    assert any(
        not torch.equal(after[n], before[n])
        for n in after
        if n not in frozen and after[n].is_floating_point()
    )


def test_epoch_mode_persistent_adam_equals_one_adam_per_client_driven_by_hand():
    """Oracle: two rounds of epoch-level BAFFLE, two clients, ``client_optimizer.state=persistent``
    (the client program with its state serialized between rounds as the engine does, FedAvg's
    server at lr 1) equal a hand loop that keeps one ``torch.optim.Adam`` per client for the whole
    run and steps it on the same zeroth-order estimates; a fresh Adam each round differs."""
    import torch.nn.functional as F

    from fedge.core.context import ClientContext, ClientData, decode_state, encode_state
    from fedge.core.meter import Meter
    from fedge.estimators import zeroth_order_gradient
    from fedge.methods.baffle import zeroth_order_gradient_fn
    from fedge.methods.local import LocalTraining

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)
    shards = {0: torch.arange(0, 8), 1: torch.arange(8, 12)}
    opt = {"name": "adam", "lr": 0.05, "b1": 0.9, "b2": 0.99, "state": "persistent"}
    cfg = BaffleConfig(mode="epoch", k=4, sigma=1e-3, batch_size=3, client_optimizer=opt)

    def ctx(cid, rnd, state):
        return ClientContext(
            cid=cid,
            rnd=rnd,
            data=ClientData(x, y, shards[cid]),
            generator=torch.Generator().manual_seed(100 * rnd + cid),
            meter=Meter(),
            state=state,
        )

    def fedge_rounds(cfg):
        client = LocalTraining.from_config(
            _model, cfg, gradient_fn=zeroth_order_gradient_fn(cfg, threads=1)
        )
        w = dict(_model().state_dict())
        states = {c: b"" for c in shards}
        for rnd in (1, 2):
            deltas = {}
            for c in shards:
                cx = ctx(c, rnd, decode_state(states[c]))
                deltas[c] = client.run(Message({k: v.clone() for k, v in w.items()}), cx).arrays
                states[c] = encode_state(cx.state) if cx.state else b""
            n = {c: len(shards[c]) for c in shards}
            w = {k: w[k] + sum(deltas[c][k] * (n[c] / 12) for c in shards) for k in w}
        return w

    # the oracle: one model and one torch Adam per client, built once
    spec = cfg.zo_spec(workers=1)
    models = {c: _model() for c in shards}
    adams = {
        c: torch.optim.Adam(models[c].parameters(), lr=0.05, betas=(0.9, 0.99)) for c in shards
    }
    w = dict(_model().state_dict())
    for rnd in (1, 2):
        deltas = {}
        for c, m in models.items():
            m.load_state_dict(w)
            cx = ctx(c, rnd, {})
            for batch in cx.data.batches(3, generator=cx.generator):
                seed = int(torch.randint(0, 2**62, (1,), generator=cx.generator))
                est = zeroth_order_gradient(m, F.cross_entropy, batch, spec, seed=seed)
                for name, p in m.named_parameters():
                    p.grad = clip_inf_norm(est, 0.3)[name]
                adams[c].step()
                adams[c].zero_grad(set_to_none=True)
            deltas[c] = {k: v.detach() - w[k] for k, v in m.state_dict().items()}
        w = {k: w[k] + sum(deltas[c][k] * (len(shards[c]) / 12) for c in shards) for k in w}
    got = fedge_rounds(cfg)
    for k in w:
        torch.testing.assert_close(got[k], w[k], rtol=0, atol=0)
    fresh = fedge_rounds(
        cfg.model_copy(
            update={"client_optimizer": cfg.client_optimizer.model_copy(update={"state": "fresh"})}
        )
    )
    assert any(not torch.equal(fresh[k], w[k]) for k in w)


@pytest.mark.parametrize("mode", ["batch", "epoch"])
def test_prefix_once_trains_the_same_model_with_fewer_client_flops(tiny, mode):
    """``method.prefix_once`` with the first layer frozen: the same global model round by round
    as the full forwards (the frozen prefix's output is one tensor every perturbed forward
    reads), and the engine meters fewer client FLOPs (what ran)."""

    def run(prefix_once):
        section = {
            "name": "baffle",
            "mode": mode,
            "k": 6,
            "batch_size": 16,
            "estimator": "lean",
            "ema": None,
            "secure_aggregation": False,
            "freeze": ["features.fc1"],
            "max_steps": 2,
            "prefix_once": prefix_once,
        }
        cfg = load_config(tiny(rounds=2, model={"name": "mlp", "hidden": [16]}, method=section))
        sim = build_run(cfg).simulation()
        try:
            lines = [sim.run_round(r) for r in (1, 2)]
            return lines, {k: v.clone() for k, v in sim.strategy.model.state_dict().items()}
        finally:
            sim.close()

    (full_lines, full_w), (once_lines, once_w) = run(False), run(True)
    assert all(torch.equal(full_w[k], once_w[k]) for k in full_w)
    for a, b in zip(full_lines, once_lines, strict=True):
        assert a["test_loss"] == b["test_loss"]
        assert 0 < b["client_flops"] < a["client_flops"]


@pytest.mark.parametrize("mode", ["batch", "epoch"])
def test_a_jvp_run_is_labelled_forward_mode_in_every_round_and_the_summary(tmp_path, tiny, mode):
    """``estimator: jvp`` is forward-mode differentiation, not inference only: every round line
    and the run's summary carry ``forward_mode_ad = 1``; a finite-difference run carries no flag."""
    import json

    from fedge.experiment.run import run_experiment

    def run(estimator, out):
        section = {
            "name": "baffle",
            "mode": mode,
            "k": 4,
            "batch_size": 16,
            "max_steps": 2,
            "estimator": estimator,
            "secure_aggregation": False,
        }
        cfg = load_config(tiny(rounds=2, model={"name": "mlp", "hidden": [8]}, method=section))
        path = run_experiment(cfg, out=tmp_path / out, render=False)
        lines = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        return [x for x in lines if "round" in x], json.loads((path / "summary.json").read_text())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        lines, summary = run("jvp", "jvp")
        fd_lines, fd_summary = run("lean", "fd")
    assert [x.get("forward_mode_ad") for x in lines] == [1, 1]
    assert summary["forward_mode_ad"] == 1
    assert all("forward_mode_ad" not in x for x in fd_lines) and "forward_mode_ad" not in fd_summary
    assert lines[-1]["test_loss"] != fd_lines[-1]["test_loss"]  # a different estimate


def test_guided_directions_span_the_last_updates_the_server_sent_and_it_rebuilds_from_them():
    """``guided_rank: 2``: the server keeps its last 2 global updates (oracle: the model's change
    each round), sends them with the model, and the client's K loss differences and the server's
    rebuild both use guided directions in their span, equal to the ones built by hand from the
    oracle updates."""
    import dataclasses

    import torch.nn.functional as F

    from fedge.core.context import ClientContext, ClientData
    from fedge.core.meter import Meter
    from fedge.estimators import estimate_gradient, loss_differences
    from fedge.estimators.directions import guided_directions
    from fedge.methods.baffle import BaffleBatchClient

    cfg = BaffleConfig(mode="batch", k=6, sigma=1e-3, guided_rank=2, guided_share=0.5)
    strategy = BaffleBatchStrategy(_model(), cfg, seed=0)
    client = BaffleBatchClient(_model, cfg)
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(9, 4, generator=g), torch.randint(0, 3, (9,), generator=g)
    updates: list[dict[str, torch.Tensor]] = []
    for rnd in (1, 2, 3):
        msg = strategy.configure_round(rnd, [0])[0]
        sent = sorted(k for k in msg.arrays if k.startswith("guide/"))
        assert sent == sorted(
            f"guide/{i}/{n}" for i in range(len(updates)) for n in ("1.weight", "1.bias")
        )
        ctx = ClientContext(
            cid=0,
            rnd=rnd,
            data=ClientData(x, y, torch.arange(9)),
            generator=torch.Generator(),
            meter=Meter(),
        )
        reply = client.run(msg, ctx)
        params = {k: v.detach().clone() for k, v in strategy.model.named_parameters()}
        shapes = {k: v.shape for k, v in params.items()}
        # the client's own spec (fast estimator), its directions built by hand
        spec = dataclasses.replace(
            client.spec, directions=guided_directions(updates, shapes, 6, 0.5)
        )
        model = _model()
        model.load_state_dict(params)
        want_dl = loss_differences(model, F.cross_entropy, (x, y), spec, seed=msg.config["seed"])
        assert torch.equal(reply.arrays["dL"], want_dl)
        got = strategy.estimate(rnd, {0: reply})
        want = estimate_gradient(params, want_dl, spec, seed=msg.config["seed"])
        assert all(torch.equal(got[k], want[k]) for k in want)
        strategy.aggregate_round(rnd, {0: reply})
        now = {k: v.detach() for k, v in strategy.model.named_parameters()}
        updates = [{k: now[k] - params[k] for k in now}, *updates][:2]
    assert len(strategy.guides) == 2
    for mine, theirs in zip(strategy.guides, updates, strict=True):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_guided_directions_resume_to_the_uninterrupted_run(tmp_path, tiny, monkeypatch):
    """The server's last updates are checkpointed: a guided run cut after round 2 resumes to the
    uninterrupted metrics (and differs from the unguided run)."""
    from fedge.experiment.resume import resume_experiment
    from fedge.experiment.run import run_experiment
    from tests_helpers import metrics_without_wall, run_cut_after

    section = {"name": "baffle", "mode": "batch", "k": 6, "batch_size": 16, "guided_rank": 2}
    cfg = tiny(rounds=4, model={"name": "mlp", "hidden": [8]}, method=section)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
        run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
        resume_experiment(tmp_path / "cut", render=False)
        plain = tiny(
            rounds=4, model={"name": "mlp", "hidden": [8]}, method={**section, "guided_rank": 0}
        )
        unguided = run_experiment(load_config(plain), out=tmp_path / "plain", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)
    assert metrics_without_wall(unguided) != metrics_without_wall(full)


def test_guided_directions_need_batch_mode_the_model_downlink_and_gaussian_directions():
    with pytest.raises(ValueError, match="guided_rank=2 needs mode=batch"):
        BaffleConfig(mode="epoch", guided_rank=2)
    with pytest.raises(ValueError, match="downlink=model"):
        BaffleConfig(mode="batch", guided_rank=2, downlink="seeds")


def test_k_and_sigma_schedules_give_each_round_its_own_k_and_sigma():
    """Oracle: σ_t = σ·decay^(t−1) and K_t = round(k + (k_final − k)(t − 1)/(T − 1)); no
    schedule leaves the spec as it is (runs without one are unchanged)."""
    from fedge.methods.baffle.config import round_spec

    cfg = BaffleConfig(mode="epoch", k=10, k_final=40, sigma=1e-3, sigma_decay=0.5)
    spec = cfg.zo_spec()
    got = [(s.k, s.sigma) for s in (round_spec(spec, cfg, t, 5) for t in range(1, 6))]
    assert got == [(10, 1e-3), (18, 5e-4), (25, 2.5e-4), (32, 1.25e-4), (40, 6.25e-5)]
    plain = BaffleConfig(mode="epoch")
    assert round_spec(plain.zo_spec(), plain, 7, 9) == plain.zo_spec()
    with pytest.raises(ValueError, match="k_final=40 .* needs mode=epoch"):
        BaffleConfig(mode="batch", k_final=40)
    with pytest.raises(ValueError, match="sigma_decay=0.5 with downlink=seeds"):
        BaffleConfig(mode="batch", downlink="seeds", sigma_decay=0.5)


def _epoch_client_estimate(cfg, model, *, rnd, rounds):
    """The epoch-mode client's local estimate on a fixed batch in round ``rnd`` (of ``rounds``),
    the seed its generator draws for it, and the batch."""
    from fedge.core.context import ClientContext, ClientData
    from fedge.core.meter import Meter
    from fedge.methods.baffle import zeroth_order_gradient_fn

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)
    ctx = ClientContext(
        cid=0,
        rnd=rnd,
        data=ClientData(x, y, torch.arange(6)),
        generator=torch.Generator().manual_seed(5),
        meter=Meter(),
    )
    _, got = zeroth_order_gradient_fn(cfg, threads=1, rounds=rounds)(model, (x, y), ctx, None)
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(5)))
    return got, seed, (x, y)


def test_the_epoch_client_estimates_with_the_round_s_k_and_sigma():
    """Oracle: round 3's local estimate is zeroth_order_gradient with K_3 and σ_3 on the seed the
    client's generator draws, then clipped."""
    import dataclasses

    import torch.nn.functional as F

    from fedge.estimators import zeroth_order_gradient

    cfg = BaffleConfig(mode="epoch", k=4, k_final=12, sigma=1e-2, sigma_decay=0.8)
    model = _model()
    got, seed, (x, y) = _epoch_client_estimate(cfg, model, rnd=3, rounds=5)
    spec = dataclasses.replace(cfg.zo_spec(workers=1), k=8, sigma=1e-2 * 0.8**2)
    want = clip_inf_norm(
        zeroth_order_gradient(model, F.cross_entropy, (x, y), spec, seed=seed), 0.3
    )
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_batch_mode_client_and_server_use_the_round_s_sigma():
    """Oracle: round 3 of a σ schedule: the client's K differences are loss_differences at
    σ·decay², and the server's estimate is estimate_gradient at that σ."""
    import dataclasses

    import torch.nn.functional as F

    from fedge.core.context import ClientContext, ClientData
    from fedge.core.meter import Meter
    from fedge.estimators import estimate_gradient, loss_differences
    from fedge.methods.baffle import BaffleBatchClient

    cfg = BaffleConfig(mode="batch", k=5, sigma=1e-2, sigma_decay=0.5)
    strategy, client = BaffleBatchStrategy(_model(), cfg, seed=0), BaffleBatchClient(_model, cfg)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(7, 4, generator=g), torch.randint(0, 3, (7,), generator=g)
    msg = strategy.configure_round(3, [0])[0]
    ctx = ClientContext(
        cid=0,
        rnd=3,
        data=ClientData(x, y, torch.arange(7)),
        generator=torch.Generator(),
        meter=Meter(),
    )
    reply = client.run(msg, ctx)
    spec = dataclasses.replace(client.spec, sigma=1e-2 * 0.25)
    want = loss_differences(_model(), F.cross_entropy, (x, y), spec, seed=msg.config["seed"])
    assert torch.equal(reply.arrays["dL"], want)
    got = strategy.estimate(3, {0: reply})
    rebuilt = estimate_gradient(
        dict(_model().named_parameters()), want, spec, seed=msg.config["seed"]
    )
    assert all(torch.equal(got[k], rebuilt[k]) for k in rebuilt)


def _two_layers():
    """Two linear layers of different weight scales, from an explicit generator."""
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (3.0 if name.startswith("1.") else 0.5))
    return model


def _layer_scaled(spec, model):
    import dataclasses

    from fedge.estimators.directions import layer_scaled, layer_scales, make_directions

    params = dict(model.named_parameters())
    shapes = {n: p.shape for n, p in params.items()}
    dirs = make_directions(spec.directions, shapes, spec.k, draws=spec.draws)
    return dataclasses.replace(spec, directions=layer_scaled(dirs, layer_scales(params)))


def test_batch_mode_client_and_server_scale_sigma_by_the_round_model_s_layers():
    """``sigma_scale: layer``, two rounds: the client's K differences are loss_differences along
    directions scaled by the layer scales of the model it received, and the server's estimate is
    estimate_gradient with the scales of its own model (the same weights); round 2's scales are
    those of round 2's model, not round 1's. A one-layer model's scales are all 1: unchanged."""
    import torch.nn.functional as F

    from fedge.core.context import ClientContext, ClientData
    from fedge.core.meter import Meter
    from fedge.estimators import estimate_gradient, loss_differences
    from fedge.estimators.directions import layer_scales
    from fedge.methods.baffle import BaffleBatchClient

    assert list(layer_scales(dict(_model().named_parameters())).values()) == pytest.approx([1, 1])
    cfg = BaffleConfig(mode="batch", k=5, sigma=1e-2, sigma_scale="layer")
    strategy = BaffleBatchStrategy(_two_layers(), cfg, seed=0)
    client = BaffleBatchClient(_two_layers, cfg)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(7, 4, generator=g), torch.randint(0, 3, (7,), generator=g)
    for rnd in (1, 2):
        msg = strategy.configure_round(rnd, [0])[0]
        ctx = ClientContext(
            cid=0,
            rnd=rnd,
            data=ClientData(x, y, torch.arange(7)),
            generator=torch.Generator(),
            meter=Meter(),
        )
        reply = client.run(msg, ctx)
        model = _two_layers()
        model.load_state_dict(strategy.model.state_dict())
        spec = _layer_scaled(client.spec, model)
        want = loss_differences(model, F.cross_entropy, (x, y), spec, seed=msg.config["seed"])
        assert torch.equal(reply.arrays["dL"], want)
        plain = loss_differences(
            model, F.cross_entropy, (x, y), client.spec, seed=msg.config["seed"]
        )
        assert not torch.equal(want, plain)
        got = strategy.estimate(rnd, {0: reply})
        rebuilt = estimate_gradient(
            dict(model.named_parameters()), want, spec, seed=msg.config["seed"]
        )
        assert all(torch.equal(got[k], rebuilt[k]) for k in rebuilt)
        strategy.aggregate_round(rnd, {0: reply})


def test_the_epoch_client_scales_sigma_by_its_current_layers():
    """Oracle: the local estimate is zeroth_order_gradient along directions scaled by the layer
    scales of the client's model as it is at that step, then clipped."""
    import torch.nn.functional as F

    from fedge.estimators import zeroth_order_gradient

    cfg = BaffleConfig(mode="epoch", k=4, sigma=1e-2, sigma_scale="layer")
    model = _two_layers()
    got, seed, (x, y) = _epoch_client_estimate(cfg, model, rnd=1, rounds=1)
    spec = _layer_scaled(cfg.zo_spec(workers=1), model)
    plain = zeroth_order_gradient(model, F.cross_entropy, (x, y), cfg.zo_spec(workers=1), seed=seed)
    assert any(not torch.equal(clip_inf_norm(plain, 0.3)[k], got[k]) for k in got)
    want = clip_inf_norm(
        zeroth_order_gradient(model, F.cross_entropy, (x, y), spec, seed=seed), 0.3
    )
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_layer_scaled_sigma_trains_and_is_refused_where_it_cannot_run(tiny):
    """An epoch-mode run with ``sigma_scale: layer`` lowers its test loss and differs from the
    one-σ run; refused with activity perturbation (no weight directions) and the seeds downlink
    (its replay uses one σ), each naming the fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        runs = {}
        for scale in ("layer", "global"):
            cfg = tiny(
                model={"name": "mlp", "hidden": [8]},
                method={
                    "name": "baffle",
                    "mode": "epoch",
                    "k": 20,
                    "batch_size": 16,
                    "sigma": 1e-3,
                    "sigma_scale": scale,
                },
                **{"clients.num": 4, "clients.per_round": 4},
            )
            sim = build_run(load_config(cfg)).simulation()
            runs[scale] = [sim.run_round(r)["test_loss"] for r in range(1, 5)]
            sim.close()
    assert runs["layer"][-1] < runs["layer"][0]
    assert runs["layer"] != runs["global"]
    with pytest.raises(ValueError, match="set method.sigma_scale=global"):
        BaffleConfig(mode="epoch", estimator="activity", sigma_scale="layer")
    with pytest.raises(ValueError, match="use downlink=model with layer-scaled σ"):
        BaffleConfig(mode="batch", downlink="seeds", sigma_scale="layer")


def test_the_activity_estimator_is_refused_where_it_cannot_run(tiny):
    """``estimator: activity`` needs a client that applies its own update (epoch mode: batch mode's
    K scalars cannot carry directions that live in the client's activations), Gaussian
    directions, float32, and a model whose trainable parameters are linear/conv layers'."""
    with pytest.raises(ValueError, match="estimator=activity needs mode=epoch, got mode=batch"):
        BaffleConfig(mode="batch", estimator="activity")
    with pytest.raises(ValueError, match="set method.directions=gaussian"):
        BaffleConfig(estimator="activity", directions="orthogonal")
    with pytest.raises(ValueError, match="set method.precision=float32"):
        BaffleConfig(estimator="activity", precision="bfloat16")
    with pytest.raises(ConfigError, match="no zeroth-order weight spec"):
        BaffleConfig(estimator="activity").zo_spec()
    section = {"name": "baffle", "k": 4, "batch_size": 16, "estimator": "activity"}
    affine = tiny(model={"name": "lenet", "norm_affine": True}, method=section)
    with pytest.raises(
        ConfigError, match=r"estimator=activity: .*norm.weight.* is trainable; freeze"
    ):
        build_run(load_config(affine))
    frozen = tiny(model={"name": "lenet", "norm_affine": True}, method=section)
    frozen["method"] = {**section, "perturb": ["*.conv.*", "classifier.*"]}
    build_run(load_config(frozen)).simulation().close()  # the affine norms left out: accepted


@pytest.mark.parametrize("model", [{"name": "mlp", "hidden": [16]}, {"name": "lenet"}])
def test_an_activity_run_trains_and_meters_its_client_flops(tiny, model):
    """Epoch-mode BAFFLE with ``estimator: activity`` on the MLP and BAFFLE's LeNet (GroupNorm,
    Hardswish): the test loss falls over three rounds, the engine meters the client's FLOPs, and a
    rerun gives the same numbers (the perturbations come from the client's generator)."""

    def run():
        section = {
            "name": "baffle",
            "k": 16,
            "sigma": 1e-3,
            "batch_size": 16,
            "max_steps": 4,
            "estimator": "activity",
            "ema": None,
            "client_optimizer": {"name": "adam", "lr": 0.01},
        }
        cfg = load_config(tiny(rounds=3, model=model, method=section))
        sim = build_run(cfg).simulation()
        try:
            return [sim.run_round(r) for r in (1, 2, 3)]
        finally:
            sim.close()

    lines = run()
    assert lines[-1]["test_loss"] < lines[0]["test_loss"]
    assert all(line["client_flops"] > 0 for line in lines)
    assert [x["test_loss"] for x in run()] == [x["test_loss"] for x in lines]
