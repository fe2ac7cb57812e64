"""FeedSign: a client's bit against the sign of the difference quotient computed by hand, the
majority vote (ties, weights) and its robustness to a minority of flipped signs, the update
against −η v z, the bytes against the serialized one-bit messages, the clients' rebuilt models
against the server's bit for bit (missed rounds, a round that made no step, workers, resume),
secure aggregation and DP against the plain vote, and a short run that lowers the loss."""

import copy
import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fedge.core.config import load_config
from fedge.core.messages import Message
from fedge.experiment.build import build_run
from fedge.methods.base import model_arrays
from fedge.methods.feedsign import (
    FeedSignClient,
    FeedSignConfig,
    FeedSignStrategy,
    majority_vote,
    pack_votes,
    round_seed,
    unpack_votes,
)
from fedge.runtime.engine import decode_state


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _cfg(tiny, *, rounds=3, num=8, per_round=3, **extra):
    method = {"name": "feedsign", "lr": 0.01, "eps": 1e-3, "batch_size": 16}
    method.update(extra.pop("method", {}))
    return tiny(
        rounds=rounds,
        model={"name": "mlp", "hidden": [16]},
        method=method,
        **{"clients.num": num, "clients.per_round": per_round},
        **extra,
    )


def _sim(tiny, **kw):
    run = build_run(load_config(_cfg(tiny, **kw)))
    return run, run.simulation()


def _z(strategy, rnd, params):
    """The direction z of round ``rnd``, drawn as a third party would from the seed."""
    from fedge.estimators.directions import make_directions

    dirs = make_directions("gaussian", {n: p.shape for n, p in params.items()}, 1)
    return {
        n: dirs.draw(round_seed(strategy.seed, rnd), [0], n, p.shape)[0] for n, p in params.items()
    }


def test_a_clients_bit_is_the_sign_of_the_difference_quotient():
    """The client's reply against sgn([L(w + μz) − L(w − μz)] / 2μ) on the same mini-batch,
    formed by hand with z drawn from the round's seed."""
    model_fn = _model
    cfg = FeedSignConfig(eps=1e-2, batch_size=8)
    strategy = FeedSignStrategy(model_fn(), cfg, seed=3)
    x, y = torch.randn(40, 6), torch.randint(3, (40,))
    seen = set()
    for rnd in range(1, 9):
        msg = strategy.configure_round(rnd, [0])[0]
        ctx = SimpleNamespace(
            rnd=rnd,
            cid=0,
            state={},
            data=SimpleNamespace(x=x, y=y, indices=torch.arange(40), num_samples=40),
            generator=torch.Generator().manual_seed(rnd),
            meter=SimpleNamespace(resident=None),
        )
        reply = FeedSignClient(model_fn, cfg).run(msg, ctx)  # type: ignore[arg-type]
        idx = torch.randperm(40, generator=torch.Generator().manual_seed(rnd))[:8]
        model = strategy.model  # w_rnd: the client rebuilt it from the votes
        params = dict(model.named_parameters())
        z = _z(strategy, rnd, params)
        with torch.no_grad():
            w = {n: p.detach().double() for n, p in params.items()}
            losses = []
            for s in (1, -1):
                m = copy.deepcopy(model).double()
                for n, p in m.named_parameters():
                    p.copy_(w[n] + s * cfg.eps * z[n].double())
                losses.append(float(F.cross_entropy(m(x[idx].double()), y[idx])))
        quotient = (losses[0] - losses[1]) / (2 * cfg.eps)
        assert abs(quotient) > 1e-4  # far from 0: float32 forwards give the same sign
        assert int(reply.arrays["s"][0]) == (1 if quotient > 0 else -1)
        assert reply.arrays["s"].dtype == torch.int8
        seen.add(int(reply.arrays["s"][0]))
        strategy.aggregate_round(rnd, {0: reply})
    assert seen == {1, -1}


def test_majority_vote_ties_and_weights():
    assert majority_vote([1, -1, -1], [1, 1, 1]) == -1
    assert majority_vote([1, -1, -1], [5, 2, 2]) == 1  # N_c-weighted: 5 > 4
    assert majority_vote([1, -1], [1, 1]) == 1  # a tie votes +1 (sgn(0) := +1)
    assert majority_vote([-1, 1, 1, -1], [3, 2, 1, 0]) == 1  # 3 = 3: a weighted tie
    assert majority_vote([-1], [7]) == -1
    with pytest.raises(ValueError, match="one weight per sign"):
        majority_vote([1, 1], [1])


