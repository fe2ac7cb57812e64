"""The engine with toy strategies: accounting, sampling, determinism, side parties, pool."""

import pytest
import torch

from fedge.core.context import ClientData
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import Exchange, PartySpec, Savepoint, Strategy
from fedge.runtime.engine import EngineConfig, Simulation, decode_state, drops_out, sample_clients


class EchoStrategy(Strategy):
    """Sends each client a seed-sized message; sums the clients' replies."""

    def __init__(self, broadcast=True):
        self.model = torch.nn.Linear(2, 2)
        self.total = 0.0
        self.broadcast = broadcast
        self.seen = []

    def configure_round(self, rnd, ids):
        if self.broadcast:
            m = Message(config={"seed": rnd})
            return dict.fromkeys(ids, m)
        return {c: Message({"x": torch.full((c + 1,), float(c))}) for c in ids}

    def aggregate_round(self, rnd, replies):
        self.seen.append(sorted(replies))
        self.total += sum(float(r.arrays["v"].sum()) for r in replies.values())
        return {"total": self.total}

    def eval_model(self):
        return self.model

    def state_dict(self):
        return {"total": self.total}

    def load_state_dict(self, s):
        self.total = s["total"]


class DrawClient:
    """Replies with a draw from its generator and a count kept in its state."""

    def run(self, message, ctx):
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        v = torch.randn(3, generator=ctx.generator)
        return Message({"v": v}, config={"calls": ctx.state["calls"]})


def _clients(n):
    x, y = torch.randn(n * 2, 2), torch.zeros(n * 2, dtype=torch.long)
    return [ClientData(x, y, torch.tensor([2 * i, 2 * i + 1])) for i in range(n)]


def _sim(strategy=None, program=None, n=6, per_round=3, rounds=3, workers=0, parties=None):
    return Simulation(
        strategy=strategy or EchoStrategy(),
        program=program or DrawClient(),
        clients=_clients(n),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=rounds, per_round=per_round, workers=workers),
        parties=parties,
    )


def test_sampling_is_seeded_sorted_and_varies_by_round():
    a = sample_clients(0, 1, 100, 10)
    assert a == sorted(a) and len(set(a)) == 10 and a == sample_clients(0, 1, 100, 10)
    assert a != sample_clients(0, 2, 100, 10) and a != sample_clients(1, 1, 100, 10)
    assert sample_clients(0, 1, 5, 5) == list(range(5))


def test_sampling_scales_to_a_million_clients_and_is_uniform():
    big = sample_clients(3, 7, 10**9, 1000)  # O(per_round): no permutation of the population
    assert len(set(big)) == 1000 and big == sorted(big) and 0 <= big[0] and big[-1] < 10**9
    # uniform: each of 20 clients is picked in about 5/20 of 4000 rounds (binomial sd ≈ 27)
    counts = torch.zeros(20)
    for rnd in range(4000):
        counts[sample_clients(0, rnd, 20, 5)] += 1
    assert float((counts - 1000).abs().max()) < 5 * 27.4
    eligible = [3, 8, 11, 19]
    assert set(sample_clients(0, 1, 20, 2, eligible)) <= set(eligible)


def test_bytes_are_real_serialized_lengths():
    sim = _sim(strategy=EchoStrategy(broadcast=False), n=4, per_round=4)
    line = sim.run_round(1)
    down = sum(len(Message({"x": torch.full((c + 1,), float(c))}).to_bytes()) for c in range(4))
    assert line["bytes_down"] == down
    up = sum(len(Message({"v": torch.zeros(3)}, config={"calls": 1}).to_bytes()) for _ in range(4))
    assert line["bytes_up"] == up
    assert line["clients"] == 4 and line["test_accuracy"] is not None


def test_broadcast_is_charged_to_every_client():
    sim = _sim(n=5, per_round=5)
    line = sim.run_round(1)
    assert line["bytes_down"] == 5 * len(Message(config={"seed": 1}).to_bytes())


def test_client_state_persists_and_generators_are_per_client_round():
    sim = _sim(n=3, per_round=3)
    sim.run_round(1)
    sim.run_round(2)
    from fedge.runtime.engine import decode_state

    assert all(decode_state(s)["calls"] == 2 for s in sim.client_states.values())
    sim2 = _sim(n=3, per_round=3)
    sim2.run_round(1)
    sim2.run_round(2)
    assert sim.strategy.total == sim2.strategy.total


