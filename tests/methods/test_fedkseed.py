"""FedKSeed: the two-point scalar against autograd's directional derivative, a round with a pool
of orthonormal directions against coordinate descent by hand, clients' rebuilt models against
the server's bit for bit, the bytes against K scalars each way (float32, or 64-bit ring elements
up under secure aggregation), the constant-lr rule."""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fedge.core.config import load_config
from fedge.core.messages import Message
from fedge.estimators.directions import Directions, make_directions
from fedge.experiment.build import build_run
from fedge.methods.base import model_arrays
from fedge.methods.fedkseed import (
    FedKSeedClient,
    FedKSeedConfig,
    FedKSeedStrategy,
    pool_update,
    pro_probabilities,
    projected_gradient,
)
from fedge.runtime.engine import decode_state
from tests_helpers import check_scalar_bytes, missed_rounds, record_downlink

K = 16


def _sim(tiny, *, per_round=2, workers=0, secure=True, num=8, sampling="uniform", draws="portable"):
    method = {
        "name": "fedkseed",
        "k": K,
        "eps": 1e-3,
        "lr": 0.05,
        "local_steps": 3,
        "batch_size": 16,
        "secure_aggregation": secure,
        "sampling": sampling,
    }
    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method=method,
            draws=draws,
            **{"clients.num": num, "clients.per_round": per_round, "clients.workers": workers},
        )
    )
    run = build_run(cfg)
    return run.simulation(), run.model_fn


def test_two_point_scalar_is_the_directional_derivative():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model = model.double()
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randint(3, (8,))
    params = dict(model.named_parameters())
    pool = make_directions("gaussian", {n: p.shape for n, p in params.items()}, K)
    j, eps = 5, 1e-4
    g = projected_gradient(model, (x, y), pool, 123, j, eps, list(params))
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(params.values()))
    want = sum(
        float((gr * pool.draw(123, [j], n, p.shape)[0].double()).sum())
        for gr, (n, p) in zip(grads, params.items())
    )
    assert g == pytest.approx(want, rel=1e-4)  # O(ε²) from the central difference, and float32 ΔL


def _basis_pool(n):
    """A pool whose K = n directions are the coordinate vectors e_0..e_{n-1} of one parameter."""

    def draw(seed, ks, name, shape):
        return torch.eye(n)[list(ks)].view(len(ks), *shape)

    return Directions("gaussian", n, draw, torch.full((n,), 1.0 / n, dtype=torch.float64))


def test_a_round_on_an_orthonormal_pool_is_coordinate_descent():
    """f(w) = ½‖Aw − b‖² on one sample; pool = e_0..e_3; with steps on j = 2, 0, 2 the scalars
    are ∂_j f at the current w (exact: f is quadratic, the central difference has no error
    beyond rounding) and w ← w − η Σ_j ḡ_j e_j equals the three coordinate steps by hand."""
    torch.manual_seed(1)
    n, eta, eps = 4, 0.1, 1e-3
    a = torch.randn(3, n, dtype=torch.float64)
    b = torch.randn(3, dtype=torch.float64)
    lin = torch.nn.Linear(n, 3, bias=False).double()
    w0 = torch.randn(n, dtype=torch.float64)

    def loss_fn(out, target):
        return 0.5 * ((out - target) ** 2).sum()

    with torch.no_grad():
        lin.weight.copy_(a)
    pool = _basis_pool(n)
    w = w0.clone()
    acc = torch.zeros(n, dtype=torch.float64)
    for j in (2, 0, 2):  # by hand: ∂_j f = (Aᵀ(Aw − b))_j, then w_j -= η ∂_j f
        grad_j = float((a.t() @ (a @ w - b))[j])
        acc[j] += grad_j
        w[j] -= eta * grad_j

    # the same scalars from two forwards each, the model being w as a 1×n "input weight"
    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(w0.clone().view(1, n))

        def forward(self, x):
            return (a @ self.w.view(n)).view(1, 3)

    m = Wrap()
    got = torch.zeros(n, dtype=torch.float64)
    for j in (2, 0, 2):
        g = projected_gradient(
            m, (torch.zeros(1, 1), b.view(1, 3)), pool, 0, j, eps, ["w"], loss_fn=loss_fn
        )
        got[j] += g
        with torch.no_grad():
            m.w.view(n)[j] -= eta * g
    assert torch.allclose(got, acc, rtol=1e-5, atol=1e-6)
    # the server's rebuild from the scalars: w0 − η Σ_j ḡ_j e_j = the coordinate steps
    upd = pool_update({"w": torch.zeros(1, n)}, acc.to(torch.float32), pool, 0)["w"].view(n)
    assert torch.allclose(w0 - eta * upd.double(), w, atol=1e-6)