@pytest.mark.parametrize("weighting, want", [("uniform", -1), ("samples", 1)])
def test_the_strategys_vote_weighs_by_the_configured_weights(weighting, want):
    """Three replies as the server receives them: +1 from 50 samples, −1 from 10 and 10."""
    s = FeedSignStrategy(_model(), FeedSignConfig(weighting=weighting), seed=0)
    s.configure_round(1, [0, 1, 2])
    replies = {
        c: Message({"s": torch.tensor([v], dtype=torch.int8)}, config={"num_samples": n})
        for c, (v, n) in enumerate([(1, 50), (-1, 10), (-1, 10)])
    }
    assert s.aggregate_round(1, replies)["vote"] == want
    assert s.votes == {1: want}


def test_a_minority_of_flipped_signs_cannot_change_a_clear_majority():
    """Robustness (FeedSign Sec. on Byzantine clients): b clients sending −s_c change the vote
    only when the honest margin |Σ_c s_c| is at most 2b. All 2^9 sign patterns, b = 2 of 9."""
    for signs in itertools.product((1, -1), repeat=9):
        honest = majority_vote(list(signs), [1] * 9)
        for bad in itertools.combinations(range(9), 2):
            sent = [-s if c in bad else s for c, s in enumerate(signs)]
            if abs(sum(signs)) > 4:
                assert majority_vote(sent, [1] * 9) == honest
    # and through the server: 5 honest clients agree, 2 flip their bit
    s = FeedSignStrategy(_model(), FeedSignConfig(), seed=0)
    s.configure_round(1, list(range(7)))
    replies = {
        c: Message(
            {"s": torch.tensor([1 if c < 5 else -1], dtype=torch.int8)}, config={"num_samples": 1}
        )
        for c in range(7)
    }
    assert s.aggregate_round(1, replies)["vote"] == 1


class _Flipping:
    """A client program whose clients in ``bad`` send the opposite of their sign (Byzantine)."""

    def __init__(self, inner, bad):
        self.inner, self.bad = inner, bad

    def run(self, message, ctx):
        reply = self.inner.run(message, ctx)
        if ctx.cid in self.bad:
            reply = Message({"s": -reply.arrays["s"]}, config=reply.config)
        return reply


@pytest.mark.parametrize("bad, descends", [({0, 1}, True), ({0, 1, 2, 3, 4}, False)])
def test_training_with_sign_flipping_clients(tiny, bad, descends):
    """Every client every round, lr 0.02, batches of 64: the test loss falls with 2 of 5
    clients flipping their bit (by 0.15 here, 0.36 with none); it rises when all 5 flip (the
    vote is then reversed)."""
    method = {"lr": 0.02, "batch_size": 64}
    run = build_run(load_config(_cfg(tiny, rounds=60, num=5, per_round=5, method=method)))
    run.method.program = _Flipping(run.method.program, bad)
    sim = run.simulation()
    losses = [sim.run_round(r)["test_loss"] for r in range(1, 61)]
    sim.close()
    assert (losses[-1] < losses[0] - 0.05) == descends, (losses[0], losses[-1])


def test_the_update_is_minus_eta_vote_z_exactly():
    cfg = FeedSignConfig(lr=0.037)
    for vote in (1, -1):
        s = FeedSignStrategy(_model(), cfg, seed=5)
        before = model_arrays(s.model)
        s.configure_round(4, [])
        s.update(4, vote, [])
        z = _z(s, 4, dict(s.model.named_parameters()))
        after = model_arrays(s.model)
        for n in z:
            assert torch.equal(after[n], before[n] - (cfg.lr * vote) * z[n]), n
        assert s.votes == {4: vote}


