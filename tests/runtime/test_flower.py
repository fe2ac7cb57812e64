"""fedge on Flower (fedge.runtime.flower): the same config and seed give the same metrics on the
built-in engine and through Flower's ServerApp/ClientApp (in-process grid)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "flwr",
    reason="flwr is not installed (pip install 'fedge[flower]'); the Flower runtime is optional",
)

import torch  # noqa: E402
from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402

from fedge.core.config import load_config  # noqa: E402
from fedge.core.context import ClientData  # noqa: E402
from fedge.core.errors import ConfigError, MessageError  # noqa: E402
from fedge.core.messages import Message as FedgeMessage  # noqa: E402
from fedge.experiment.run import run_experiment  # noqa: E402
from fedge.runtime.engine import encode_state  # noqa: E402
from fedge.runtime.flower import LocalGrid, client_app  # noqa: E402
from fedge.runtime.flower.adapter import RECORD  # noqa: E402
from tests.conftest import tiny_config  # noqa: E402

SAME = (
    "test_accuracy",
    "test_loss",
    "bytes_down",
    "bytes_up",
    "client_flops",
    "cum_bytes_down",
    "cum_bytes_up",
    "cum_client_flops",
    "phases",
    "train_loss",
)


def _lines(path):
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def _both(tmp_path, cfg):
    a = run_experiment(load_config(cfg), out=tmp_path / "engine", render=False)
    b = run_experiment(
        load_config(cfg), out=tmp_path / "flower", render=False, runtime="flower-sim"
    )
    return _lines(a), _lines(b), b


def _assert_same(engine, flower):
    assert len(engine) == len(flower)
    for e, f in zip(engine, flower, strict=True):
        for key in SAME:
            assert (key in f) == (key in e), key
            if key in e:
                assert f[key] == pytest.approx(e[key], rel=1e-9, abs=0), (e["round"], key)
        for key in e:  # side parties' costs and bytes (flops.edge, bytes.client->edge, ...)
            if key.startswith(("bytes.", "flops.", "side_bytes")):
                assert f[key] == e[key], key
        # Flower's own message sizes: fedge's bytes plus Flower's metadata and record framing
        framing = 2000 * f["clients"] * f.get("phases", 1)
        party = f.get(
            "flower_party_state_bytes", 0
        )  # side parties' states travel with the messages
        assert f["bytes_down"] < f["flower_bytes_down"]
        assert f["bytes_up"] < f["flower_bytes_up"]
        assert (
            f["flower_bytes_down"] + f["flower_bytes_up"]
            < f["bytes_down"] + f["bytes_up"] + party + 2 * framing
        )


def test_fedavg_on_digits_same_metrics_as_the_engine(tmp_path):
    cfg = tiny_config(
        rounds=2, **{"dataset": {"name": "digits"}, "clients.num": 4, "clients.per_round": 3}
    )
    engine, flower, run = _both(tmp_path, cfg)
    _assert_same(engine, flower)
    assert engine[-1]["test_accuracy"] > 0.3  # it trained
    summary = json.loads((run / "summary.json").read_text())
    assert summary["runtime"] == "flower-sim" and (run / "metrics.jsonl").exists()


def test_batch_baffle_with_secure_aggregation_same_metrics_as_the_engine(tmp_path):
    method = {
        "name": "baffle",
        "mode": "batch",
        "k": 4,
        "batch_size": 32,
        "clip": None,
        "ema": None,
        "secure_aggregation": True,
    }
    cfg = tiny_config(
        rounds=2,
        method=method,
        **{"dataset": {"name": "digits"}, "clients.num": 3, "clients.per_round": 3},
    )
    engine, flower, _ = _both(tmp_path, cfg)
    assert engine[0].get("phases", 1) > 1  # secure aggregation's exchanges ran
    _assert_same(engine, flower)


def test_activity_perturbation_with_local_heads_same_metrics_as_the_engine(tmp_path):
    """The local heads travel beside the model (their own arrays in both directions) and the
    clients' persistent Adam state covers them, on a node as in the engine."""
    from tests_helpers import local_heads_section

    method = local_heads_section()
    engine, flower, _ = _both(
        tmp_path, tiny_config(rounds=2, model={"name": "lenet"}, method=method)
    )
    _assert_same(engine, flower)


@pytest.mark.parametrize(
    "method",
    [
        {"name": "fedkseed", "k": 16, "local_steps": 3, "batch_size": 16},  # secure aggregation on
        {"name": "fedkseed", "k": 16, "local_steps": 3, "secure_aggregation": False},
        {"name": "feedsign", "lr": 0.01, "batch_size": 16},
    ],
    ids=["fedkseed-secagg", "fedkseed", "feedsign"],
)
def test_seed_and_scalar_methods_same_metrics_as_the_engine(tmp_path, method):
    """2 of 4 clients a round: the clients that missed rounds rebuild the model from what the
    server replays, each node holding its model in its context state, as on the engine."""
    cfg = tiny_config(
        rounds=3,
        method=method,
        **{"dataset": {"name": "digits"}, "clients.num": 4, "clients.per_round": 2},
    )
    engine, flower, _ = _both(tmp_path, cfg)
    _assert_same(engine, flower)


def test_simulated_dropouts_lose_the_same_clients_as_on_the_engine(tmp_path):
    """clients.dropout is drawn by the engine's own code, so Flower loses the same clients, here
    inside secure aggregation's four exchanges, with the same figures."""
    method = {
        "name": "baffle",
        "mode": "batch",
        "k": 4,
        "batch_size": 32,
        "clip": None,
        "ema": None,
        "secure_aggregation": True,
    }
    cfg = tiny_config(
        rounds=2,
        method=method,
        **{
            "dataset": {"name": "digits"},
            "clients.num": 6,
            "clients.per_round": 6,
            "clients.dropout": 0.1,
            "clients.min_replies": 3,
            "seed": 10,
        },
    )
    engine, flower, _ = _both(tmp_path, cfg)
    assert sum(x["clients_failed"] for x in engine) > 0
    assert [x["clients_failed"] for x in flower] == [x["clients_failed"] for x in engine]
    _assert_same(engine, flower)