@pytest.mark.parametrize(
    "workers, secure, sampling",
    [(0, True, "uniform"), (2, True, "uniform"), (0, False, "uniform"), (0, True, "pro")],
)
def test_clients_rebuild_the_servers_model_bit_for_bit(tiny, workers, secure, sampling):
    """With ``sampling: pro`` also the seed scores Σ_t |ḡ_t| each client sums from its replays."""
    sim, model_fn = _sim(tiny, per_round=2, workers=workers, secure=secure, sampling=sampling)
    inner = getattr(sim.strategy, "inner", sim.strategy)
    snapshots = {1: model_arrays(sim.strategy.model)}
    scores = {1: inner.scores.clone()}
    for rnd in range(1, 6):
        sim.run_round(rnd)
        snapshots[rnd + 1] = model_arrays(sim.strategy.model)
        scores[rnd + 1] = inner.scores.clone()
    sim.close()
    held = {c: decode_state(s) for c, s in sim.client_states.items()}
    assert len(held) >= 4  # several clients, most of which missed rounds
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        want = snapshots[st["at"]]
        assert all(torch.equal(w[k], want[k]) for k in want), (
            f"client {c} differs from W_{st['at']}"
        )
        if sampling == "pro":
            assert torch.equal(st["pro/score"], scores[st["at"]])
    # a client never sampled holds the seeded W_1 and replays rounds 1..5 into the final model
    strategy = getattr(sim.strategy, "inner", sim.strategy)
    assert isinstance(strategy, FedKSeedStrategy)
    unseen = [c for c in range(8) if c not in strategy.downlink.synced]
    assert unseen
    msg = strategy.configure_round(6, unseen[:1])[unseen[0]]
    assert msg.arrays["replay_dL"].shape == (5, K)
    client = FedKSeedClient(model_fn, strategy.cfg, strategy.draws)
    ctx = SimpleNamespace(rnd=6, cid=unseen[0], state={})
    rebuilt = model_arrays(client.sync(msg, ctx))  # type: ignore[arg-type]
    assert all(torch.equal(rebuilt[k], snapshots[6][k]) for k in snapshots[6])


@pytest.mark.parametrize("draws", ["portable", "torch"])
def test_the_pool_is_drawn_from_the_runs_draws(tiny, draws):
    """Round 1 moves the seeded W_1 to W_1 − η Σ_j ḡ_j z_j with z_j the pool's directions from
    the run's ``draws`` (the portable ones every machine rebuilds alike, or torch's), summed
    here by hand; the other generator's pool gives another model, and a client of the run
    rebuilds the server's model bit for bit from W_1 and ḡ."""
    sim, model_fn = _sim(tiny, per_round=2, draws=draws)
    strategy = getattr(sim.strategy, "inner", sim.strategy)
    assert isinstance(strategy, FedKSeedStrategy)
    w1 = model_arrays(sim.strategy.model)
    sim.run_round(1)
    sim.close()
    w2 = model_arrays(sim.strategy.model)
    unseen = next(c for c in range(8) if c not in strategy.downlink.synced)
    msg = strategy.configure_round(2, [unseen])[unseen]
    (gbar,) = msg.arrays["replay_dL"]
    shapes = {n: p.shape for n, p in model_fn().named_parameters()}

    def by_hand(gen):
        pool = make_directions("gaussian", shapes, K, draws=gen)
        out = {}
        for n, shape in shapes.items():
            z = pool.draw(strategy.pool_seed, range(K), n, shape).double()
            step = torch.einsum("k,k...->...", gbar.double(), z)
            out[n] = w1[n].double() - 0.05 * step
        return out

    want, other = by_hand(draws), by_hand("torch" if draws == "portable" else "portable")
    for n in shapes:
        torch.testing.assert_close(w2[n].double(), want[n], rtol=0, atol=1e-6)
    assert any(not torch.allclose(w2[n].double(), other[n], atol=1e-4) for n in shapes)
    client = FedKSeedClient(model_fn, strategy.cfg, draws)
    ctx = SimpleNamespace(rnd=2, cid=unseen, state={})
    rebuilt = model_arrays(client.sync(msg, ctx))  # type: ignore[arg-type]
    assert all(torch.equal(rebuilt[n], w2[n]) for n in w2)


