"""Uplink compression as a composed mechanism: error feedback's residual against its recurrence;
a lossless codec leaves FedAvg's numbers bit for bit; the logged uplink bytes are the encoded
replies' lengths and fall by the codec's ratio; the residuals survive a resume; every method
with a dense upload trains with it; refused combinations and bad values are named."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from fedge.core.compress import CompressSpec, decode, encode, payload_bytes
from fedge.core.config import load_config
from fedge.core.context import ClientContext, ClientData
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.core.rng import derive_seed, make_generator
from fedge.experiment.build import build_run, method_config
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from fedge.methods.compress import RESIDUAL, CompressingClient, Decompression
from fedge.methods.ema import EMAEvaluation
from fedge.methods.private import DifferentialPrivacy, PrivateClient
from tests_helpers import metrics_without_wall, run_cut_after

VOLATILE = re.compile(r"(wall|_s$|seconds|memory|rss|peak|elapsed)")
BASE = {"name": "fedavg", "local_epochs": 1, "batch_size": 16, "client_optimizer": {"lr": 0.1}}


def _cfg(tiny, compress=None, privacy=None, **method):
    extra = {"privacy": privacy} if privacy else {}
    m = {**BASE, **method}
    if compress is not None:
        m["compress"] = compress
    return load_config(tiny(method=m, **extra))


def _train(cfg, rounds=2):
    built = build_run(cfg)
    sim = built.simulation()
    lines = [sim.run_round(r) for r in range(1, rounds + 1)]
    sim.close()
    return built, lines, sim.strategy.eval_model().state_dict()


class _Scripted:
    """A client program whose reply is the round's vector of a script."""

    def __init__(self, script: dict[int, torch.Tensor]) -> None:
        self.script = script

    def run(self, message: Message, ctx: ClientContext) -> Message:
        x = self.script[ctx.rnd]
        return Message({"b": x[:3].clone(), "a": x[3:].clone()}, config={"num_samples": 1})


def _ctx(rnd: int, state: dict) -> ClientContext:
    x, y = torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64)
    return ClientContext(
        cid=2,
        rnd=rnd,
        data=ClientData(x, y, torch.arange(1)),
        generator=torch.Generator().manual_seed(0),
        meter=Meter(),
        state=state,
    )


def _flat(msg_arrays):  # the client's flattening: name order, a before b
    return torch.cat([msg_arrays["a"].reshape(-1), msg_arrays["b"].reshape(-1)])


@pytest.mark.parametrize("spec", [CompressSpec("topk", ratio=0.2), CompressSpec("sign")])
def test_error_feedback_residual_follows_its_recurrence(spec):
    """e_t = x_t + e_{t−1} − C(x_t + e_{t−1}), C computed here from the codec; so what was sent
    plus the last residual is everything the client had to send (Σ C_t + e_T = Σ x_t)."""
    g = torch.Generator().manual_seed(1)
    script = {t: torch.randn(20, generator=g) for t in (1, 2, 3, 4)}
    client = CompressingClient(_Scripted(script), spec, error_feedback=True, seed=9)
    state: dict = {}
    e = torch.zeros(20)
    sent_total = torch.zeros(20)
    for t in (1, 2, 3, 4):
        reply = client.run(Message(), _ctx(t, state))
        x = _flat({"a": script[t][3:], "b": script[t][:3]})
        p = x + e
        seed = derive_seed(9, "compress", t, 2)
        c = decode(spec, encode(spec, p, make_generator("torch", seed, "compress")), 20)
        e = p - c
        assert torch.equal(state[RESIDUAL], e)
        sent = decode(spec, dict(reply.arrays), 20)
        assert torch.equal(sent, c)
        assert torch.allclose(sent + state[RESIDUAL], p, atol=1e-6)  # sent part + residual = input
        sent_total += sent
    total = sum(_flat({"a": v[3:], "b": v[:3]}) for v in script.values())
    assert torch.allclose(sent_total + state[RESIDUAL], total, atol=1e-5)


def test_without_error_feedback_no_residual_is_kept():
    script = {1: torch.arange(10.0)}
    client = CompressingClient(
        _Scripted(script), CompressSpec("topk", ratio=0.3), error_feedback=False, seed=0
    )
    state: dict = {}
    reply = client.run(Message(), _ctx(1, state))
    assert RESIDUAL not in state and reply.config["compress"] == "topk"
    assert reply.config["num_samples"] == 1 and set(reply.arrays) == {
        "compress.idx",
        "compress.val",
    }


def test_a_lossless_codec_leaves_fedavg_bit_for_bit(tiny):
    """Top-k with ratio 1 sends every value (and its index): the server decodes exactly the
    replies plain FedAvg averages, so the weights and metrics are the same, bytes aside."""
    _, plain, w_plain = _train(_cfg(tiny))
    built, comp, w_comp = _train(_cfg(tiny, {"name": "topk", "ratio": 1.0}))
    assert built.method.applied == ("compress",)
    assert all(torch.equal(w_plain[k], w_comp[k]) for k in w_plain)
    for a, b in zip(plain, comp, strict=True):
        assert a["test_accuracy"] == b["test_accuracy"] and a["train_loss"] == b["train_loss"]
        assert a["bytes_down"] == b["bytes_down"]
        assert 1.95 < b["bytes_up"] / a["bytes_up"] < 2.05  # int32 index + float32 value