def test_eppfl_side_parties_co_located_same_metrics_as_the_engine(tmp_path):
    cfg = tiny_config(
        **{
            "rounds": 2,
            "clients.num": 3,
            "clients.per_round": 2,
            "dataset.limit_train": 96,
            "dataset.limit_test": 50,
            "model": {"name": "vgg9", "dropout": False},
            "method": {"name": "eppfl", "local_epochs": 1, "batch_size": 16},
        }
    )
    engine, flower, _ = _both(tmp_path, cfg)
    assert any(k.startswith("bytes.client->edge") for k in engine[0])
    _assert_same(engine, flower)


# ---- the ClientApp and the grid on their own ------------------------------------------------


class _Counter:
    """Counts its calls in ctx.state (persistent) and ctx.round_state (one round)."""

    def run(self, msg, ctx):
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        ctx.round_state["in_round"] = ctx.round_state.get("in_round", 0) + 1
        return FedgeMessage(
            {},
            {"cid": ctx.cid, "calls": ctx.state["calls"], "in_round": ctx.round_state["in_round"]},
        )


def _train(cid, rnd, phase):
    body = {"cid": cid, "rnd": rnd, "phase": phase, "message": FedgeMessage({}, {}).to_bytes()}
    return Message(
        RecordDict({RECORD: ConfigRecord(body)}),
        dst_node_id=1000 + cid,
        message_type="train",
        group_id="g",
    )


def _reply(m):
    assert not m.has_error(), m.error.reason
    return FedgeMessage.from_bytes(bytes(m.content.config_records[RECORD]["reply"])).config


def test_client_state_lives_in_the_nodes_context_state():
    data = ClientData(torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64), torch.arange(4))
    app = client_app(
        _Counter(), lambda cid: data, seed=0, measure_flops=False, measure_memory=False, parties={}
    )
    grid = LocalGrid(app, [{"partition-id": i} for i in range(2)])
    seen = [_reply(m) for m in grid.send_and_receive([_train(1, 1, 0), _train(0, 1, 0)])]
    assert [(r["cid"], r["calls"], r["in_round"]) for r in seen] == [(1, 1, 1), (0, 1, 1)]
    (again,) = grid.send_and_receive([_train(1, 1, 1)])  # the same round's next exchange
    assert (_reply(again)["calls"], _reply(again)["in_round"]) == (2, 2)
    (later,) = grid.send_and_receive([_train(1, 2, 0)])  # a new round: round state starts empty
    assert (_reply(later)["calls"], _reply(later)["in_round"]) == (3, 1)
    node = grid.contexts[1001].state.config_records[RECORD]
    assert bytes(node["state"]) == encode_state({"calls": 3})
    assert bytes(grid.contexts[1000].state.config_records[RECORD]["state"]) == encode_state(
        {"calls": 1}
    )


def test_a_shared_party_whose_state_changes_is_refused_with_advice_that_works_on_flower():
    """clients.workers=0 (the engine's fix) does nothing on Flower: the error says what does."""
    from fedge.core.protocols import PartySpec
    from fedge.runtime.engine import EngineConfig
    from fedge.runtime.flower import flower_simulation
    from tests.runtime.test_engine import CountingServer, Device, Edge, _clients

    sim = flower_simulation(
        strategy=CountingServer(),
        program=Device(),
        clients=_clients(3),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=1, per_round=3),
        parties={"edge": PartySpec("edge", Edge, scope="shared")},
    )
    with pytest.raises(
        ConfigError,
        match=r"changed its state on a Flower node .*; keep that state per client "
        r"\(scope='client'\), or run on the engine \(--runtime engine\) with clients.workers=0$",
    ):
        sim.run()


def test_a_node_without_partition_id_replies_with_an_error_naming_it():
    app = client_app(
        _Counter(), lambda cid: None, seed=0, measure_flops=False, measure_memory=False, parties={}
    )
    grid = LocalGrid(app, [{"something": 3}])
    (reply,) = grid.send_and_receive([_train(0, 1, 0)])
    assert reply.has_error() and "partition-id" in reply.error.reason


def test_unknown_runtime_is_a_config_error_and_claims_no_directory(tmp_path):
    with pytest.raises(ConfigError, match="runtime 'ray'"):
        run_experiment(load_config(tiny_config(rounds=1)), out=tmp_path / "r", runtime="ray")
    assert not (tmp_path / "r").exists()


def test_missing_node_for_a_client_is_named(tmp_path):
    from fedge.experiment.build import build_run
    from fedge.runtime.flower import FlowerExecutor

    built = build_run(
        load_config(tiny_config(rounds=1, **{"clients.num": 3, "clients.per_round": 3}))
    )
    sim = built.simulation(runtime="flower-sim")
    assert isinstance(sim.executor, FlowerExecutor)
    app = _node_app(built)
    sim.executor.wait_nodes_s = 0
    with pytest.raises(ConfigError, match=r"partition-ids \[2\]"):
        sim.executor.connect(LocalGrid(app, [{"partition-id": 0}, {"partition-id": 1}]))


def _node_app(built):
    """The ClientApp a node of ``built``'s run serves (as a SuperNode builds it)."""
    return client_app(
        built.method.program,
        built.clients.__getitem__,
        seed=0,
        measure_flops=False,
        measure_memory=False,
        parties={},
        rebuilt=built.method.rebuilt,
    )


