"""FedPT (seed 002, Algorithm 1): frozen tensors rebuilt from the seed, only y travels."""

import hashlib
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from fedge.core import transforms as T
from fedge.core.config import load_config
from fedge.core.context import ClientContext, ClientData
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.core.rng import derive_seed
from fedge.experiment.build import build_run
from fedge.experiment.run import run_experiment
from fedge.methods.fedavg import DeltaAveraging
from fedge.methods.fedpt import FedPTClient, FedPTConfig, FedPTServer, freeze_
from fedge.models import build_model
from tests_helpers import metrics_without_wall

FC1 = ["classifier.fc1.0.weight", "classifier.fc1.0.bias"]


def _digest(model, names):
    state = model.state_dict()
    h = hashlib.sha256()
    for n in names:
        h.update(state[n].numpy().tobytes())
    return h.hexdigest()


def test_frozen_tensors_rebuild_bit_identically_in_another_process():
    z = derive_seed(7, "model-init")
    want = _digest(build_model("cnn-fedpt", input_shape=(1, 28, 28), num_classes=10, seed=z), FC1)
    code = textwrap.dedent(f"""
        import hashlib, torch
        from fedge.models import build_model
        from fedge.methods.fedpt import reconstruct_
        m = build_model("cnn-fedpt", input_shape=(1, 28, 28), num_classes=10, seed=12345)  # other values
        torch.manual_seed(999); torch.rand(1000)  # the global RNG is irrelevant
        reconstruct_(m, {{}}, {z})
        h = hashlib.sha256()
        for n in {FC1!r}:
            h.update(m.state_dict()[n].numpy().tobytes())
        print(h.hexdigest())
    """)
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert got == want


def _linear_server():
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Linear(1, 1))
    freeze_(model, ["0.weight"])
    return FedPTServer(
        DeltaAveraging(model, T.sgd(1.0), replies_are_gradients=False), seed=5
    ), model


def test_server_sends_trainable_part_and_seed_and_averages_only_it():
    server, model = _linear_server()
    w0 = model[0].weight.detach().clone()
    msgs = server.configure_round(1, [0, 1])
    assert msgs[0] is msgs[1]
    assert list(msgs[0].arrays) == ["0.bias", "1.weight", "1.bias"] and msgs[0].config["seed"] == 5

    def reply(d, n):
        return Message(
            {
                "0.bias": torch.tensor([d]),
                "1.weight": torch.tensor([[d]]),
                "1.bias": torch.tensor([d]),
            },
            {"num_samples": n},
            {"train_loss": 1.0},
        )

    b0 = model[0].bias.detach().clone()
    out = server.aggregate_round(1, {0: reply(1.0, 1), 1: reply(-1.0, 3)})  # Δ = 1/4 - 3/4 = -0.5
    assert torch.allclose(model[0].bias, b0 - 0.5)
    assert torch.equal(model[0].weight, w0)
    assert out["trainable_fraction"] == pytest.approx(3 / 5)  # bias, 1.weight, 1.bias of 5 scalars
    with pytest.raises(MessageError, match=r"client 3.*unexpected arrays \['0.weight'\]"):
        server.aggregate_round(
            2,
            {
                3: Message(
                    {**reply(0.0, 1).arrays, "0.weight": torch.zeros(1, 2)}, {"num_samples": 1}
                )
            },
        )
    with pytest.raises(MessageError, match="shape"):
        server.aggregate_round(
            2, {3: Message({**reply(0.0, 1).arrays, "1.bias": torch.zeros(2)}, {"num_samples": 1})}
        )


def _client_and_message(tmp_seed=0):
    cfg = FedPTConfig(freeze=["classifier.fc1"], batch_size=8, max_steps=2)
    z = derive_seed(tmp_seed, "model-init")

    def model_fn():
        return build_model("cnn-fedpt", input_shape=(1, 12, 12), num_classes=3, seed=z, hidden=16)

    server_model = freeze_(model_fn(), FC1)
    server = FedPTServer(
        DeltaAveraging(server_model, T.sgd(1.0), replies_are_gradients=False), seed=z
    )
    client = FedPTClient(model_fn, FC1, cfg)
    g = torch.Generator().manual_seed(0)
    data = ClientData(
        torch.randn(16, 1, 12, 12, generator=g),
        torch.randint(0, 3, (16,), generator=g),
        torch.arange(16),
    )
    ctx = ClientContext(
        cid=0, rnd=1, data=data, generator=torch.Generator().manual_seed(1), meter=Meter()
    )
    return server, server_model, client, ctx


def test_client_rebuilds_frozen_from_seed_trains_only_y_and_uploads_only_y():
    server, server_model, client, ctx = _client_and_message()
    with torch.no_grad():  # the device starts from garbage: only the seed can restore fc1
        for p in client.local.model.parameters():
            p.fill_(3.0)
    msg = Message.from_bytes(server.configure_round(1, [0])[0].to_bytes())
    assert not set(FC1) & set(msg.arrays)
    reply = client.run(msg, ctx)
    model = client.local.model
    for n in FC1:
        assert torch.equal(model.state_dict()[n], server_model.state_dict()[n])
        assert not dict(model.named_parameters())[n].requires_grad
        assert dict(model.named_parameters())[n].grad is None
    assert set(reply.arrays) == set(msg.arrays)
    assert any(float(a.abs().sum()) > 0 for a in reply.arrays.values())  # it trained
    server.aggregate_round(1, {0: reply})  # and the server accepts it