class _Recorder:
    def __init__(self, inner):
        self.inner, self.sizes = inner, []

    def run(self, message, ctx):
        reply = self.inner.run(message, ctx)
        self.sizes.append((len(reply.to_bytes()), reply))
        return reply


@pytest.mark.parametrize(
    "compress",
    [
        {"name": "topk", "ratio": 0.01},
        {"name": "randk", "ratio": 0.05},
        {"name": "qsgd", "levels": 3, "bucket": 256},
        {"name": "sign"},
        {"name": "quantize", "bits": 4},
    ],
    ids=lambda c: c["name"],
)
def test_logged_uplink_bytes_are_the_encoded_replies(tiny, compress):
    built = build_run(_cfg(tiny, compress))
    recorder = _Recorder(built.method.program)
    built = dataclasses.replace(built, method=dataclasses.replace(built.method, program=recorder))
    sim = built.simulation()
    line = sim.run_round(1)
    sim.close()
    d = sum(p.numel() for p in built.model_fn().parameters())
    spec = built.method.strategy.spec
    assert len(recorder.sizes) == 4 and line["bytes_up"] == sum(n for n, _ in recorder.sizes)
    for n, reply in recorder.sizes:
        raw = sum(a.numel() * a.element_size() for a in reply.arrays.values())
        assert raw == payload_bytes(spec, d) and n - raw < 200  # the rest: names, config, metrics
    _, dense, _ = _train(_cfg(tiny), rounds=1)
    assert line["bytes_up"] < dense[0]["bytes_up"] * max(0.2, 2 * payload_bytes(spec, d) / (4 * d))


def test_error_feedback_residuals_survive_a_resume(tmp_path, tiny, monkeypatch):
    """3 of 6 clients a round, cut after round 2: the residuals of the clients sampled so far
    are in the checkpoint, so the resumed run equals the uninterrupted one."""
    method = {**BASE, "compress": {"name": "topk", "ratio": 0.02}}
    cfg = tiny(rounds=4, method=method, **{"clients.num": 6, "clients.per_round": 3})
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)


def test_worker_processes_carry_the_residuals(tmp_path, tiny):
    """Clients run in worker processes: their residuals travel with their state, so the run
    equals the in-process one (3 of 6 clients a round: some come back with a residual)."""
    method = {**BASE, "compress": {"name": "sign"}}
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


def test_the_residual_changes_the_run(tiny):
    """The resume test above is not vacuous: error feedback changes what the clients send."""
    _, with_ef, _ = _train(_cfg(tiny, {"name": "topk", "ratio": 0.02}), rounds=2)
    _, without, _ = _train(
        _cfg(tiny, {"name": "topk", "ratio": 0.02, "error_feedback": False}), rounds=2
    )
    assert with_ef[0]["test_accuracy"] == without[0]["test_accuracy"]  # round 1: e = 0
    assert with_ef[1]["test_loss"] != without[1]["test_loss"]


def test_fedavg_trains_with_each_codec(tiny):
    for compress in ({"name": "topk", "ratio": 0.05}, {"name": "qsgd"}, {"name": "quantize"}):
        _, lines, _ = _train(_cfg(tiny, compress), rounds=3)
        assert lines[-1]["test_accuracy"] > lines[0]["test_accuracy"] + 0.1, compress


@pytest.mark.parametrize(
    "method",
    [
        {"name": "fedsgd", "batch_size": 16},
        {**BASE, "name": "fedprox", "mu": 0.01},
        {**BASE, "name": "scaffold"},
        {**BASE, "name": "fednova"},
        {**BASE, "name": "fedpt", "freeze": "largest"},
        {"name": "baffle", "mode": "epoch", "k": 4, "batch_size": 16},
    ],
    ids=lambda m: m["name"],
)
def test_every_dense_uploading_method_composes(tiny, method):
    """Each method whose clients upload a model delta or gradient runs with top-k 10%, and
    its uplink falls below 30% of its dense one (8 bytes a kept coordinate, 4 a dense one)."""
    compressed = load_config(tiny(method={**method, "compress": {"name": "topk", "ratio": 0.1}}))
    built, lines, _ = _train(compressed, rounds=1)
    assert "compress" in built.method.applied
    _, dense, _ = _train(load_config(tiny(method=method)), rounds=1)
    assert lines[0]["bytes_up"] < 0.3 * dense[0]["bytes_up"]


def test_dp_clips_then_compresses_and_the_server_decodes_before_noising(tiny):
    dp = {"mechanism": "gaussian", "noise_multiplier": 0.5, "clip": 1.0}
    with pytest.warns(Warning):
        built, lines, _ = _train(_cfg(tiny, {"name": "qsgd"}, dp, ema=0.9), rounds=1)
    m = built.method
    assert m.applied == ("dp", "compress", "ema")
    s = m.strategy
    assert isinstance(s, EMAEvaluation) and isinstance(s.inner, Decompression)
    assert isinstance(s.inner.inner, DifferentialPrivacy)
    assert isinstance(m.program, CompressingClient) and isinstance(m.program.inner, PrivateClient)
    assert lines[0]["epsilon"] > 0