class _LastNodeHelloEdited(LocalGrid):
    """Its last node answers the handshake with the record ``edit`` changed (another build's)."""

    def __init__(self, *args, edit, **kwargs):
        super().__init__(*args, **kwargs)
        self.edit = edit

    def _deliver(self, msg, context):
        from fedge.runtime.flower.grid import _unwire, _wire

        reply = _unwire(super()._deliver(msg, context))
        rec = reply.content.config_records[RECORD]
        if context.node_id == self.node_ids[-1] and "rng_probe" in rec:
            self.edit(rec)
        return _wire(reply)


def _older(rec):
    """A fedge from before the handshake reported its probes and digests."""
    for key in ("rng_probe", "rng_probe_portable", "rebuilt", "fedge", "torch", "numpy"):
        rec.pop(key, None)


class _OfflineLastNodeGrid(LocalGrid):
    """Its last node is offline: the SuperLink answers for it with an error, from its own node id."""

    def _deliver(self, msg, context):
        from uuid import uuid4

        from flwr.app import Error
        from flwr.common.constant import SUPERLINK_NODE_ID

        from fedge.runtime.flower.grid import _wire

        if context.node_id != self.node_ids[-1]:
            return super()._deliver(msg, context)
        reply = Message(Error(code=3, reason="node offline"), reply_to=msg)
        reply.metadata.__dict__.update(_src_node_id=SUPERLINK_NODE_ID, _message_id=str(uuid4()))
        return _wire(reply)


@pytest.mark.parametrize("offline", ["a stale extra node", "the only node of client 2"])
def test_a_node_failing_the_handshake_is_skipped_unless_its_client_has_no_other(offline):
    """A SuperNode restarted during a run leaves its old registration behind (offline): the
    handshake goes on without it; a client left with no node is an error naming the node asked
    (not the SuperLink, whose node id the error reply carries)."""
    from fedge.experiment.build import build_run

    built = build_run(
        load_config(tiny_config(rounds=1, **{"clients.num": 3, "clients.per_round": 3}))
    )
    sim = built.simulation(runtime="flower-sim")
    app = _node_app(built)
    sim.executor.wait_nodes_s = 0
    if offline == "a stale extra node":
        sim.executor.connect(_OfflineLastNodeGrid(app, [{"partition-id": i} for i in (0, 1, 2, 2)]))
        assert sim.executor.nodes == {0: 1000, 1: 1001, 2: 1002}
    else:
        with pytest.raises(
            MessageError,
            match=r"partition-ids \[2\]\); 1 node\(s\) failed the handshake "
            r"\(node 1002: node offline\)$",
        ):
            sim.executor.connect(
                _OfflineLastNodeGrid(app, [{"partition-id": i} for i in (0, 1, 2)])
            )


def _other_torch(rec):
    """Another torch build: its torch-draws probe off by 0.5, its version another."""
    rec["rng_probe"], rec["torch"] = [x + 0.5 for x in rec["rng_probe"]], "9.9.9"


@pytest.mark.parametrize("method", ["baffle", "fedavg"])
def test_a_node_drawing_other_numbers_from_the_seeds_is_refused_naming_it_and_the_fix(method):
    """A node whose torch or numpy draws other numbers from the run's seeds would partition its
    clients' data differently from the server (every method), and under BAFFLE train against
    other perturbations than the server rebuilds, all without an error: refused on connecting.
    Under ``draws: torch``, whose numbers are the node's torch's (portable draws are not)."""
    from fedge.experiment.build import build_run

    overrides = {"clients.num": 3, "clients.per_round": 3, "draws": "torch"}
    if method == "baffle":
        overrides["method"] = {"name": "baffle", "mode": "batch", "k": 4, "batch_size": 32}
    built = build_run(load_config(tiny_config(rounds=1, **overrides)))
    sim = built.simulation(runtime="flower-sim")
    app = _node_app(built)
    sim.executor.wait_nodes_s = 0
    nodes = [{"partition-id": i} for i in range(3)]
    sim.executor.connect(LocalGrid(app, nodes))  # one machine: the same draws
    assert sim.executor.nodes == {0: 1000, 1: 1001, 2: 1002}
    head = r"^1 node\(s\) draw other numbers from the run's seeds than this server \(fedge .*, torch .*, numpy .*\): "
    fix = (
        r"\. Their clients would train on other data shards than the run's partition, .*; install this server's "
        r"fedge, torch and numpy versions on those SuperNodes$"
    )
    with pytest.raises(
        ConfigError, match=head + r"node 1002 \(client 2: fedge .*, torch 9\.9\.9, numpy .*\)" + fix
    ):
        sim.executor.connect(_LastNodeHelloEdited(app, nodes, edit=_other_torch))
    with pytest.raises(
        ConfigError,
        match=head + r"node 1002 \(client 2: a fedge without the handshake's probe\)" + fix,
    ):
        sim.executor.connect(_LastNodeHelloEdited(app, nodes, edit=_older))


def _other_mask(rec):
    rec["rebuilt"] = json.dumps({"train_mask": "0" * 64})


def _no_digests(rec):
    """A fedge from before the digests (its probes as this one's)."""
    del rec["rebuilt"]