def test_pool_equals_sequential():
    seq, pool = _sim(n=8, per_round=5, rounds=3), _sim(n=8, per_round=5, rounds=3, workers=2)
    seq.run()
    pool.run()
    assert seq.strategy.total == pool.strategy.total
    assert seq.strategy.seen == pool.strategy.seen
    assert seq.client_states == pool.client_states


def test_non_finite_reply_is_rejected():
    class Bad:
        def run(self, message, ctx):
            return Message({"v": torch.tensor([float("nan")])})

    with pytest.raises(MessageError, match="client"):
        _sim(program=Bad()).run_round(1)


class Doubler:
    def handle(self, message, ctx):
        return Message({"y": message.arrays["x"] * 2})


def test_side_party_traffic_is_counted():
    class UsesParty:
        def run(self, message, ctx):
            y = ctx.link("edge").call(Message({"x": torch.ones(10)})).arrays["y"]
            return Message({"v": y[:3]})

    sim = _sim(program=UsesParty(), n=2, per_round=2, parties={"edge": PartySpec("edge", Doubler)})
    line = sim.run_round(1)
    per = len(Message({"x": torch.ones(10)}).to_bytes())
    assert line["side_bytes_up"] == 2 * per and line["side_bytes_down"] == 2 * per
    assert line["bytes.client->edge"] == 2 * per and line["bytes.edge->client"] == 2 * per
    assert sim.strategy.total == pytest.approx(12.0)


def test_flops_are_counted_from_torch_formulas():
    class MatMul:
        def run(self, message, ctx):
            a = torch.ones(4, 5)
            b = torch.ones(5, 6)
            return Message({"v": (a @ b)[0, :3]})

    line = _sim(program=MatMul(), n=2, per_round=2).run_round(1)
    assert line["client_flops"] == 2 * (2 * 4 * 5 * 6)


def test_multi_step_round_counts_every_exchange():
    class TwoSteps(EchoStrategy):
        def round(self, rnd, ids):
            replies = yield Exchange(self.configure_round(rnd, ids))
            assert all(r.config["phase"] == 0 for r in replies.values())
            keep = sorted(replies)[
                :2
            ]  # second exchange only for the two lowest ids (the others "drop out")
            replies = yield Exchange({c: Message(config={"go": True}) for c in keep})
            self.seen.append(sorted(replies))
            return {"second_phase_clients": len(replies)}

    class PhaseClient:
        def run(self, message, ctx):
            ctx.state["phases"] = ctx.state.get("phases", "") + str(ctx.phase)
            return Message(config={"phase": ctx.phase})

    sim = _sim(strategy=TwoSteps(), program=PhaseClient(), n=4, per_round=4)
    line = sim.run_round(1)
    assert line["phases"] == 2 and line["second_phase_clients"] == 2
    first = 4 * len(Message(config={"seed": 1}).to_bytes())
    second = 2 * len(Message(config={"go": True}).to_bytes())
    assert line["bytes_down"] == first + second
    assert line["bytes_up"] == 4 * len(Message(config={"phase": 0}).to_bytes()) + 2 * len(
        Message(config={"phase": 1}).to_bytes()
    )
    assert decode_state(sim.client_states[0])["phases"] == "01"
    assert decode_state(sim.client_states[3])["phases"] == "0"


class SecretsClient:
    """Keeps a secret in the round state between two exchanges; checks it is gone next round."""

    def run(self, message, ctx):
        if ctx.phase == 0:
            assert ctx.round_state == {}, "round state leaked from an earlier round"
            ctx.round_state["secret"] = torch.randn(2, generator=ctx.generator)
            return Message(config={"ok": 1})
        return Message({"v": ctx.round_state["secret"].sum().reshape(1)})


class TwoExchanges(EchoStrategy):
    def round(self, rnd, ids):
        yield Exchange(dict.fromkeys(ids, Message(config={"a": 1})))
        replies = yield Exchange(dict.fromkeys(ids, Message(config={"b": 1})))
        return self.aggregate_round(rnd, replies)


