"""Simulated fleet time: per-client times from measured FLOPs and bytes, a round's duration,
a deadline and over-selection dropping stragglers through clients.min_replies, memory_mb."""

import math

import pytest
import torch

from fedge.core.context import ClientData
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.core.protocols import Exchange, Strategy
from fedge.runtime.engine import DeviceMemoryWarning, EngineConfig, Simulation
from fedge.runtime.fleet import ClientTime, client_time, cut_exchange

MATMUL_FLOPS = 2 * 4 * 5 * 6  # one (4x5)@(5x6) product, as torch's counter counts it


class Collect(Strategy):
    """Broadcasts one config message; keeps the replies it aggregates."""

    partial_replies = True

    def __init__(self):
        self.model = torch.nn.Linear(2, 2)
        self.seen = []

    def configure_round(self, rnd, ids):
        return dict.fromkeys(ids, Message(config={"seed": rnd}))

    def aggregate_round(self, rnd, replies):
        self.seen.append(sorted(replies))
        return {}

    def eval_model(self):
        return self.model

    def state_dict(self):
        return {"seen": list(self.seen)}

    def load_state_dict(self, s):
        self.seen = list(s["seen"])


class Work:
    """Client c does c + 1 products of known FLOPs and replies c + 1 floats; counts its calls."""

    def run(self, message, ctx):
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        a, b = torch.ones(4, 5), torch.ones(5, 6)
        for _ in range(ctx.cid + 1):
            _ = a @ b
        return Message({"v": torch.zeros(ctx.cid + 1)})


def _reply_bytes(cid):
    return len(Message({"v": torch.zeros(cid + 1)}).to_bytes())


def _down_bytes(rnd):
    return len(Message(config={"seed": rnd}).to_bytes())


def _clients(n):
    x, y = torch.randn(n * 2, 2), torch.zeros(n * 2, dtype=torch.long)
    return [ClientData(x, y, torch.tensor([2 * i, 2 * i + 1])) for i in range(n)]


# slow enough that every part counts: 1000 FLOP/s, 1-4 kbps
PROFILES = [
    {"name": "a", "gflops": 1e-6, "downlink_kbps": 4.0, "uplink_kbps": 2.0},
    {"name": "b", "gflops": 2e-6, "downlink_kbps": 2.0, "uplink_kbps": 1.0},
    {"name": "c", "gflops": 0.5e-6, "downlink_kbps": 1.0, "uplink_kbps": 1.0},
]


def _sim(
    profiles=PROFILES,
    *,
    per_round=3,
    deadline_s=None,
    keep_first=None,
    min_replies=None,
    memory=False,
    rounds=1,
    workers=0,
):
    n = len(profiles)
    return Simulation(
        strategy=Collect(),
        program=Work(),
        clients=_clients(n),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(
            seed=0,
            rounds=rounds,
            per_round=per_round,
            time_model=True,
            deadline_s=deadline_s,
            keep_first=keep_first,
            min_replies=min_replies,
            measure_memory=memory,
            workers=workers,
        ),
        profiles=profiles,
    )


def _hand(cid, profile, rnd=1):
    """The oracle: seconds down, computing and up, from the formulas of the docs."""
    down = _down_bytes(rnd) * 8 / (profile["downlink_kbps"] * 1000)
    compute = (cid + 1) * MATMUL_FLOPS / (profile["gflops"] * 1e9)
    up = _reply_bytes(cid) * 8 / (profile["uplink_kbps"] * 1000)
    return down, compute, up


def test_a_round_of_three_clients_lasts_the_slowest_ones_hand_computed_time():
    line = _sim().run_round(1)
    hand = {c: _hand(c, p) for c, p in enumerate(PROFILES)}
    for c, (down, compute, up) in hand.items():
        got = line["sim_clients"][str(c)]
        assert got == pytest.approx({"down_s": down, "compute_s": compute, "up_s": up})
    assert line["client_flops"] == 6 * MATMUL_FLOPS  # the FLOPs the times came from
    assert line["sim_time_s"] == pytest.approx(max(sum(t) for t in hand.values()))
    assert line["sim_time_total_s"] == line["sim_time_s"]


def test_the_total_adds_the_rounds():
    sim = _sim(rounds=2)
    a, b = sim.run_round(1), sim.run_round(2)
    assert b["sim_time_total_s"] == pytest.approx(a["sim_time_s"] + b["sim_time_s"])