def test_a_node_choosing_another_train_mask_is_refused_naming_it_and_the_fix(tmp_path):
    """``method.train_mask.rule=ntk`` follows from float32 forwards, which round differently on
    another CPU: a node whose mask differs from the server's would step other coordinates than
    the server keeps, silently. The handshake compares the builds' digests and refuses it; a
    run on nodes that build the same mask connects and trains."""
    from fedge.experiment.build import build_run

    method = {"name": "fedavg", "train_mask": {"rule": "ntk", "density": 0.3, "inputs": 4}}
    cfg = tiny_config(rounds=1, method=method, **{"clients.num": 3, "clients.per_round": 3})
    built = build_run(load_config(cfg))
    assert set(built.method.rebuilt) == {"train_mask"}
    sim = built.simulation(runtime="flower-sim")
    app = _node_app(built)
    sim.executor.wait_nodes_s = 0
    nodes = [{"partition-id": i} for i in range(3)]
    sim.executor.connect(LocalGrid(app, nodes))
    assert sim.executor.nodes == {0: 1000, 1: 1001, 2: 1002}
    head = r"^1 node\(s\) derived other values from the run's config than this server: "
    with pytest.raises(
        ConfigError,
        match=head + r"node 1002 \(client 2: another train_mask\)\. .*; "
        r"method\.train_mask\.rule=ntk scores weights by float32 forwards, .* use rule "
        r"magnitude or random",
    ):
        sim.executor.connect(_LastNodeHelloEdited(app, nodes, edit=_other_mask))
    with pytest.raises(
        ConfigError,
        match=head + r"node 1002 \(client 2: a fedge that does not report what it derived\)"
        r"\..*; install this server's fedge on those SuperNodes$",
    ):
        sim.executor.connect(_LastNodeHelloEdited(app, nodes, edit=_no_digests))
    plain = build_run(
        load_config(tiny_config(rounds=1, **{"clients.num": 3, "clients.per_round": 3}))
    )
    psim = plain.simulation(runtime="flower-sim")
    psim.executor.wait_nodes_s = 0
    # without a train mask there is nothing to compare: an older node is welcome
    psim.executor.connect(_LastNodeHelloEdited(_node_app(plain), nodes, edit=_no_digests))
    out = run_experiment(load_config(cfg), out=tmp_path / "run", render=False, runtime="flower-sim")
    assert [x["round"] for x in _lines(out)] == [1]  # its own nodes report the server's mask


def test_cli_quickstart_on_flower_sim_writes_a_complete_run_directory(tmp_path):
    from typer.testing import CliRunner

    from fedge.cli.main import app

    out = tmp_path / "qs"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "quickstart",
            "--runtime",
            "flower-sim",
            "--set",
            "rounds=3",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    lines = _lines(out)
    assert [x["round"] for x in lines] == [1, 2, 3] and all("flower_bytes_down" in x for x in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["runtime"] == "flower-sim"
        and summary["final_test_accuracy"] == lines[-1]["test_accuracy"]
    )
    assert (out / "report.md").exists() and (out / "model.safetensors").exists()
    bad = CliRunner().invoke(
        app, ["run", "quickstart", "--runtime", "ray", "--out", str(tmp_path / "bad")]
    )
    assert (
        bad.exit_code == 2
        and "runtime 'ray' is not known" in bad.output
        and not (tmp_path / "bad").exists()
    )
    bad = CliRunner().invoke(
        app, ["run", "quickstart", "--runtime", "flower", "--out", str(tmp_path / "bad")]
    )
    assert (
        bad.exit_code == 2
        and "--runtime flower needs --superlink" in bad.output
        and not (tmp_path / "bad").exists()
    )
    bad = CliRunner().invoke(
        app,
        [
            "run",
            "quickstart",
            "--runtime",
            "flower",
            "--superlink",
            "127.0.0.1:1",
            "--out",
            str(tmp_path / "bad"),
        ],
    )
    assert bad.exit_code == 2 and "--insecure" in bad.output and not (tmp_path / "bad").exists()


def _processes_in(path):
    """Live processes whose working directory is ``path`` (what loopback started runs there)."""
    import os
    from pathlib import Path

    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (
                    os.readlink(d / "cwd") == str(path)
                    and (d / "status").read_text().find("State:\tZ") < 0
                ):
                    found.append(int(d.name))
            except OSError:
                continue
    return found