@pytest.mark.parametrize("workers", [0, 2])
def test_round_state_crosses_exchanges_and_processes_but_not_rounds(workers):
    sims = [
        _sim(strategy=TwoExchanges(), program=SecretsClient(), n=4, per_round=4, workers=w)
        for w in (0, workers)
    ]
    for sim in sims:
        sim.run()
        assert sim.states.round == {}
        assert "secret" not in str(sim.state_dict())  # never checkpointed
    assert sims[0].strategy.total == sims[1].strategy.total


class SavepointBetween(TwoExchanges):
    """A savepoint between the two exchanges, while each client keeps its round secret."""

    def round(self, rnd, ids):
        yield Exchange(dict.fromkeys(ids, Message(config={"a": 1})))
        yield Savepoint("phase", 1, 1)
        replies = yield Exchange(dict.fromkeys(ids, Message(config={"b": 1})))
        return self.aggregate_round(rnd, replies)


def test_a_savepoint_where_clients_hold_round_state_is_refused_and_none_is_checkpointed():
    """Round states never go to disk, so a round holding them cannot be continued from there."""
    saved = []
    sim = _sim(strategy=SavepointBetween(), program=SecretsClient(), n=4, per_round=4)
    sim.on_savepoint = lambda s, rnd, point: saved.append(s.state_dict())
    with pytest.raises(
        MessageError,
        match=r"round 1: SavepointBetween yielded a Savepoint \(phase\) "
        r"while clients \[0, 1, 2, 3\] hold round state",
    ):
        sim.run()
    assert saved == []
    passed_over = _sim(strategy=SavepointBetween(), program=SecretsClient(), n=4, per_round=4)
    passed_over.run()  # no one checkpoints there: the savepoint is passed over
    plain = _sim(strategy=TwoExchanges(), program=SecretsClient(), n=4, per_round=4)
    plain.run()
    assert passed_over.strategy.total == plain.strategy.total


# ---------------------------------------------------------------- a toy three-party method
# client -> its edge server -> server. The edge server runs the second half of a tiny model
# (its FLOPs are the edge's, not the device's) and counts the batches it has seen in its own
# persistent state, which must survive rounds and --resume.


class Edge:
    def handle(self, message, ctx):
        w = torch.ones(4, 8)
        ctx.state["batches"] = ctx.state.get("batches", 0) + 1
        h = message.arrays["h"] @ w  # (2, 4) @ (4, 8): 2·2·4·8 FLOPs on the edge
        noise = torch.randn(1, generator=ctx.generator)
        return Message({"out": h.sum(0)[:3] + 0 * noise}, config={"batches": ctx.state["batches"]})


class Device:
    def run(self, message, ctx):
        x = torch.ones(2, 3) @ torch.ones(3, 4)  # 2·2·3·4 FLOPs on the device
        reply = ctx.link("edge").call(Message({"h": x}))
        return Message({"v": reply.arrays["out"]}, config={"batches": reply.config["batches"]})


class CountingServer(EchoStrategy):
    def __init__(self):
        super().__init__()
        self.batches = []

    def aggregate_round(self, rnd, replies):
        self.batches.append({c: r.config["batches"] for c, r in replies.items()})
        return super().aggregate_round(rnd, replies)


def _three_party(**kw):
    return _sim(
        strategy=CountingServer(),
        program=Device(),
        n=3,
        per_round=3,
        parties={"edge": PartySpec("edge", Edge, scope="client")},
        **kw,
    )


def test_three_party_edge_is_metered_on_its_own_account():
    sim = _three_party()
    line = sim.run_round(1)
    assert line["client_flops"] == 3 * (2 * 2 * 3 * 4)
    assert line["flops.edge"] == 3 * (2 * 2 * 4 * 8)
    up = len(Message({"h": torch.ones(2, 4)}).to_bytes())
    down = len(Message({"out": torch.ones(3)}, config={"batches": 1}).to_bytes())
    assert line["bytes.client->edge"] == 3 * up and line["bytes.edge->client"] == 3 * down
    assert line["bytes_up"] == 3 * len(
        Message({"v": torch.ones(3)}, config={"batches": 1}).to_bytes()
    )
    assert line["wall_s.edge"] >= 0


