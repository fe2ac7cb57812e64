"""A round's pieces on their own: the driver over a toy generator, the accounting of an
exchange against hand-computed counters, the failure rule, and the metrics line."""

import pytest
import torch

from fedge.core.errors import DivergenceError, MessageError, ShortRoundError
from fedge.core.messages import Message
from fedge.core.meter import StepStats
from fedge.core.protocols import Exchange, PartyCall, Savepoint
from fedge.runtime.executor import ClientResult
from fedge.runtime.round import (
    RoundRecord,
    RoundTotals,
    check_failures,
    decode_replies,
    drive_round,
    metrics_line,
)


def _two_exchanges_and_a_call(ids):
    first = yield Exchange({c: Message(config={"a": c}) for c in ids})
    answer = yield PartyCall("edge", Message(config={"n": len(first)}))
    second = yield Exchange({c: Message(config={"b": 1}) for c in sorted(first)[:1]})
    return {"first": sorted(first), "second": sorted(second), "n": answer.config["n"]}


def test_the_driver_sends_each_step_where_it_goes_and_returns_what_the_round_returned():
    seen = []

    def exchange(index, messages):
        seen.append(("exchange", index, sorted(messages)))
        return {c: Message() for c in messages if c != 2}  # client 2 gave nothing

    def call(party_call):
        seen.append(("call", party_call.party))
        return Message(config={"n": 10 * party_call.message.config["n"]})

    ids = [1, 2, 5]
    driven = drive_round(3, ids, _two_exchanges_and_a_call(ids), exchange=exchange, call=call)
    assert seen == [("exchange", 0, [1, 2, 5]), ("call", "edge"), ("exchange", 1, [1])]
    assert driven.value == {"first": [1, 5], "second": [1], "n": 20}
    assert driven.replied == [1]  # the last exchange's


def test_the_driver_refuses_a_first_exchange_short_of_the_sample_and_clients_not_sampled():
    def rounds(*exchanges):
        for messages in exchanges:
            yield Exchange(messages)

    def echo(index, messages):
        return dict(messages)

    with pytest.raises(
        MessageError, match=r"round 4: strategy configured no message for clients \[2\]"
    ):
        drive_round(4, [1, 2], rounds({1: Message()}), exchange=echo, call=None)
    with pytest.raises(MessageError, match=r"exchange 2 addresses clients \[9\] not sampled"):
        later = rounds({1: Message()}, {1: Message(), 9: Message()})
        drive_round(4, [1], later, exchange=echo, call=None)


def test_the_driver_hands_savepoints_over_and_a_continued_round_starts_at_its_exchange():
    def round_(ids):
        replies = yield Exchange({c: Message() for c in ids})
        got = yield Savepoint("pruning", 1, 2)
        replies = yield Exchange({c: Message() for c in sorted(replies)})
        return {"got": got, "n": len(replies)}

    seen = []

    def exchange(index, messages):
        seen.append(("exchange", index))
        return dict(messages)

    def savepoint(point, index):
        seen.append(("savepoint", point.phase, point.done, point.total, index))

    driven = drive_round(
        1, [3, 4], round_([3, 4]), exchange=exchange, call=None, savepoint=savepoint
    )
    assert seen == [("exchange", 0), ("savepoint", "pruning", 1, 2, 1), ("exchange", 1)]
    assert driven.value == {"got": None, "n": 2}  # the round gets None back
    assert drive_round(1, [3, 4], round_([3, 4]), exchange=exchange, call=None).value["n"] == 2

    def after_the_savepoint():  # a continued round: its next exchange addresses the survivors
        replies = yield Exchange({3: Message()})
        return {"n": len(replies)}

    seen.clear()
    drive_round(1, [3, 4], after_the_savepoint(), exchange=exchange, call=None, first=1)
    assert seen == [("exchange", 1)]  # numbered on from the savepoint (dropout draws use it)


def test_round_totals_survive_a_checkpoint_inside_the_round():
    totals = RoundTotals(bytes_down=5, bytes_up=7, transport={"flower_bytes": 3}, exchanges=2)
    party = StepStats(flops=2, wall_s=0.1, tensor_peak_bytes=9)
    totals.add(StepStats(flops=11, wall_s=0.5, links={"client->edge": 4}, parties={"edge": party}))
    totals.fail({6: "dropped out"})
    state = totals.state_dict()
    again = RoundTotals.from_state(torch.load(_saved(state), weights_only=True))
    assert again == totals