def _left_in(path, seconds=30.0):
    """The processes still running in ``path`` once they have had ``seconds`` to exit. A process of
    the deployment can take a while to go after loopback stops it on a loaded machine (seen with
    two test workers beside benchmark runs on 2 cores); one still there after that was left behind."""
    import time

    deadline = time.monotonic() + seconds
    while (found := _processes_in(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


@pytest.mark.slow
def test_loopback_deployment_superlink_and_3_supernodes_same_accuracies_as_the_engine(tmp_path):
    """A real Flower deployment: SuperLink and SuperNodes as processes on 127.0.0.1, 2 rounds,
    then resumed there to 3 (a minute or more: Flower's deployment runtime polls)."""
    import socket

    from fedge.experiment.flower import loopback, submit

    cfg = load_config("quickstart", overrides=["rounds=2", "clients.num=3", "clients.per_round=3"])
    engine3 = _lines(
        run_experiment(
            load_config({**cfg.to_dict(), "rounds": 3}), out=tmp_path / "engine", render=False
        )
    )
    engine = engine3[:2]
    work = tmp_path / "flwr"
    with loopback(3, workdir=work) as superlink:
        assert len(_processes_in(work)) >= 4  # SuperLink + 3 SuperNodes
        out = submit(
            cfg,
            out=tmp_path / "deployed",
            superlink=superlink,
            insecure=True,
            workdir=tmp_path / "app",
            timeout=400,
        )
        first = _lines(out)
        with pytest.raises(
            MessageError, match="did not write"
        ):  # the run directory exists: the ServerApp fails
            submit(cfg, out=out, superlink=superlink, insecure=True, timeout=400)
        # resumed on the same federation, to 3 rounds (fedge run --resume OUT --set rounds=3 --runtime flower ...)
        submit(cfg, out=out, superlink=superlink, insecure=True, timeout=400, resume=True, rounds=3)
    port = int(superlink.rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    assert _left_in(work) == []
    deployed = first
    assert [x["test_accuracy"] for x in deployed] == pytest.approx(
        [x["test_accuracy"] for x in engine], rel=1e-9
    )
    _assert_same(engine, deployed)
    resumed = _lines(out)
    assert [x["round"] for x in resumed] == [1, 2, 3]
    _assert_same(engine3, resumed)
    assert json.loads((out / "summary.json").read_text())["runtime"] == "flower"


# ---- resume: the checkpoint holds the node-held client states ---------------------------------


def _without_wall(path):
    return [{k: v for k, v in x.items() if "wall" not in k} for x in _lines(path)]


def test_interrupted_flower_run_resumes_to_the_same_metrics_with_node_held_client_state(
    tmp_path, monkeypatch
):
    """BAFFLE with ``downlink: seeds`` keeps each client's model replica in ``ctx.state`` (on its
    node); a resumed run without those states fails ("out of step"), and one with wrong states
    changes the losses."""
    import fedge.experiment.rundir as rd
    from fedge.experiment.resume import resume_experiment

    method = {
        "name": "baffle",
        "mode": "batch",
        "k": 4,
        "batch_size": 16,
        "ema": None,
        "downlink": "seeds",
    }
    cfg = tiny_config(
        rounds=5,
        model={"name": "mlp", "hidden": [16]},
        method=method,
        **{"clients.num": 5, "clients.per_round": 2},
    )
    engine = run_experiment(load_config(cfg), out=tmp_path / "engine", render=False)
    full = run_experiment(
        load_config(cfg), out=tmp_path / "full", render=False, runtime="flower-sim"
    )
    original = rd.RunDir.save_checkpoint
    saved = []

    def crash_after_round_3(self, state):
        original(self, state)
        saved.append(state)
        if state["record"]["round"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(rd.RunDir, "save_checkpoint", crash_after_round_3)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(load_config(cfg), out=tmp_path / "cut", render=False, runtime="flower-sim")
    monkeypatch.setattr(rd.RunDir, "save_checkpoint", original)
    assert not (tmp_path / "cut" / "summary.json").exists()
    assert len(saved[-1]["client_states"]) >= 3  # the nodes' states, fetched into the checkpoint
    resume_experiment(tmp_path / "cut", render=False, runtime="flower-sim")
    for a, b in zip(_without_wall(tmp_path / "cut"), _without_wall(full), strict=True):
        assert a.keys() == b.keys()
        # Flower's own message sizes vary by a few bytes (varint-coded metadata); fedge's are exact
        assert {
            k: v for k, v in a.items() if b[k] != v and not k.startswith("flower_bytes")
        } == {}, a["round"]
        assert all(
            abs(a[k] - b[k]) <= 16 * a["clients"] * a["phases"]
            for k in a
            if k.startswith("flower_bytes")
        )
    _assert_same(_lines(engine), _lines(tmp_path / "cut"))
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["runtime"] == "flower-sim" and summary["flower_backend"] == "local"


def test_resume_with_an_unknown_backend_is_refused_before_writing(tmp_path):
    from fedge.experiment.resume import resume_experiment

    run = run_experiment(load_config(tiny_config(rounds=1)), out=tmp_path / "r", render=False)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match="backend 'dask' is not known"):
        resume_experiment(run, rounds=2, render=False, runtime="flower-sim", backend="dask")
    with pytest.raises(ConfigError, match="goes with runtime 'flower-sim'"):
        resume_experiment(run, rounds=2, render=False, backend="ray")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


# ---- faults: a node that fails or does not reply ----------------------------------------------


def _replies_late(monkeypatch, late):
    """LocalGrid's ``send_and_receive`` gives up on the replies to the messages ``late(msg)``
    picks (as on a timeout): they come later, to a pull of their message ids, as a node that
    outlives the timeout delivers them on Flower."""

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        ids = list(self.push_messages(messages))
        return self.pull_messages(
            [mid for m, mid in zip(messages, ids, strict=True) if not late(m)]
        )

    monkeypatch.setattr(LocalGrid, "send_and_receive", send_and_receive)


def _fail_node_1_in_round_2(monkeypatch, fault, exchange=0):
    """Client 1's node (1001) fails its message of round 2's ``exchange``: its ClientApp raises,
    or its reply comes after the exchange stopped waiting ("no reply": the node ran the step),
    or the SuperLink answers for it as offline ("offline")."""
    group = f"2.{exchange}"
    from flwr.app import Error
    from flwr.common.serde import message_to_proto

    push, deliver = LocalGrid.push_messages, LocalGrid._deliver

    def failing_deliver(self, msg, context):
        if context.node_id == 1001 and msg.metadata.group_id == group:
            app = self.app

            def boom(m, c):
                raise RuntimeError("the node went away")  # the ClientApp raises: an error reply

            self.app = boom
            try:
                return deliver(self, msg, context)
            finally:
                self.app = app
        return deliver(self, msg, context)

    def offline_push(self, messages):
        messages = list(messages)
        ids = list(push(self, messages))
        for m, mid in zip(messages, ids, strict=True):
            if m.metadata.dst_node_id == 1001 and m.metadata.group_id == group:
                # Flower's SuperLink answers for a node it found offline, as itself
                err = Message(Error(code=5, reason="Error: Node Unavailable"), reply_to=m)
                err.metadata.__dict__["_src_node_id"] = 1
                err.metadata.__dict__["_message_id"] = "e" + mid
                self._pending[mid] = message_to_proto(err).SerializeToString()
        return ids

    monkeypatch.setattr(LocalGrid, "_deliver", failing_deliver if fault == "raises" else deliver)
    if fault == "offline":
        monkeypatch.setattr(LocalGrid, "push_messages", offline_push)
    if fault == "no reply":
        _replies_late(
            monkeypatch, lambda m: m.metadata.dst_node_id == 1001 and m.metadata.group_id == group
        )


@pytest.mark.parametrize("fault", ["raises", "no reply", "offline"])
def test_a_failed_node_fails_the_round_naming_it_and_the_run_resumes_to_the_same_metrics(
    tmp_path, monkeypatch, fault
):
    """Client 1's node fails in round 2 (its ClientApp raises, its reply comes after the 30 s, or
    the SuperLink answers for it as offline, as for a killed SuperNode): the run stops with one message naming round, client, node and the way on; the
    directory keeps round 1 and no summary; resuming gives an uninterrupted run's metrics."""
    from fedge.experiment.resume import resume_experiment

    cfg = tiny_config(
        rounds=3,
        **{
            "dataset": {"name": "digits"},
            "clients.num": 3,
            "clients.per_round": 3,
            "clients.reply_timeout": 30,
        },
    )
    full = run_experiment(
        load_config(cfg), out=tmp_path / "full", render=False, runtime="flower-sim"
    )
    _fail_node_1_in_round_2(monkeypatch, fault)
    with pytest.raises(MessageError) as info:
        run_experiment(load_config(cfg), out=tmp_path / "cut", render=False, runtime="flower-sim")
    text = str(info.value)
    assert text.startswith(
        "round 2, exchange 1: 1 of 3 clients gave no result (client 1: node 1001: "
    )
    assert "set clients.min_replies" in text
    why = {
        "raises": "RuntimeError: the node went away",
        "no reply": "no reply within 30 s",
        "offline": "Node Unavailable",
    }
    assert why[fault] in text
    assert "--resume" in text and "Rounds up to 1 are kept" in text
    assert [x["round"] for x in _lines(tmp_path / "cut")] == [1]
    assert not (tmp_path / "cut" / "summary.json").exists()
    monkeypatch.undo()  # the node is back
    resume_experiment(tmp_path / "cut", render=False, runtime="flower-sim")
    a, b = _lines(tmp_path / "cut"), _lines(full)
    assert [x["test_accuracy"] for x in a] == [x["test_accuracy"] for x in b]
    assert [(x["bytes_down"], x["bytes_up"]) for x in a] == [
        (x["bytes_down"], x["bytes_up"]) for x in b
    ]


@pytest.mark.parametrize("fault", ["raises", "no reply"])
def test_with_min_replies_a_round_goes_on_without_the_failed_node(tmp_path, monkeypatch, fault):
    """With clients.min_replies, the round client 1's node fails completes on the other two: its
    figures are those of an engine run whose round 2 samples just clients 0 and 2 (the oracle),
    client 1's downlink is still counted, and it is back in round 3."""
    from fedge.runtime.engine import Simulation

    cfg = tiny_config(
        rounds=3,
        **{
            "dataset": {"name": "digits"},
            "clients.num": 3,
            "clients.per_round": 3,
            "clients.min_replies": 2,
        },
    )
    sample = Simulation.sample
    monkeypatch.setattr(
        Simulation, "sample", lambda self, rnd: [c for c in sample(self, rnd) if (rnd, c) != (2, 1)]
    )
    oracle = _lines(run_experiment(load_config(cfg), out=tmp_path / "oracle", render=False))
    monkeypatch.setattr(Simulation, "sample", sample)
    _fail_node_1_in_round_2(monkeypatch, fault)
    lines = _lines(
        run_experiment(load_config(cfg), out=tmp_path / "lossy", render=False, runtime="flower-sim")
    )
    assert [x["clients_failed"] for x in lines] == [0, 1, 0] and [x["clients"] for x in lines] == [
        3,
        3,
        3,
    ]
    assert [x["test_accuracy"] for x in lines] == [x["test_accuracy"] for x in oracle]
    assert [x["test_loss"] for x in lines] == [x["test_loss"] for x in oracle]
    assert [x["bytes_up"] for x in lines] == [x["bytes_up"] for x in oracle]
    assert (
        lines[1]["bytes_down"] == lines[0]["bytes_down"] == oracle[1]["bytes_down"] * 3 // 2
    )  # sent, then lost


def _persistent_adam_config(**extra):
    """FedAvg whose clients keep their Adam moments on their nodes between rounds, 3 clients a round."""
    return tiny_config(
        rounds=3,
        **{
            "dataset": {"name": "digits"},
            "clients.num": 3,
            "clients.per_round": 3,
            "method.client_optimizer": {"name": "adam", "lr": 0.01, "state": "persistent"},
            **extra,
        },
    )


def test_a_node_whose_reply_was_lost_has_its_state_fetched_so_a_resume_continues_as_the_run(
    tmp_path, monkeypatch
):
    """Client 1's node trains in round 2 (its Adam moments move on the node) but its reply is
    lost; the round goes on without it (clients.min_replies). The checkpoint after round 2 fetches
    that node's state too, so a run cut there and resumed gives the uninterrupted run's metrics
    (a checkpoint keeping its round-1 moments would hand the node those on resume)."""
    from fedge.experiment.resume import resume_experiment
    from tests.tests_helpers import run_cut_after

    cfg = _persistent_adam_config(**{"clients.min_replies": 2})
    _fail_node_1_in_round_2(monkeypatch, "no reply")
    full = run_experiment(
        load_config(cfg), out=tmp_path / "full", render=False, runtime="flower-sim"
    )
    assert [x["clients_failed"] for x in _lines(full)] == [0, 1, 0]
    run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch, runtime="flower-sim")
    resume_experiment(tmp_path / "cut", render=False, runtime="flower-sim")
    assert [
        (x["test_accuracy"], x["test_loss"], x["train_loss"]) for x in _lines(tmp_path / "cut")
    ] == [(x["test_accuracy"], x["test_loss"], x["train_loss"]) for x in _lines(full)]


def _node_1_misses_state_fetches(monkeypatch, *, answered=0):
    """Client 1's node (1001) answers its first ``answered`` state fetches in time, the later ones
    only after the checkpoint stopped waiting (it is away at the checkpoints after those)."""
    from fedge.runtime.flower.adapter import STATE_GET

    seen = []

    def late(m):
        if m.metadata.dst_node_id == 1001 and m.metadata.group_id == STATE_GET:
            seen.append(m)
            return len(seen) > answered
        return False

    _replies_late(monkeypatch, late)


def test_a_node_that_misses_the_state_fetch_is_warned_about_under_min_replies_and_stops_the_run_otherwise(
    tmp_path, monkeypatch
):
    """With clients.min_replies the run goes on (its metrics untouched: the fetch only feeds the
    checkpoint), warning at each checkpoint that client 1's state there is as last fetched, and
    the checkpoints hold that state (the one fetched after round 1; a checkpoint without it would
    give client 1 fresh Adam moments on resume); without it, the checkpoint stops the run naming
    the node."""
    import fedge.experiment.rundir as rd

    plain = _lines(
        run_experiment(
            load_config(_persistent_adam_config()),
            out=tmp_path / "plain",
            render=False,
            runtime="flower-sim",
        )
    )
    _node_1_misses_state_fetches(monkeypatch, answered=1)
    original, saved = rd.RunDir.save_checkpoint, []

    def save_checkpoint(self, state):
        saved.append({cid: bytes(b) for cid, b in state["client_states"].items()})
        original(self, state)

    monkeypatch.setattr(rd.RunDir, "save_checkpoint", save_checkpoint)
    with pytest.warns(
        RuntimeWarning,
        match=r"checkpoint after round 2: the node\(s\) of client\(s\) \[1\] did not answer",
    ) as caught:
        lossy = run_experiment(
            load_config(_persistent_adam_config(**{"clients.min_replies": 2})),
            out=tmp_path / "lossy",
            render=False,
            runtime="flower-sim",
        )
    assert any(
        "more RuntimeWarnings like the one above (rounds 2–3)" in str(w.message) for w in caught
    )  # one a round
    assert [x["test_accuracy"] for x in _lines(lossy)] == [x["test_accuracy"] for x in plain]
    assert [sorted(s) for s in saved] == [[0, 1, 2]] * 3
    assert saved[1][1] == saved[2][1] == saved[0][1]  # client 1: as fetched after round 1
    assert saved[1][0] != saved[0][0]  # the others: as their nodes hold them now
    monkeypatch.setattr(rd.RunDir, "save_checkpoint", original)
    with pytest.raises(
        MessageError,
        match=r"fedge_state_get: 1 of 3 nodes failed \(client 1 \(node 1001\): no reply\)",
    ):
        run_experiment(
            load_config(_persistent_adam_config()),
            out=tmp_path / "strict",
            render=False,
            runtime="flower-sim",
        )


def test_cli_resume_on_flower_sim_and_its_bad_combinations(tmp_path):
    from typer.testing import CliRunner

    from fedge.cli.main import app

    out = tmp_path / "qs"
    args = ["--set", "clients.num=3", "--set", "clients.per_round=3", "-q"]
    res = CliRunner().invoke(
        app,
        [
            "run",
            "quickstart",
            "--runtime",
            "flower-sim",
            "--set",
            "rounds=1",
            "--out",
            str(out),
            *args,
        ],
    )
    assert res.exit_code == 0, res.output
    bad = CliRunner().invoke(
        app, ["run", "--resume", str(out), "--set", "rounds=2", "--runtime", "flower", "-q"]
    )
    assert bad.exit_code == 2 and "--runtime flower needs --superlink" in bad.output
    bad = CliRunner().invoke(
        app, ["run", "--resume", str(out), "--set", "rounds=2", "--backend", "ray", "-q"]
    )
    assert bad.exit_code == 2 and "--backend ray goes with --runtime flower-sim" in bad.output
    res = CliRunner().invoke(
        app, ["run", "--resume", str(out), "--set", "rounds=2", "--runtime", "flower-sim", "-q"]
    )
    assert res.exit_code == 0, res.output
    lines = _lines(out)
    assert [x["round"] for x in lines] == [1, 2] and all("flower_bytes_down" in x for x in lines)


def _certificates(d):
    """A CA and a server certificate for 127.0.0.1 signed by it (what a user supplies)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = {
        "not_valid_before": now - datetime.timedelta(minutes=5),
        "not_valid_after": now + datetime.timedelta(days=1),
    }

    def cert(subject, issuer, public_key, signer, ext):
        b = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
        )
        b = b.serial_number(x509.random_serial_number()).not_valid_before(valid["not_valid_before"])
        b = b.not_valid_after(valid["not_valid_after"]).add_extension(*ext)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedge test CA")])
    ca = cert(
        ca_name,
        ca_name,
        ca_key.public_key(),
        ca_key,
        (x509.BasicConstraints(ca=True, path_length=None), True),
    )
    san = x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    )
    server = cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
        ca_name,
        key.public_key(),
        ca_key,
        (san, False),
    )
    d.mkdir(parents=True)
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (d / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return d / "ca.crt", d / "server.pem", d / "server.key"


@pytest.mark.slow
def test_loopback_deployment_over_tls_with_user_certificates(tmp_path):
    """SuperLink serving TLS with a user's certificates, 2 SuperNodes trusting its CA, and the run
    submitted with --root-certificates: 1 round, the engine's accuracy (~100 s here: Flower polls)."""
    import tomllib
    from pathlib import Path

    from fedge.experiment.flower import loopback, submit

    ca, cert, key = _certificates(tmp_path / "certs")
    cfg = load_config("quickstart", overrides=["rounds=1", "clients.num=2", "clients.per_round=2"])
    engine = _lines(run_experiment(cfg, out=tmp_path / "engine", render=False))
    work = tmp_path / "flwr"
    with loopback(2, workdir=work, tls=(ca, cert, key)) as superlink:
        out = submit(
            cfg,
            out=tmp_path / "deployed",
            superlink=superlink,
            root_certificates=ca,
            workdir=tmp_path / "app",
            timeout=400,
        )
        started = [
            Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in _processes_in(work)
        ]
        ours = [
            c
            for c in started
            if any(a.endswith((b"flower-superlink", b"flower-supernode")) for a in c[:2])
        ]
        assert len(ours) == 3 and all(
            b"--insecure" not in c for c in ours
        )  # SuperLink and SuperNodes: TLS
    assert _left_in(work) == []
    conn = tomllib.loads((tmp_path / "app" / "flwr-home" / "config.toml").read_text())["superlink"][
        "fedge"
    ]
    assert conn["insecure"] is False and conn["root-certificates"] == str(ca.resolve())
    deployed = _lines(out)
    assert [x["test_accuracy"] for x in deployed] == pytest.approx(
        [x["test_accuracy"] for x in engine], rel=1e-9
    )
    assert [x["bytes_up"] for x in deployed] == [x["bytes_up"] for x in engine]


def test_a_seeds_downlink_client_whose_reply_was_lost_skips_the_rounds_it_replayed(
    tmp_path, monkeypatch
):
    """BAFFLE with `downlink: seeds` (and secure aggregation, its default): client 1's node syncs
    to round 2's model when it computes its masked input, but that reply is lost; its input is
    not in the sum, so the server still records it at round 1, round 3 replays rounds 1 and 2 to
    it and it skips the one it holds. Its round-3 loss differences are then taken on the
    server's model: the run equals an engine run whose round 2 samples only clients 0 and 2
    (the oracle; the same secure sums, exact in the ring)."""
    from fedge.runtime.engine import Simulation

    method = {
        "name": "baffle",
        "mode": "batch",
        "k": 4,
        "batch_size": 32,
        "clip": None,
        "ema": None,
        "downlink": "seeds",
    }
    cfg = tiny_config(
        rounds=3,
        method=method,
        **{
            "dataset": {"name": "digits"},
            "clients.num": 3,
            "clients.per_round": 3,
            "clients.min_replies": 2,
        },
    )
    sample = Simulation.sample
    monkeypatch.setattr(
        Simulation, "sample", lambda self, rnd: [c for c in sample(self, rnd) if (rnd, c) != (2, 1)]
    )
    oracle = _lines(run_experiment(load_config(cfg), out=tmp_path / "oracle", render=False))
    monkeypatch.setattr(Simulation, "sample", sample)
    _fail_node_1_in_round_2(
        monkeypatch, "no reply", exchange=2
    )  # secure aggregation's step 3: the masked input
    lines = _lines(
        run_experiment(load_config(cfg), out=tmp_path / "lossy", render=False, runtime="flower-sim")
    )
    assert [x["clients_failed"] for x in lines] == [0, 1, 0] and lines[1]["secagg_survivors"] == 2
    assert [(x["test_accuracy"], x["test_loss"]) for x in lines] == [
        (x["test_accuracy"], x["test_loss"]) for x in oracle
    ]


def _other_kernels(torch_off=0.0, portable_off=0.0):
    """Other CPU kernels: torch's probe off by roundoff ``torch_off``, the portable probe off
    by ``portable_off`` (0: the same bits)."""

    def edit(rec):
        rec["rng_probe"] = [x * (1 + torch_off) for x in rec["rng_probe"]]
        rec["rng_probe_portable"] = [x * (1 + portable_off) for x in rec["rng_probe_portable"]]

    return edit


def test_a_portable_run_checks_the_portable_probe_exactly_and_ignores_torchs():
    """Under ``draws: portable``, the default, a node whose torch kernels round differently
    (torch's probe off by far more than roundoff) is accepted: the run draws nothing from them;
    one whose portable probe differs in the last bit is refused."""
    from fedge.experiment.build import build_run

    overrides: dict = {"clients.num": 3, "clients.per_round": 3}  # draws left to the default
    overrides["method"] = {"name": "baffle", "mode": "batch", "k": 4, "batch_size": 32}
    built = build_run(load_config(tiny_config(rounds=1, **overrides)))
    sim = built.simulation(runtime="flower-sim")
    assert built.config.draws == "portable" and sim.executor.draws == "portable"
    app = _node_app(built)
    sim.executor.wait_nodes_s = 0
    nodes = [{"partition-id": i} for i in range(3)]
    sim.executor.connect(_LastNodeHelloEdited(app, nodes, edit=_other_kernels(torch_off=0.01)))
    assert sim.executor.nodes == {0: 1000, 1: 1001, 2: 1002}
    with pytest.raises(ConfigError, match=r"^1 node\(s\) draw other numbers .*node 1002"):
        sim.executor.connect(
            _LastNodeHelloEdited(app, nodes, edit=_other_kernels(portable_off=1e-9))
        )
    torch_run = build_run(load_config(tiny_config(rounds=1, **{**overrides, "draws": "torch"})))
    tsim = torch_run.simulation(runtime="flower-sim")
    tsim.executor.wait_nodes_s = 0
    with pytest.raises(ConfigError, match=r"^1 node\(s\) draw other numbers .*node 1002"):
        tsim.executor.connect(_LastNodeHelloEdited(app, nodes, edit=_other_kernels(torch_off=0.01)))