def test_three_party_edge_state_survives_rounds_and_resume():
    full = _three_party(rounds=3)
    full.run()
    assert full.strategy.batches[-1] == {0: 3, 1: 3, 2: 3}

    first = _three_party(rounds=3)
    first.run_round(1)
    first.record.round = 1
    saved = first.state_dict()
    resumed = _three_party(rounds=3)
    resumed.load_state_dict(saved)
    resumed.strategy.batches = list(first.strategy.batches)
    resumed.run()
    assert resumed.strategy.batches == full.strategy.batches
    assert resumed.party_states == full.party_states


def test_shared_party_state_changed_in_a_worker_is_refused():
    sim = _sim(
        strategy=CountingServer(),
        program=Device(),
        n=4,
        per_round=4,
        workers=2,
        parties={"edge": PartySpec("edge", Edge, scope="shared")},
    )
    with pytest.raises(ConfigError, match="workers=0"):
        sim.run_round(1)
    sim.close()


def test_shared_party_state_flows_from_client_to_client():
    sim = _sim(
        strategy=CountingServer(),
        program=Device(),
        n=3,
        per_round=3,
        parties={"edge": PartySpec("edge", Edge, scope="shared")},
    )
    sim.run_round(1)
    assert sorted(sim.strategy.batches[0].values()) == [1, 2, 3]


def test_profiles_restrict_sampling_to_eligible_clients():
    class BigOnly(EchoStrategy):
        def eligible(self, profile):
            return profile["memory_mb"] >= 100

    profiles = [{"memory_mb": m} for m in (50, 200, 150, 10, 300, 20)]
    sim = Simulation(
        strategy=BigOnly(),
        program=DrawClient(),
        clients=_clients(6),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=3, per_round=2),
        profiles=profiles,
    )
    for rnd in (1, 2, 3):
        assert set(sim.sample(rnd)) <= {1, 2, 4}


def test_eligible_client_gets_each_clients_id_with_its_profile():
    class ById(EchoStrategy):
        def __init__(self):
            super().__init__()
            self.asked = []

        def eligible_client(self, cid, profile):
            self.asked.append((cid, profile["memory_mb"]))
            return cid % 2 == 0

    profiles = [{"memory_mb": m} for m in (50, 200, 150, 10, 300, 20)]
    strategy = ById()
    sim = Simulation(
        strategy=strategy,
        program=DrawClient(),
        clients=_clients(6),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=3, per_round=2),
        profiles=profiles,
    )
    for rnd in (1, 2):
        assert set(sim.sample(rnd)) <= {0, 2, 4}
    assert strategy.asked == [(c, p["memory_mb"]) for c, p in enumerate(profiles)] * 2


def test_profiles_from_the_config_cover_the_population_in_their_shares(tiny):
    from fedge.core.config import load_config

    cfg = load_config(
        tiny(
            **{
                "clients.num": 10,
                "measure.memory": True,  # what memory_mb is checked against
                "clients.profiles": [
                    {"name": "phone", "fraction": 0.7, "memory_mb": 512, "enclave_mb": 0},
                    {"name": "board", "fraction": 0.3, "memory_mb": 64, "enclave_mb": 8},
                ],
            }
        )
    )
    profiles = cfg.clients.assign_profiles(cfg.seed)
    assert [p["name"] for p in profiles].count("phone") == 7 and len(profiles) == 10
    assert profiles == cfg.clients.assign_profiles(cfg.seed)
    with pytest.raises(ConfigError, match="sum to"):
        load_config(tiny(**{"clients.profiles": [{"name": "a", "fraction": 0.5}]}))


# ---- clients that fail to reply (clients.dropout, clients.min_replies) -----------------------------


class PartialEcho(EchoStrategy):
    """EchoStrategy that aggregates whatever replies arrive."""

    partial_replies = True


def _lossy(
    strategy=None, program=None, n=10, per_round=10, rounds=1, dropout=0.3, min_replies=1, workers=0
):
    return Simulation(
        strategy=strategy or PartialEcho(),
        program=program or DrawClient(),
        clients=_clients(n),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(
            seed=0,
            rounds=rounds,
            per_round=per_round,
            dropout=dropout,
            min_replies=min_replies,
            workers=workers,
        ),
    )