def _saved(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_the_driver_lets_an_exchanges_error_through():
    def short(index, messages):
        raise ShortRoundError("too few")

    with pytest.raises(ShortRoundError, match="too few"):
        drive_round(1, [0], _two_exchanges_and_a_call([0]), exchange=short, call=None)


def _result(reply: bytes, flops: int, parties=None, links=None, side=(0, 0)) -> ClientResult:
    stats = StepStats(flops=flops, wall_s=0.5, side_bytes_down=side[0], side_bytes_up=side[1])
    stats.parties.update(parties or {})
    stats.links.update(links or {})
    return ClientResult(reply, None, None, {}, stats)


def test_accounting_of_an_exchange_by_hand():
    """Three clients sent 100, 100 and 40 bytes; client 7 dropped out after its message was
    sent; clients 1 and 4 replied with 30 and 50 bytes at 1000 and 3000 FLOPs, client 4
    calling its edge (200 FLOPs there, 8 bytes each way on its link); a server call to the
    edge moved 5 bytes up and 6 down; the executor moved 9 bytes of its own."""
    totals = RoundTotals(transport={"wire": 0})
    for n in (100, 100, 40):
        totals.sent(n)
    totals.add_transport({"wire": 9})
    totals.fail({7: "dropped out"})
    totals.fail({7: "failed earlier this round"})  # its first reason stays
    edge = StepStats(flops=200, wall_s=0.25)
    totals.received(
        {
            4: _result(
                b"x" * 50,
                3000,
                {"edge": edge},
                {"client->edge": 8, "edge->client": 8},
                side=(8, 8),
            ),
            1: _result(b"y" * 30, 1000),
        }
    )
    totals.add_party("edge", StepStats(flops=70, wall_s=0.125))
    totals.add_link("server->edge", 5)
    totals.add_link("edge->server", 6)
    assert (totals.bytes_down, totals.bytes_up) == (240, 80)
    assert (totals.client.flops, totals.client.wall_s) == (4000, 1.0)
    assert (totals.client.side_bytes_down, totals.client.side_bytes_up) == (8, 8)
    assert (totals.parties["edge"].flops, totals.parties["edge"].wall_s) == (270, 0.375)
    assert edge.flops == 200  # the client's own record is not changed
    assert totals.links == {
        "client->edge": 8,
        "edge->client": 8,
        "server->edge": 5,
        "edge->server": 6,
    }
    assert totals.failed == {7: "dropped out"} and totals.transport == {"wire": 9}

    record = RoundRecord(round=1, cum_bytes_down=1000, cum_bytes_up=10, cum_client_flops=5)
    record.add(2, totals)
    assert (record.round, record.cum_bytes_down, record.cum_bytes_up) == (2, 1240, 90)
    assert record.cum_client_flops == 4005


def test_failures_go_on_stop_or_skip_by_the_rule():
    failed = {3: "unplugged"}
    kw = dict(min_replies=2, partial_replies=True, method="Toy")
    check_failures(1, 0, 3, 2, failed, **kw)  # enough replies: goes on
    with pytest.raises(ShortRoundError, match=r"only 1 replied, fewer than clients.min_replies=2$"):
        check_failures(1, 0, 3, 1, failed, **kw)
    with pytest.raises(MessageError, match=r"this method \(Toy\) needs every addressed client's"):
        check_failures(2, 1, 3, 2, failed, min_replies=None, partial_replies=False, method="Toy")
    with pytest.raises(MessageError, match=r"set clients.min_replies") as info:
        check_failures(2, 1, 3, 2, failed, min_replies=None, partial_replies=True, method="Toy")
    assert not isinstance(info.value, ShortRoundError)
    assert str(info.value).startswith("round 2, exchange 2: 1 of 3 clients gave no result")


def test_replies_are_decoded_and_a_non_finite_one_is_refused():
    good = Message({"v": torch.ones(2)}).to_bytes()
    bad = Message({"v": torch.tensor([float("nan")])}).to_bytes()
    got = decode_replies(1, {2: _result(good, 0), 0: _result(good, 0)})
    assert list(got) == [0, 2] and torch.equal(got[2].arrays["v"], torch.ones(2))
    with pytest.raises(
        MessageError, match=r"round 1, client 5: array 'v' holds non-finite"
    ) as info:
        decode_replies(1, {5: _result(bad, 0)})
    # a divergence by type, with the round and what diverged (the run's error words them)
    assert isinstance(info.value, DivergenceError) and info.value.round == 1
    assert info.value.cause == "array 'v' holds non-finite values (NaN or Inf) (round 1, client 5)"


def test_the_metrics_line_by_hand():
    totals = RoundTotals(bytes_down=240, bytes_up=80, exchanges=2, transport={"wire": 9})
    totals.client.merge(StepStats(flops=4000, wall_s=1.0, side_bytes_down=8, side_bytes_up=8))
    totals.add_party("edge", StepStats(flops=270, wall_s=0.375))
    totals.add_link("client->edge", 8)
    record = RoundRecord(round=2, cum_bytes_down=1240, cum_bytes_up=90, cum_client_flops=4005)
    line = metrics_line(
        2,
        3,
        totals,
        record,
        figures={"test_accuracy": 0.5, "test_loss": 1.25},
        aggregate={"total": 4.0, "bytes_up": -1},  # a key already there is not replaced
        failed=1,
        parties=True,
        more=lambda line: {"total_twice": 2 * line["total"], "round": -1},
    )
    assert line == {
        "round": 2,
        "clients": 3,
        "clients_failed": 1,
        "test_accuracy": 0.5,
        "test_loss": 1.25,
        "bytes_down": 240,
        "bytes_up": 80,
        "client_flops": 4000,
        "cum_bytes_down": 1240,
        "cum_bytes_up": 90,
        "cum_client_flops": 4005,
        "phases": 2,
        "side_bytes_down": 8,
        "side_bytes_up": 8,
        "bytes.client->edge": 8,
        "flops.edge": 270,
        "wall_s.edge": 0.375,
        "total": 4.0,
        "total_twice": 8.0,
        "client_wall_s": 1.0,
        "wire": 9,
    }
    assert list(line)[-2:] == ["client_wall_s", "wire"]
    bare = metrics_line(1, 3, RoundTotals(exchanges=1), RoundRecord(), figures={}, aggregate={})
    assert "clients_failed" not in bare and "phases" not in bare and "side_bytes_up" not in bare


def test_the_per_round_peak_is_the_tensor_peak_and_rss_growth_is_named_as_such():
    # round 2 of a real run: 1.1 MB of tensors, but the RSS high-water mark grew by 12 KB only
    totals = RoundTotals(exchanges=1)
    totals.add(StepStats(tensor_peak_bytes=1_100_000, rss_peak_bytes=12_288))
    line = metrics_line(2, 1, totals, RoundRecord(), figures={}, aggregate={}, memory=True)
    assert line["client_peak_bytes"] == line["client_tensor_peak_bytes"] == 1_100_000
    assert line["client_rss_growth_bytes"] == 12_288
    bare = metrics_line(2, 1, totals, RoundRecord(), figures={}, aggregate={})
    assert "client_peak_bytes" not in bare and "client_rss_growth_bytes" not in bare


def test_flops_not_measured_leave_no_flops_key():
    totals = RoundTotals(exchanges=1)
    totals.add_party("edge", StepStats(wall_s=0.5))
    line = metrics_line(
        1, 2, totals, RoundRecord(), figures={}, aggregate={}, parties=True, flops=False
    )
    assert not [k for k in line if "flops" in k]
    assert line["bytes_down"] == 0 and line["wall_s.edge"] == 0.5


def test_on_a_gpu_the_per_round_peak_is_the_cuda_allocators_and_the_largest_step_wins():
    """Two client steps on a CUDA device: the round's client_peak_bytes is the larger of their
    CUDA peaks (StepStats.device_peak_bytes), the tensor accounting stays under its own name."""
    totals = RoundTotals(exchanges=1)
    totals.add(StepStats(tensor_peak_bytes=1_000, rss_peak_bytes=0, device_peak_bytes=7_168))
    totals.add(StepStats(tensor_peak_bytes=3_000, rss_peak_bytes=0, device_peak_bytes=5_120))
    line = metrics_line(1, 2, totals, RoundRecord(), figures={}, aggregate={}, memory=True)
    assert line["client_peak_bytes"] == 7_168
    assert line["client_tensor_peak_bytes"] == 3_000