@pytest.mark.filterwarnings("ignore::fedge.core.errors.PrivacyWarning")
@pytest.mark.parametrize("secure", [False, True])
def test_bytes_are_k_scalars_each_way(tiny, monkeypatch, secure):
    """Up: K float32 scalars (4K bytes), or under secure aggregation the masked [N_c·g, N_c],
    K + 1 64-bit ring elements (8(K + 1) bytes); down, each client's message: the pool seed (8
    bytes) and ḡ, K float32 scalars, per round it missed (round 1: none, every client builds
    the seeded model). Each within 64 bytes of framing a message; the protocol's other
    messages are logged apart (``secagg_bytes_*``)."""
    sent = record_downlink(monkeypatch, FedKSeedStrategy)
    sim, _ = _sim(tiny, per_round=3, num=6, secure=secure)
    lines = [sim.run_round(rnd) for rnd in (1, 2, 3, 4)]
    sim.close()
    missed = missed_rounds(0, 4, 6, 3)
    assert any(m > 1 for ms in missed.values() for m in ms.values())  # some missed rounds
    up = 8 * (K + 1) if secure else 4 * K
    check_scalar_bytes(lines, missed, sent, up=up, down=4 * K, secure=secure)


@pytest.mark.filterwarnings("ignore::fedge.core.errors.PrivacyWarning")
@pytest.mark.parametrize("secure", [True, False])
def test_the_preset_logs_k_scalars_each_way(fake_fashion_mnist, tmp_path, monkeypatch, secure):
    """``fedge run fedkseed-fmnist-lenet`` (shrunk: 3 rounds, one local step, fewer samples; K
    = 1024 as shipped, 5 of 10 clients a round): its metrics.jsonl's payload bytes are the
    formula of :func:`test_bytes_are_k_scalars_each_way` for each round's sampled clients."""
    import fedge

    sent = record_downlink(monkeypatch, FedKSeedStrategy)
    over = {"rounds": 3, "dataset.limit_train": 100, "dataset.limit_test": 50}
    over |= {"method.local_steps": 1, "method.secure_aggregation": secure}
    run = fedge.run("fedkseed-fmnist-lenet", overrides=over, out=tmp_path / "run")
    cfg = run.config
    k = cfg["method"]["k"]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    missed = missed_rounds(cfg["seed"], 3, cfg["clients"]["num"], cfg["clients"]["per_round"])
    assert any(m > 1 for ms in missed.values() for m in ms.values())
    up = 8 * (k + 1) if secure else 4 * k
    check_scalar_bytes(lines, missed, sent, up=up, down=4 * k, secure=secure)