def test_votes_pack_eight_to_a_byte():
    votes = [1, -1, -1, 1, 1, 1, -1, 1, -1, 1]
    packed = pack_votes(votes)
    assert packed.dtype == torch.uint8 and packed.tolist() == [0b10111001, 0b10]
    assert unpack_votes(packed, 10) == votes
    assert pack_votes([]).numel() == 0
    with pytest.raises(Exception, match="expected 1 uint8 bytes for 3 votes"):
        unpack_votes(packed, 3)


def test_bytes_are_one_bit_each_way_plus_framing(tiny):
    """Every client every round: up, the serialized one-byte sign (1 bit used) and its sample
    count; down, the previous round's vote (1 bit in a byte) with the seed and the rounds."""
    run, sim = _sim(tiny, num=5, per_round=5)
    n = run.clients[0].num_samples
    up = Message({"s": torch.tensor([1], dtype=torch.int8)}, config={"num_samples": n})
    up_framing = len(up.to_bytes()) - 1
    strategy = sim.strategy
    for rnd in (1, 2, 3):
        m = sim.run_round(rnd)
        assert m["bytes_up"] == 5 * len(up.to_bytes())
        assert up_framing <= 64
        down = strategy.message(rnd - 1, rnd) if rnd > 1 else strategy.message(1, 1)
        assert down.arrays["votes"].numel() == (1 if rnd > 1 else 0)
        assert m["bytes_down"] == 5 * len(down.to_bytes())
        assert len(down.to_bytes()) - down.arrays["votes"].numel() <= 64
    sim.close()


def test_a_client_replays_missed_votes_and_rounds_without_a_step():
    """Rounds 1, 2 and 4 stepped; round 3 lost every reply (no vote): a client holding w_1
    rebuilds w_5 from 3 vote bits and the 4-bit mask of rounds that stepped."""
    cfg = FeedSignConfig(lr=0.05)
    s = FeedSignStrategy(_model(), cfg, seed=9)
    s.configure_round(1, [])
    for rnd, vote in ((1, 1), (2, -1), (4, -1)):
        s.update(rnd, vote, [])
    msg = s.message(1, 5)
    assert unpack_votes(msg.arrays["stepped"], 4) == [1, 1, -1, 1]
    assert unpack_votes(msg.arrays["votes"], 3) == [1, -1, -1]
    ctx = SimpleNamespace(rnd=5, cid=0, state={})
    rebuilt = model_arrays(FeedSignClient(_model, cfg).sync(msg, ctx))  # type: ignore[arg-type]
    want = model_arrays(s.model)
    assert all(torch.equal(rebuilt[k], want[k]) for k in want)
    assert ctx.state["at"] == 5


@pytest.mark.parametrize("workers, draws", [(0, "torch"), (2, "torch"), (0, "portable")])
def test_clients_rebuild_the_servers_model_bit_for_bit(tiny, workers, draws):
    """With ``draws: portable`` the directions are the portable generator's (the same bits on
    every machine), and the client's replay draws them as the server does."""
    run, sim = _sim(tiny, num=8, per_round=2, draws=draws, **{"clients.workers": workers})
    assert sim.strategy.draws == draws
    snapshots = {1: model_arrays(sim.strategy.model)}
    for rnd in range(1, 6):
        sim.run_round(rnd)
        snapshots[rnd + 1] = model_arrays(sim.strategy.model)
    sim.close()
    held = {c: decode_state(st) for c, st in sim.client_states.items()}
    assert len(held) >= 4
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        want = snapshots[st["at"]]
        assert all(torch.equal(w[k], want[k]) for k in want), (
            f"client {c} differs from w_{st['at']}"
        )
    unseen = [c for c in range(8) if c not in sim.strategy.synced]
    assert unseen  # a client never sampled replays the 5 votes from the seeded initial model
    msg = sim.strategy.configure_round(6, unseen[:1])[unseen[0]]
    ctx = SimpleNamespace(rnd=6, cid=unseen[0], state={})
    client = FeedSignClient(run.model_fn, sim.strategy.cfg, draws)
    rebuilt = model_arrays(client.sync(msg, ctx))  # type: ignore[arg-type]
    assert all(torch.equal(rebuilt[k], snapshots[6][k]) for k in snapshots[6])