def test_client_rejects_a_malformed_downlink():
    server, _, client, ctx = _client_and_message()
    msg = server.configure_round(1, [0])[0]
    with pytest.raises(MessageError, match="seed"):
        client.run(Message(msg.arrays, {"round": 1}), ctx)
    frozen = {FC1[0]: torch.zeros(16, 64 * 4 * 4)}
    with pytest.raises(MessageError, match="unexpected arrays"):
        client.run(Message({**msg.arrays, **frozen}, msg.config), ctx)


def _fedpt(tiny, **kw):
    return tiny(**{"method.name": "fedpt", "method.freeze": "largest", **kw})


def test_run_bytes_are_the_serialized_trainable_part_plus_the_seed(tmp_path, tiny):
    cfg = load_config(_fedpt(tiny, rounds=2))
    built = build_run(cfg)
    initial = built.model_fn()
    frozen = [
        n
        for n, p in built.method.strategy.averaging.model.named_parameters()
        if not p.requires_grad
    ]
    assert frozen == [
        "features.fc2.linear.weight",
        "features.fc2.linear.bias",
    ]  # the largest block of the mlp
    out = run_experiment(cfg, out=tmp_path / "run", render=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trainable = {n: p.detach() for n, p in initial.named_parameters() if n not in frozen}
    payload = Message(trainable).nbytes
    seed_bytes = 9  # msgpack uint64
    for line in lines:
        per_client_down = line["bytes_down"] / line["clients"]
        per_client_up = line["bytes_up"] / line["clients"]
        assert abs(per_client_down - (payload + seed_bytes)) <= 0.01 * payload
        assert abs(per_client_up - payload) <= 0.01 * payload
        total = sum(p.numel() for p in initial.parameters())
        assert line["trainable_fraction"] == pytest.approx(
            sum(t.numel() for t in trainable.values()) / total
        )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainable_fraction"] == lines[-1]["trainable_fraction"] < 1
    final = load_file(out / "model.safetensors")
    for n in frozen:  # frozen for the whole run, at the seeded initial values
        assert torch.equal(final[n], initial.state_dict()[n])
    assert any(not torch.equal(final[n], t) for n, t in trainable.items())


def test_nothing_frozen_equals_fedavg_exactly(tmp_path, tiny):
    a = run_experiment(
        load_config(_fedpt(tiny, **{"method.freeze": []})), out=tmp_path / "pt", render=False
    )
    b = run_experiment(load_config(tiny()), out=tmp_path / "avg", render=False)
    keep = ("test_accuracy", "test_loss", "train_loss")
    assert [{k: x[k] for k in keep} for x in metrics_without_wall(a)] == [
        {k: x[k] for k in keep} for x in metrics_without_wall(b)
    ]


def test_freezing_lowers_client_tensor_peak_memory(tmp_path, tiny):
    peaks = {}
    for freeze in ([], "largest", "largest:2"):
        out = run_experiment(
            load_config(
                _fedpt(tiny, rounds=1, **{"method.freeze": freeze, "measure.memory": True})
            ),
            out=tmp_path / str(freeze),
            render=False,
        )
        peaks[str(freeze)] = json.loads((out / "summary.json").read_text())[
            "client_tensor_peak_bytes"
        ]
    assert peaks["[]"] > peaks["largest"] > peaks["largest:2"]


def test_bad_freeze_is_a_config_error_naming_the_blocks(tiny):
    with pytest.raises(ConfigError, match=r"'nope' matches no module.*its blocks are"):
        build_run(load_config(_fedpt(tiny, **{"method.freeze": ["nope"]})))


def test_warm_start_is_refused_naming_why_and_the_fix(tmp_path, tiny):
    """Clients rebuild the frozen tensors from the init seed; a pretrained start is not it."""
    cfg = tiny(rounds=1, method={"name": "fedpt", "freeze": "largest"}, warm_start={"public": 20})
    with pytest.raises(
        ConfigError,
        match=r"^fedpt with warm_start: every client rebuilds the frozen tensors from the init "
        r"seed .*; remove warm_start, or .* method.name=fedavg and method.freeze",
    ):
        run_experiment(load_config(cfg), out=tmp_path / "run", render=False)
    assert not (tmp_path / "run").exists()


def test_secure_aggregation_composes(tmp_path, tiny):
    a = run_experiment(load_config(_fedpt(tiny, rounds=1)), out=tmp_path / "plain", render=False)
    b = run_experiment(
        load_config(_fedpt(tiny, rounds=1, **{"method.secure_aggregation": True})),
        out=tmp_path / "sec",
        render=False,
    )
    ma, mb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    for k in ma:
        assert torch.allclose(ma[k], mb[k], atol=1e-6)