def test_pro_probabilities_are_the_softmax_of_min_max_normalized_scores():
    p = pro_probabilities(torch.tensor([1.0, 3.0, 5.0]))
    e = torch.exp(torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    assert torch.allclose(p, e / e.sum())
    uniform = torch.full((4,), 0.25, dtype=torch.float64)
    assert torch.equal(pro_probabilities(torch.zeros(4)), uniform)


def test_pro_sampling_follows_the_servers_scores(tiny):
    """After round 1 the scores are Σ|ḡ_1|: round 2's law is far from uniform, favouring the
    seeds with the largest averaged scalars; with uniform sampling the law is never formed."""
    sim, _ = _sim(tiny, per_round=8, sampling="pro", secure=False)
    inner = getattr(sim.strategy, "inner", sim.strategy)
    sim.run_round(1)
    scores = inner.scores.clone()
    assert int((scores > 0).sum()) > 1
    p = pro_probabilities(scores)
    assert float(p.max()) > 1.5 / K
    assert float(p[scores.argmax()]) == float(p.max())
    sim.run_round(2)
    sim.close()


def test_a_decaying_learning_rate_is_refused():
    with pytest.raises(ValueError, match="method.lr_decay=0.99"):
        FedKSeedConfig(lr_decay=0.99)


def test_reply_of_the_wrong_shape_is_refused():
    model = torch.nn.Linear(2, 2)
    s = FedKSeedStrategy(model, FedKSeedConfig(k=4), seed=0, population=1)
    with pytest.raises(Exception, match="expected g of shape"):
        s.check_reply(1, 0, Message({"g": torch.zeros(3)}, config={"num_samples": 1}))


def test_a_resumed_run_equals_the_uninterrupted_one(tiny, tmp_path):
    """3 rounds, then ``resume`` to 5: the server's history of ḡ and each client's held model
    come back from the checkpoint, so every round's loss, bytes and the final model equal an
    uninterrupted 5-round run's (a client rebuilding a wrong model would send other scalars)."""
    import fedge

    def cfg(rounds):
        return tiny(
            rounds=rounds,
            model={"name": "mlp", "hidden": [16]},
            method={"name": "fedkseed", "k": K, "local_steps": 3, "batch_size": 16},
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
    """5 rounds, 2 of 8 clients a round (so clients miss rounds), ``clients.workers=2``, secure
    aggregation on (the default): cut after round 3 and resumed (``fedge.resume``, as ``fedge run
    --resume``) to 5. Every client's held model in the final checkpoint equals bit for bit the
    server's model of the round it holds, the server's models taken round by round from an
    uninterrupted run in the engine's process; the resumed run's final model is that run's."""
    import fedge

    def cfg(rounds, workers):
        method = {"name": "fedkseed", "k": K, "lr": 0.05, "local_steps": 3, "batch_size": 16}
        return tiny(
            rounds=rounds,
            model={"name": "mlp", "hidden": [16]},
            method=method,
            **{"clients.num": 8, "clients.per_round": 2, "clients.workers": workers},
        )

    sim = build_run(load_config(cfg(5, 0))).simulation()
    snapshots = {1: model_arrays(sim.strategy.model)}
    for rnd in range(1, 6):
        sim.run_round(rnd)
        snapshots[rnd + 1] = model_arrays(sim.strategy.model)
    sim.close()

    fedge.run(cfg(3, 2), out=tmp_path / "cut")
    resumed = fedge.resume(tmp_path / "cut", rounds=5)
    state = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert state["record"]["round"] == 5
    held = {c: decode_state(b) for c, b in state["client_states"].items()}
    assert len(held) >= 4 and any(st["at"] < 5 for st in held.values())  # some missed rounds
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        want = snapshots[st["at"]]
        assert w.keys() == want.keys() and all(torch.equal(w[k], want[k]) for k in want), c
    final = model_arrays(resumed.model)
    assert all(torch.equal(final[k], snapshots[6][k]) for k in snapshots[6])


def _first_gbar(sim):
    """Round 1's averaged scalars ḡ as the server recorded them, under any wrappers."""
    sim.run_round(1)
    inner = sim.strategy
    while not isinstance(inner, FedKSeedStrategy):
        inner = inner.inner
    sim.close()
    return inner.downlink.history[1][1]


def _curve(sim, rounds):
    out = [sim.run_round(r) for r in range(1, rounds + 1)]
    final = model_arrays(sim.strategy.model)
    sim.close()
    return out, final


@pytest.mark.filterwarnings("ignore::fedge.core.errors.PrivacyWarning")
def test_dp_on_the_summed_scalars_composes(tiny):
    """DP wraps FedKSeed's sum: with σ = 0 and a clip that never binds the mean is the plain
    one (equal client sizes: uniform = N_c-weighted, up to float order); with a clip that binds
    a client's K scalars reach the server scaled to norm C, and noise moves the model."""

    def sim(per_round=4, **privacy):
        cfg = load_config(
            tiny(
                model={"name": "mlp", "hidden": [16]},
                method={
                    "name": "fedkseed",
                    "k": K,
                    "local_steps": 3,
                    "batch_size": 16,
                    "secure_aggregation": per_round > 1,  # a sum of one reply is no secret
                },
                privacy=privacy or {"mechanism": "none"},
                **{"clients.num": 4, "clients.per_round": per_round},
            )
        )
        return build_run(cfg).simulation()

    plain, w = _curve(sim(), 3)
    loose, w2 = _curve(sim(mechanism="gaussian", clip=1e6, noise_multiplier=0.0), 3)
    for a, b in zip(plain, loose):
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-5)
    assert all(torch.allclose(w[k], w2[k], atol=1e-6) for k in w)
    assert loose[-1]["epsilon"] == float("inf")
    # one client a round: the server's ḡ is that client's g clipped to norm C = 1e-3
    g_plain = _first_gbar(sim(per_round=1))
    g_clip = _first_gbar(sim(per_round=1, mechanism="gaussian", clip=1e-3, noise_multiplier=0.0))
    assert float(g_plain.norm()) > 1e-2
    assert torch.allclose(g_clip, g_plain * (1e-3 / g_plain.norm()), rtol=1e-4, atol=1e-9)
    noisy, w3 = _curve(sim(mechanism="gaussian", clip=1.0, noise_multiplier=1.0), 2)
    assert 0 < noisy[-1]["epsilon"] < float("inf")
    assert any(not torch.equal(w[k], w3[k]) for k in w)


def test_freezing_perturbs_and_moves_only_trainable_coordinates(tiny):
    """``method.freeze``: the pool draws directions over the trainable parameters only; frozen
    ones keep their seeded values on the server and in every client's rebuilt model."""
    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method={"name": "fedkseed", "k": K, "local_steps": 3, "freeze": ["features.fc1"]},
            **{"clients.num": 6, "clients.per_round": 2},
        )
    )
    sim = build_run(cfg).simulation()
    w0 = model_arrays(sim.strategy.model)
    _, w = _curve(sim, 4)
    frozen = [k for k in w0 if k.startswith("features.fc1")]
    assert frozen and all(torch.equal(w0[k], w[k]) for k in frozen)
    assert any(not torch.equal(w0[k], w[k]) for k in w0 if k not in frozen)
    for st in (decode_state(b) for b in sim.client_states.values()):
        assert all(torch.equal(st["w/" + k], w0[k]) for k in frozen)