def _drawn_out(rnd, phase, ids, p, seed=0):
    """The oracle: each client's own uniform draw from (seed, "dropout", round, exchange, client)."""
    from fedge.core.rng import generator

    out = {
        c
        for c in ids
        if float(
            torch.rand(1, generator=generator(seed, "dropout", rnd, phase, c), dtype=torch.float64)
        )
        < p
    }
    assert out == {
        c for c in ids if drops_out(seed, p, rnd, phase, c)
    }  # the function the docs tests use
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_dropout_loses_seeded_clients_and_the_round_goes_on_with_the_rest(workers):
    sim = _lossy(rounds=20, workers=workers)
    try:
        lines = [sim.run_round(r) for r in range(1, 21)]
    finally:
        sim.close()
    size = len(Message(config={"seed": 1}).to_bytes())
    lost_total = 0
    for rnd, line in enumerate(lines, start=1):
        lost = _drawn_out(rnd, 0, range(10), 0.3)
        assert sim.strategy.seen[rnd - 1] == sorted(set(range(10)) - lost)
        assert line["clients"] == 10 and line["clients_failed"] == len(lost)
        assert (
            line["bytes_down"] == 10 * size
        )  # the message reached the device before it dropped out
        assert line["bytes_up"] == (10 - len(lost)) * len(
            Message({"v": torch.zeros(3)}, config={"calls": 1}).to_bytes()
        )
        lost_total += len(lost)
    assert 30 <= lost_total <= 90  # 200 draws at p = 0.3: ~60 expected
    again = _lossy(rounds=20)
    assert [again.run_round(r)["clients_failed"] for r in range(1, 21)] == [
        x["clients_failed"] for x in lines
    ]


def test_a_client_that_failed_gets_nothing_more_that_round_and_is_back_the_next():
    class TwoSteps(PartialEcho):
        def round(self, rnd, ids):
            first = yield Exchange(dict.fromkeys(ids, Message(config={"a": 1})))
            second = yield Exchange(
                dict.fromkeys(ids, Message(config={"b": 1}))
            )  # addresses the failed ones too
            self.seen.append((sorted(first), sorted(second)))
            return {}

    class Ok:
        def run(self, message, ctx):
            return Message(config={"ok": 1})

    sim = _lossy(strategy=TwoSteps(), program=Ok(), dropout=0.25, rounds=2)
    for rnd in (1, 2):
        line = sim.run_round(rnd)
        out0 = _drawn_out(rnd, 0, range(10), 0.25)
        out1 = _drawn_out(rnd, 1, set(range(10)) - out0, 0.25)
        first, second = sim.strategy.seen[-1]
        assert first == sorted(set(range(10)) - out0) and second == sorted(set(first) - out1)
        assert line["clients_failed"] == len(out0 | out1)
        a, b = len(Message(config={"a": 1}).to_bytes()), len(Message(config={"b": 1}).to_bytes())
        assert (
            line["bytes_down"] == 10 * a + (10 - len(out0)) * b
        )  # nothing is sent to a client already gone
    assert _drawn_out(1, 0, range(10), 0.25) != _drawn_out(2, 0, range(10), 0.25)


def test_failures_stop_the_run_when_the_strategy_needs_every_reply():
    with pytest.raises(
        MessageError,
        match=r"round 1, exchange 1: \d+ of 10 clients gave no result \(client \d+: dropped out "
        r"\(clients.dropout=0.5\).*needs every addressed client's reply",
    ):
        _lossy(strategy=EchoStrategy(), dropout=0.5).run_round(1)


def test_a_round_with_fewer_replies_than_min_replies_is_skipped_with_the_strategy_as_before():
    rounds = range(1, 7)
    replied = [10 - len(_drawn_out(r, 0, range(10), 0.5)) for r in rounds]  # 6, 6, 7, 3, 4, 4
    need = 5  # rounds 4-6 fall short of it
    sim = _lossy(dropout=0.5, min_replies=need, rounds=6)
    lines = [sim.run_round(r) for r in rounds]
    skipped = [n < need for n in replied]
    assert any(skipped) and not all(skipped)
    assert [x.get("round_skipped", 0) == 1 for x in lines] == skipped
    assert [x["clients_failed"] for x in lines] == [10 - n for n in replied]
    assert len(sim.strategy.seen) == sum(not s for s in skipped)  # a skipped round never aggregated
    totals = [x["total"] for x in lines if "total" in x]
    assert sim.strategy.total == totals[-1]  # the skipped rounds changed nothing
    reasons = sim.record.extra["skipped_rounds"]
    assert sorted(reasons) == [str(r) for r, s in zip(rounds, skipped, strict=True) if s]
    assert all(f"fewer than clients.min_replies={need}" in why for why in reasons.values())