def test_halving_an_uplink_doubles_only_that_clients_upload():
    base = _sim().run_round(1)["sim_clients"]
    slow = [dict(p) for p in PROFILES]
    slow[1]["uplink_kbps"] /= 2
    halved = _sim(slow).run_round(1)["sim_clients"]
    assert halved["1"]["up_s"] == pytest.approx(2 * base["1"]["up_s"])
    assert halved["1"]["down_s"] == base["1"]["down_s"]
    assert halved["1"]["compute_s"] == base["1"]["compute_s"]
    assert halved["0"] == base["0"] and halved["2"] == base["2"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_deadline_drops_the_slowest_client_and_the_round_completes_under_min_replies(workers):
    finish = {c: sum(_hand(c, p)) for c, p in enumerate(PROFILES)}
    order = sorted(finish, key=finish.get)
    deadline = (finish[order[1]] + finish[order[2]]) / 2  # between the 2nd and 3rd to finish
    sim = _sim(deadline_s=deadline, min_replies=2, workers=workers)
    line = sim.run_round(1)
    sim.close()
    assert sim.strategy.seen == [sorted(order[:2])]  # the straggler's reply not aggregated
    assert "round_skipped" not in line and line["clients_failed"] == 1
    assert line["clients_straggled"] == 1 and line["sim_clients"][str(order[2])]["straggler"]
    assert line["sim_time_s"] == pytest.approx(deadline)  # the server waited to the deadline
    # its step is undone: no upload, no FLOPs, state as before
    assert line["bytes_up"] == sum(_reply_bytes(c) for c in order[:2])
    assert line["client_flops"] == sum((c + 1) * MATMUL_FLOPS for c in order[:2])
    assert order[2] not in sim.client_states
    assert sim.record.extra["first_aggregated"] == {str(c): 1 for c in order[:2]}


def test_a_deadline_that_leaves_too_few_replies_skips_the_round():
    finish = sorted(sum(_hand(c, p)) for c, p in enumerate(PROFILES))
    sim = _sim(deadline_s=(finish[0] + finish[1]) / 2, min_replies=2)
    line = sim.run_round(1)
    assert line["round_skipped"] == 1 and sim.strategy.seen == []
    assert line["sim_time_s"] == pytest.approx((finish[0] + finish[1]) / 2)  # time still passed


def test_over_selection_keeps_the_first_to_finish_and_ends_with_the_last_kept():
    finish = {c: sum(_hand(c, p)) for c, p in enumerate(PROFILES)}
    order = sorted(finish, key=finish.get)
    sim = _sim(keep_first=2, min_replies=1)
    line = sim.run_round(1)
    assert sim.strategy.seen == [sorted(order[:2])]
    assert line["sim_time_s"] == pytest.approx(finish[order[1]])
    assert line["clients"] == 3 and line["clients_failed"] == 1
    twin = _sim(keep_first=2, min_replies=1)  # the same seed: the same cut and times
    again = twin.run_round(1)
    assert twin.strategy.seen == sim.strategy.seen
    assert {k: v for k, v in again.items() if k.startswith(("sim_", "clients"))} == {
        k: v for k, v in line.items() if k.startswith(("sim_", "clients"))
    }


def test_the_cut_is_deterministic_and_ties_go_to_the_lower_id():
    cut = cut_exchange({5: 1.0, 2: 1.0, 9: 0.5}, keep=2)
    assert cut.kept == [2, 9] and list(cut.stragglers) == [5] and cut.duration_s == 1.0
    both = cut_exchange({0: 1.0, 1: 3.0, 2: 2.0}, deadline_s=2.5, keep=1)
    assert both.kept == [0] and set(both.stragglers) == {1, 2} and both.duration_s == 1.0
    lost = cut_exchange({0: 1.0}, deadline_s=4.0, lost=True)
    assert lost.kept == [0] and lost.duration_s == 4.0  # a lost client is noticed at the deadline
    assert cut_exchange({0: 1.0}, lost=True).duration_s == 1.0  # no deadline: the last reply


def test_client_time_units():
    t = client_time(
        {"gflops": 2.0, "downlink_kbps": 8.0, "uplink_kbps": 1.0},
        flops=4 * 10**9,
        bytes_down=1000,
        bytes_up=250,
    )
    assert t == ClientTime(down_s=1.0, compute_s=2.0, up_s=2.0) and t.total_s == 5.0


def test_a_step_above_its_devices_memory_warns_naming_the_profile_and_need():
    tiny = [dict(p, memory_mb=1e-9) for p in PROFILES]
    sim = _sim(tiny, memory=True)
    with pytest.warns(DeviceMemoryWarning, match=r"device profile 'a'.*memory_mb=1e-09"):
        sim.run_round(1)
    over = sim.record.extra["memory_over"]
    assert set(over) == {"a", "b", "c"} and all(v["need_mb"] > 1e-9 for v in over.values())
    roomy = [dict(p, memory_mb=1024) for p in PROFILES]
    big = _sim(roomy, memory=True)
    big.run_round(1)
    assert "memory_over" not in big.record.extra


def test_without_profiles_no_time_is_logged():
    sim = Simulation(
        strategy=Collect(),
        program=Work(),
        clients=_clients(3),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=1, per_round=3),
    )
    line = sim.run_round(1)
    assert not [k for k in line if k.startswith("sim_")]
    with pytest.raises(ConfigError, match="time_model"):
        Simulation(
            strategy=Collect(),
            program=Work(),
            clients=_clients(3),
            test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
            num_classes=2,
            config=EngineConfig(seed=0, rounds=1, per_round=3, time_model=True),
        )


def test_over_selection_samples_the_rounded_up_share():
    from fedge.core.config import load_config

    cfg = load_config(
        "quickstart",
        overrides=[
            "clients.num=20",
            "clients.per_round=6",
            "clients.over_select=1.3",
            "clients.min_replies=3",
            "clients.profiles=[{device: phone-mid, fraction: 1.0}]",
        ],
    )
    assert cfg.clients.sampled() == math.ceil(1.3 * 6) == 8


class TwoExchanges(Collect):
    """Two exchanges a round: the second addresses every sampled client again."""

    def round(self, rnd, ids):
        first = yield Exchange(self.configure_round(rnd, ids))
        second = yield Exchange(self.configure_round(rnd, ids))
        self.seen.append((sorted(first), sorted(second)))
        return {}


def test_a_client_dropped_in_one_exchange_does_not_hold_the_next_to_the_deadline():
    """The server knows a straggler of exchange 1 is gone: exchange 2 ends with its last reply."""
    finish = {c: sum(_hand(c, p)) for c, p in enumerate(PROFILES)}
    order = sorted(finish, key=finish.get)
    deadline = (finish[order[1]] + finish[order[2]]) / 2
    sim = _sim(deadline_s=deadline, min_replies=2)
    sim.strategy = TwoExchanges()
    line = sim.run_round(1)
    kept = sorted(order[:2])
    assert sim.strategy.seen == [(kept, kept)]
    assert line["sim_time_s"] == pytest.approx(deadline + max(finish[c] for c in kept))