def test_secure_aggregation_uploads_k_plus_one_64_bit_words(tiny):
    """With secure aggregation (FedKSeed's default) a client's masked input is [N_c·g, N_c] in
    the protocol's 64-bit fixed-point words: K = 96 instead of 64 adds exactly 8·32 bytes a
    client a round up (the key-agreement and unmasking messages do not depend on K) and 4·32
    bytes per replayed round down (between 64 and 96 MessagePack's headers of the lengths and
    shapes keep their sizes)."""

    def run(k):
        cfg = load_config(
            tiny(
                model={"name": "mlp", "hidden": [16]},
                method={"name": "fedkseed", "k": k, "local_steps": 2, "batch_size": 16},
                **{"clients.num": 3, "clients.per_round": 3},
            )
        )
        sim = build_run(cfg).simulation()
        out = [sim.run_round(r) for r in (1, 2, 3)]
        sim.close()
        return out

    small, large = run(64), run(96)
    for rnd, (a, b) in enumerate(zip(small, large), start=1):
        assert a["phases"] == b["phases"] == 4  # the four exchanges of secure aggregation
        assert (b["bytes_up"] - a["bytes_up"]) / 3 == 8 * 32
        missed = 0 if rnd == 1 else 1  # every client every round: one round to replay
        assert (b["bytes_down"] - a["bytes_down"]) / 3 == 4 * 32 * missed


def test_under_dropout_clients_hold_the_servers_model_across_skipped_rounds(tiny):
    """clients.dropout = 0.4, min_replies = 2, the first rounds skipped (the strategy put back,
    no update): a client that ran only in a skipped first round holds the seeded model, which
    is the server's first round's, and every client's model is the server's of its round."""
    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method={
                "name": "fedkseed",
                "k": K,
                "local_steps": 2,
                "batch_size": 16,
                "secure_aggregation": False,
            },
            **{
                "clients.num": 6,
                "clients.per_round": 3,
                "clients.dropout": 0.4,
                "clients.min_replies": 2,
            },
        )
    )
    sim = build_run(cfg).simulation()
    snapshots = {1: model_arrays(sim.strategy.model)}
    skipped = []
    for rnd in range(1, 9):
        if sim.run_round(rnd).get("round_skipped"):
            skipped.append(rnd)
        snapshots[rnd + 1] = model_arrays(sim.strategy.model)
    sim.close()
    assert 1 in skipped and 8 not in skipped
    held = {c: decode_state(st) for c, st in sim.client_states.items()}
    assert len(held) == 6
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        assert all(torch.equal(w[k], snapshots[st["at"]][k]) for k in w), c


def test_clients_rebuild_the_servers_model_with_dropouts(tiny):
    """Clients dropping out of exchanges (whole rounds failing, the server's state rolled back):
    a client the server never had a reply from is sent ``new`` and replays from the seeded
    model, so every client still holds the model of its round bit for bit."""
    cfg = load_config(
        tiny(
            model={"name": "mlp", "hidden": [16]},
            method={"name": "fedkseed", "k": K, "lr": 0.05, "local_steps": 3, "batch_size": 16},
            **{
                "clients.num": 8,
                "clients.per_round": 4,
                "clients.dropout": 0.15,
                "clients.min_replies": 1,
            },
        )
    )
    sim = build_run(cfg).simulation()
    snapshots = {1: model_arrays(sim.strategy.model)}
    failed = 0
    for rnd in range(1, 6):
        failed += sim.run_round(rnd).get("clients_failed", 0)
        snapshots[rnd + 1] = model_arrays(sim.strategy.model)
    sim.close()
    assert failed > 0
    held = {c: decode_state(s) for c, s in sim.client_states.items()}
    assert len(held) >= 4
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        assert all(torch.equal(w[k], snapshots[st["at"]][k]) for k in w), c