def test_a_skipped_round_is_told_to_the_strategy_after_the_restore():
    """Rounds 4-6 fall short of min_replies 5 (as above): each is restored, then handed to
    :meth:`Strategy.round_skipped` (a spend ledger kept outside the state survives only there)."""

    class Ledger(PartialEcho):
        def round_skipped(self, rnd):
            self.told.append((rnd, self.total))  # the state as before the round

    strategy = Ledger()
    strategy.told = []
    sim = _lossy(strategy=strategy, dropout=0.5, min_replies=5, rounds=6)
    lines = [sim.run_round(r) for r in range(1, 7)]
    assert strategy.told == [(r, lines[2]["total"]) for r in (4, 5, 6)]


def test_without_min_replies_nothing_changes():
    assert "clients_failed" not in _sim().run_round(1)
    assert _lossy(dropout=0.0).run_round(1)["clients_failed"] == 0


def _first_aggregated(cfg, rounds):  # noqa: ANN001, ANN202
    """Run ``rounds`` rounds of ``cfg``: the engine's first_aggregated record and the round lines."""
    import warnings

    from fedge.experiment.build import build_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = build_run(cfg).simulation()
    lines = [sim.run_round(t) for t in range(1, rounds + 1)]
    sim.close()
    return {int(c): r for c, r in sim.record.extra["first_aggregated"].items()}, lines


def test_the_record_notes_each_clients_first_aggregated_round_not_the_dropped_nor_a_skipped_round() -> (
    None
):
    """Oracle: the engine's own sampler and dropout draws. Prepare: 3 of 4 clients a round,
    each dropping out with p = 0.4, a round needing 2 replies. Assert: each client's first
    completed round among those that sampled it and did not lose it; a skipped round notes no one."""
    from fedge.attacks.harness import attack_config

    cfg = attack_config(
        {"name": "fedavg", "local_epochs": 1, "batch_size": 2},
        clients=4,
        per_client=2,
        dataset="digits",
        model="lenet",
        rounds=6,
    )
    cfg = cfg.model_copy(
        update={
            "clients": cfg.clients.model_copy(
                update={"per_round": 3, "dropout": 0.4, "min_replies": 2}
            )
        }
    )
    first, lines = _first_aggregated(cfg, cfg.rounds)
    expected: dict[int, int] = {}
    for r in range(1, cfg.rounds + 1):
        replied = [
            c for c in sample_clients(cfg.seed, r, 4, 3) if not drops_out(cfg.seed, 0.4, r, 0, c)
        ]
        if len(replied) >= 2:
            for c in replied:
                expected.setdefault(c, r)
    assert first == expected
    skipped = [i + 1 for i, line in enumerate(lines) if "round_skipped" in line]
    assert skipped and not set(skipped) & set(
        first.values()
    )  # exercised, and a skipped round notes no one
    assert any(r > 1 for r in first.values())  # a client first aggregated after round 1


def test_the_record_under_secure_aggregation_is_the_survivors() -> None:
    """Clients that vanish after key agreement (``secagg_dropout``) replied to the first two
    exchanges but are not in the sum: the strategy names the survivors, U3."""
    from fedge.attacks.harness import attack_config
    from fedge.core.rng import generator

    method = {
        "name": "fedavg",
        "local_epochs": 1,
        "batch_size": 2,
        "secure_aggregation": True,
        "secagg_dropout": 0.25,
    }
    cfg = attack_config(method, clients=4, per_client=2, dataset="digits", model="lenet", rounds=1)
    first, lines = _first_aggregated(cfg, 1)
    gone = torch.randperm(4, generator=generator(cfg.seed, "secagg-dropout", 1))[:1].tolist()
    assert sorted(first) == sorted(set(range(4)) - set(gone)) and set(first.values()) == {1}
    assert lines[0]["secagg_survivors"] == 3