def test_a_resumed_run_equals_the_uninterrupted_one(tiny, tmp_path):
    import fedge

    full = fedge.run(_cfg(tiny, rounds=6, num=6, per_round=2), out=tmp_path / "full")
    fedge.run(_cfg(tiny, rounds=3, num=6, per_round=2), out=tmp_path / "cut")
    resumed = fedge.resume(tmp_path / "cut", rounds=6)

    def curve(run):
        return [(m["round"], m["test_loss"], m["bytes_up"], m["bytes_down"]) for m in run.metrics]

    assert curve(resumed) == curve(full)
    a, b = resumed.model.state_dict(), full.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.filterwarnings("ignore:privacy.mechanism=gaussian with privacy.noise_multiplier=0")
def test_secure_aggregation_gives_the_plain_vote_and_dp_without_noise_too(tiny):
    """The server sees only Σ_c s_c (secure aggregation) or its clipped, noised sum (DP); the
    vote is its sign, so with σ = 0 both equal the plain uniform vote round for round."""

    def curve(**extra):
        _, sim = _sim(tiny, rounds=4, per_round=3, **extra)
        out = [(m["test_loss"], m["vote"]) for m in (sim.run_round(r) for r in range(1, 5))]
        final = model_arrays(sim.strategy.model)
        sim.close()
        return out, final

    plain, w = curve()
    for extra in (
        {"method": {"secure_aggregation": True}},
        {"privacy": {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.0}},
    ):
        got, w2 = curve(**extra)
        assert got == plain, extra
        assert all(torch.equal(w[k], w2[k]) for k in w)


def test_freezing_leaves_frozen_parameters_at_their_seeded_values(tiny):
    run, sim = _sim(tiny, method={"freeze": ["features.fc1"]})
    before = model_arrays(sim.strategy.model)
    for r in (1, 2, 3):
        sim.run_round(r)
    sim.close()
    after = model_arrays(sim.strategy.model)
    frozen = [k for k in before if k.startswith("features.fc1")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in frozen)


def test_a_short_run_lowers_the_loss(tiny):
    _, sim = _sim(tiny, rounds=60, num=8, per_round=5, method={"lr": 0.02})
    losses = [sim.run_round(r)["test_loss"] for r in range(1, 61)]
    sim.close()
    assert losses[-1] < losses[0] - 0.05, (losses[0], losses[-1])


def test_a_malformed_reply_is_refused():
    s = FeedSignStrategy(_model(), FeedSignConfig(), seed=0)
    for bad in (
        torch.tensor([2], dtype=torch.int8),
        torch.tensor([1.0]),
        torch.ones(2, dtype=torch.int8),
    ):
        with pytest.raises(Exception, match="expected s, one int8 of ±1"):
            s.check_reply(1, 0, Message({"s": bad}, config={"num_samples": 1}))


def test_under_dropout_clients_hold_the_servers_model_across_skipped_rounds(tiny):
    """clients.dropout = 0.4, min_replies = 2: rounds 1-2 and 4-7 are skipped (no vote, the
    strategy put back), yet every client's held model is the server's of the round it names,
    clients that ran only in a skipped first round included."""
    extra = {"clients.dropout": 0.4, "clients.min_replies": 2}
    _, sim = _sim(tiny, num=6, per_round=3, **extra)
    snapshots = {1: model_arrays(sim.strategy.model)}
    skipped = []
    for rnd in range(1, 9):
        if sim.run_round(rnd).get("round_skipped"):
            skipped.append(rnd)
        snapshots[rnd + 1] = model_arrays(sim.strategy.model)
    sim.close()
    assert 1 in skipped and 8 not in skipped and sorted(sim.strategy.votes) == [3, 8]
    held = {c: decode_state(st) for c, st in sim.client_states.items()}
    assert len(held) == 6
    for c, st in held.items():
        w = {k[2:]: v for k, v in st.items() if k.startswith("w/")}
        assert all(torch.equal(w[k], snapshots[st["at"]][k]) for k in w), c


def test_without_secure_aggregation_the_build_warns_what_the_server_sees(tiny):
    import warnings

    from fedge.core.errors import PrivacyWarning

    with pytest.warns(PrivacyWarning, match="signs of its projected gradients"):
        build_run(load_config(_cfg(tiny)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        build_run(load_config(_cfg(tiny, method={"secure_aggregation": True})))