def test_the_server_reclips_what_a_codec_carries_past_the_clip(tiny):
    """DP's bound holds whatever the codec does: randk's d/k scaling carries a clipped client
    vector (norm C) far past C, and the server's re-clip keeps the noiseless mean within C."""
    dp = {"mechanism": "gaussian", "noise_multiplier": 0.0, "clip": 0.05}
    with pytest.warns(Warning):
        built = build_run(_cfg(tiny, {"name": "randk", "ratio": 0.05}, dp))
    recorder = _Recorder(built.method.program)
    built = dataclasses.replace(built, method=dataclasses.replace(built.method, program=recorder))
    before = {k: v.clone() for k, v in built.model_fn().state_dict().items()}
    sim = built.simulation()
    sim.run_round(1)
    sim.close()
    after = sim.strategy.eval_model().state_dict()
    step = torch.cat([(after[k] - before[k]).reshape(-1) for k in before]).norm()
    decoded = built.method.strategy.decode_replies(1, {0: recorder.sizes[0][1]})[0]
    sent = torch.cat([a.reshape(-1) for a in decoded.arrays.values()]).norm()
    assert float(sent) > 3 * 0.05 and float(step) <= 0.05 * (1 + 1e-5)


def test_same_seed_same_bytes_and_numbers(tiny):
    for compress in ({"name": "randk", "ratio": 0.1}, {"name": "qsgd"}):
        _, a, _ = _train(_cfg(tiny, compress))
        _, b, _ = _train(_cfg(tiny, compress))
        assert [_fixed(line) for line in a] == [_fixed(line) for line in b]
        assert a[0]["bytes_up"] > 0


def _fixed(line: dict) -> dict:
    """A metrics line less the keys that measure the machine (time, memory)."""
    return {k: v for k, v in line.items() if not VOLATILE.search(k)}


def test_portable_draws_compose(tiny):
    cfg = load_config(tiny(draws="portable", method={**BASE, "compress": {"name": "randk"}}))
    _, lines, _ = _train(cfg, rounds=1)
    assert lines[0]["bytes_up"] > 0


@pytest.mark.parametrize(
    ("method", "match"),
    [
        (
            {"name": "fedkseed", "compress": {"name": "topk"}},
            r"method\.compress: method 'fedkseed' cannot take uplink compression: its clients "
            r"upload no dense vector",
        ),
        (
            {"name": "eppfl", "compress": {"name": "sign"}},
            r"method\.compress: method 'eppfl' cannot take uplink compression",
        ),
    ],
)
def test_a_method_without_a_dense_upload_is_refused_with_the_reason(tiny, method, match):
    with pytest.raises(ConfigError, match=match):
        method_config(load_config(tiny(method=method)))


def test_baffle_batch_mode_is_refused_its_loss_differences(tiny):
    cfg = load_config(
        tiny(method={"name": "baffle", "mode": "batch", "k": 4, "compress": {"name": "qsgd"}})
    )
    with pytest.raises(ConfigError, match=r"uploads K loss differences.*method\.mode=epoch"):
        build_run(cfg)


def test_secure_aggregation_is_refused_with_the_reason(tiny):
    with pytest.raises(
        ConfigError,
        match=r"method\.compress\.name=topk with method\.secure_aggregation=true: .*fixed-point "
        r"ring.*method\.secure_aggregation=false",
    ):
        build_run(_cfg(tiny, {"name": "topk"}, secure_aggregation=True))


@pytest.mark.parametrize(
    ("compress", "match"),
    [
        ({"name": "topk", "ratio": 0}, r"method\.compress\.ratio.*greater than 0"),
        ({"name": "topk", "ratio": 1.5}, r"method\.compress\.ratio.*less than or equal to 1"),
        ({"name": "topk", "levels": 4}, r"compress\.levels=4 applies to qsgd, not to name=topk"),
        ({"name": "sign", "ratio": 0.1}, r"compress\.ratio=0\.1 applies to topk and randk"),
        ({"name": "quantize", "bits": 3}, r"method\.compress\.bits"),
        ({"name": "qsgd", "bucket": 0}, r"method\.compress\.bucket"),
        ({"name": "gzip"}, r"method\.compress\.name"),
        ({"name": "topk", "k": 5}, r"method\.compress\.k"),
    ],
)
def test_bad_values_are_named(tiny, compress, match):
    with pytest.raises(ConfigError, match=match):
        method_config(_cfg(tiny, compress))


def test_unset_keys_take_the_codecs_defaults(tiny):
    c = method_config(_cfg(tiny, {"name": "qsgd"})).compress
    assert (c.levels, c.bucket, c.error_feedback, c.ratio, c.bits) == (7, 512, False, None, None)
    c = method_config(_cfg(tiny, {"name": "topk"})).compress
    assert (c.ratio, c.error_feedback, c.bucket) == (0.01, True, None)
    assert method_config(_cfg(tiny)).compress is None
