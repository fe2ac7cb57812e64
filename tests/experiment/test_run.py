"""Run directories: what is written, resume after interruption, nothing written on bad input."""

import json

import pytest
import yaml
from safetensors.torch import load_file

from fedge.core.config import load_config
from fedge.core.errors import ConfigError, DataNotFoundError, ResumeError, UnknownNameError
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from tests_helpers import metrics_without_wall, run_cut_after


def test_run_writes_a_complete_directory(tmp_path, tiny):
    out = run_experiment(load_config(tiny(rounds=2)), out=tmp_path / "run", render=False)
    names = {p.name for p in out.iterdir()}
    assert {
        "config.yaml",
        "partition.json",
        "metrics.jsonl",
        "summary.json",
        "model.safetensors",
        "checkpoint.pt",
    } <= names
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == [1, 2]
    for key in ("test_accuracy", "test_loss", "bytes_down", "bytes_up", "client_flops", "wall_s"):
        assert key in lines[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["rounds"] == 2
    assert summary["total_bytes_up"] == sum(x["bytes_up"] for x in lines)
    assert summary["final_test_accuracy"] == lines[-1]["test_accuracy"]
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["method"]["server_optimizer"]["name"] == "sgd"  # defaults resolved
    part = json.loads((out / "partition.json").read_text())
    assert sum(c["num_samples"] for c in part["clients"]) == 600
    assert set(load_file(out / "model.safetensors"))


def test_same_seed_same_metrics(tmp_path, tiny):
    a = run_experiment(load_config(tiny()), out=tmp_path / "a", render=False)
    b = run_experiment(load_config(tiny()), out=tmp_path / "b", render=False)
    assert metrics_without_wall(a) == metrics_without_wall(b)
    c = run_experiment(load_config(tiny(seed=1)), out=tmp_path / "c", render=False)
    assert metrics_without_wall(a) != metrics_without_wall(c)


def test_interrupted_run_resumes_to_identical_metrics(tmp_path, tiny, monkeypatch):
    cfg = tiny(rounds=6, **{"clients.num": 6, "clients.per_round": 3})
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    run_cut_after(cfg, tmp_path / "cut", 3, monkeypatch)
    assert not (tmp_path / "cut" / "summary.json").exists()
    # a torn line from a kill mid-write must not matter
    with open(tmp_path / "cut" / "metrics.jsonl", "a") as f:
        f.write('{"round": 4, "test_acc')
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)
    with pytest.raises(ResumeError, match="already complete"):
        resume_experiment(tmp_path / "cut", render=False)


def test_finished_run_extended_to_more_rounds_equals_a_longer_run(tmp_path, tiny):
    cfg = tiny(
        rounds=5,
        **{"clients.num": 6, "clients.per_round": 3, "method.client_optimizer.momentum": 0.5},
    )
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    short = run_experiment(load_config({**cfg, "rounds": 3}), out=tmp_path / "short", render=False)
    resume_experiment(short, rounds=5, render=False)
    assert metrics_without_wall(short) == metrics_without_wall(full)
    assert yaml.safe_load((short / "config.yaml").read_text())["rounds"] == 5
    summary = json.loads((short / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["rounds"] == 5
    assert (
        load_file(short / "model.safetensors").keys()
        == load_file(full / "model.safetensors").keys()
    )
    for k, v in load_file(short / "model.safetensors").items():
        assert v.equal(load_file(full / "model.safetensors")[k])


@pytest.mark.parametrize(
    "rounds, error, message",
    [
        (3, ResumeError, "larger total"),
        (2, ResumeError, "larger total"),
        (0, ResumeError, "larger total"),
        ("7", ConfigError, r"rounds='7' \(str\): expected a whole number"),
    ],
)
def test_extension_must_add_rounds_and_changes_nothing_otherwise(
    tmp_path, tiny, rounds, error, message
):
    out = run_experiment(load_config(tiny(rounds=3)), out=tmp_path / "run", render=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(error, match=message):
        resume_experiment(out, rounds=rounds, render=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_resuming_a_run_another_process_drives_is_refused_and_changes_nothing(tmp_path, tiny):
    from fedge.experiment.rundir import RunDir, RunDirBusyError

    out = run_experiment(load_config(tiny(rounds=2)), out=tmp_path / "run", render=False)
    (out / "summary.json").unlink()  # interrupted: resumable
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    driver = RunDir(out)
    driver.hold()  # as a process driving its rounds holds it
    try:
        with pytest.raises(RunDirBusyError, match="being run by another fedge process"):
            resume_experiment(out, render=False)
    finally:
        driver.let_go()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    resume_experiment(out, render=False)  # once let go, it resumes
    assert not RunDir(out).busy()  # and the finished run holds nothing


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, tiny):
    out = run_experiment(load_config(tiny(rounds=1)), out=tmp_path / "r", render=False)
    (out / "summary.json").unlink()
    (out / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ResumeError, match="corrupt"):
        resume_experiment(out, render=False)


@pytest.mark.parametrize(
    "override,error",
    [
        ({"model.name": "no-such-model"}, UnknownNameError),
        ({"dataset.name": "no-such-data"}, UnknownNameError),
        ({"method.name": "no-such-method"}, UnknownNameError),
        ({"method.local_epochs": 0}, ConfigError),
        ({"method.bogus": 1}, ConfigError),
        ({"partition.name": "dirichlet", "partition.alpha": -1}, ConfigError),
        (
            {"model.activation": "no-such-activation"},
            ConfigError,
        ),  # tanh and sigmoid exist now (lenet-dlg)
        ({"dataset.name": "mnist", "dataset.root": "/nonexistent"}, DataNotFoundError),
        ({"clients.dropout": 0.2}, ConfigError),  # loses replies while every reply is needed
        ({"clients.min_replies": 5}, ConfigError),  # more than the 4 clients of a round
        # masks of one client cannot cancel: refused at build, not at round 1's sampling
        ({"clients.per_round": 1, "method.secure_aggregation": True}, ConfigError),
    ],
)
def test_bad_input_writes_nothing(tmp_path, tiny, override, error):
    with pytest.raises(error):
        run_experiment(load_config(tiny(**override)), out=tmp_path / "run", render=False)
    assert not (tmp_path / "run").exists()


def test_existing_output_directory_is_refused(tmp_path, tiny):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    with pytest.raises(
        ConfigError, match="already holds files and is not a fedge run; choose another --out"
    ):
        run_experiment(load_config(tiny()), out=tmp_path / "run", render=False)
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine"


def test_worker_pool_gives_the_same_run(tmp_path, tiny):
    seq = run_experiment(load_config(tiny(rounds=2)), out=tmp_path / "seq", render=False)
    pool = run_experiment(
        load_config(tiny(rounds=2, **{"clients.workers": 2})), out=tmp_path / "pool", render=False
    )
    assert metrics_without_wall(seq) == metrics_without_wall(pool)


def test_fedsgd_and_server_adam_train(tmp_path, tiny):
    cfg = tiny(
        rounds=5,
        method={
            "name": "fedsgd",
            "batch_size": 32,
            "server_optimizer": {"name": "adam", "lr": 0.01},
        },
    )
    out = run_experiment(load_config(cfg), out=tmp_path / "r", render=False)
    lines = metrics_without_wall(out)
    assert lines[-1]["test_loss"] < lines[0]["test_loss"]


def test_progress_reports_start_clients_inside_rounds_and_rounds(tmp_path, tiny):
    from fedge.experiment.progress import Progress

    class Record(Progress):
        def __init__(self):
            self.calls = []

        def start(self, total_rounds, done):
            self.calls.append(("start", total_rounds, done))

        def clients(self, rnd, exchange, done, total):
            self.calls.append(("clients", rnd, done, total))

        def round(self, line, total_rounds):
            self.calls.append(("round", line["round"], total_rounds))

    rec = Record()
    run_experiment(
        load_config(tiny(rounds=2, **{"clients.num": 3, "clients.per_round": 3})),
        out=tmp_path / "r",
        progress=rec,
        render=False,
    )
    expected = [("start", 2, 0)]
    for rnd in (1, 2):
        expected += [("clients", rnd, i, 3) for i in (1, 2, 3)] + [("round", rnd, 2)]
    assert rec.calls == expected


def test_a_plain_function_is_still_a_progress_callback(tmp_path, tiny):
    seen = []
    run_experiment(
        load_config(tiny(rounds=2)),
        out=tmp_path / "r",
        progress=lambda line, n: seen.append((line["round"], n)),
        render=False,
    )
    assert seen == [(1, 2), (2, 2)]


def test_a_progress_that_is_neither_is_refused_before_anything_is_written(tmp_path, tiny):
    out = tmp_path / "r"
    with pytest.raises(ConfigError, match=r"progress=False \(bool\).*None to show nothing"):
        run_experiment(load_config(tiny(rounds=1)), out=out, progress=False, render=False)
    assert not out.exists()
    done = run_experiment(load_config(tiny(rounds=1)), out=out, render=False)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in done.iterdir())
    with pytest.raises(ConfigError, match="progress='bar'"):
        resume_experiment(done, rounds=2, progress="bar")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in done.iterdir()) == before


def test_repeated_warnings_are_shown_once_with_a_count(tmp_path, tiny, monkeypatch):
    import warnings

    import fedge.experiment.rundir as rd

    original = rd.RunDir.append_metrics

    def noisy(self, line):
        for i in range(3):  # different text each time, as PrecisionWarning's numbers are
            warnings.warn(f"noise {line['round']}.{i}", UserWarning, stacklevel=1)
        original(self, line)

    monkeypatch.setattr(rd.RunDir, "append_metrics", noisy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_experiment(load_config(tiny(rounds=3)), out=tmp_path / "r", render=False)
    texts = [str(w.message) for w in caught if w.category is UserWarning]
    assert texts == ["noise 1.0", "8 more UserWarnings like the one above (rounds 1–3); shown once"]


def test_on_divergence_continue_logs_and_finishes(tmp_path, tiny):
    import warnings

    from fedge.core.errors import DivergenceError
    from fedge.experiment.divergence import DivergenceWarning

    method = {
        "name": "baffle",
        "mode": "batch",
        "k": 10,
        "batch_size": 64,
        "clip": None,
        "ema": None,
        "server_optimizer": {"name": "sgd", "lr": 1e5},
    }
    with pytest.raises(DivergenceError, match=r"^training diverged in round 1: test_loss="):
        run_experiment(
            load_config(tiny(rounds=2, method=method)), out=tmp_path / "stop", render=False
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run_experiment(
            load_config(tiny(rounds=1, method=method, on_divergence="continue")),
            out=tmp_path / "go",
            render=False,
        )
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"
    assert any(w.category is DivergenceWarning for w in caught)
    assert all(line["diverged"] for line in metrics_without_wall(out))


def test_a_claimed_directory_refuses_a_second_run(tmp_path, tiny):
    from fedge.experiment.rundir import RunDir, RunDirBusyError

    first = RunDir(tmp_path / "r")
    first.claim()
    with pytest.raises(RunDirBusyError, match="being set up by another fedge run"):
        run_experiment(load_config(tiny()), out=tmp_path / "r", render=False)
    first.release()
    assert not (tmp_path / "r").exists()


def test_build_failure_after_claim_leaves_no_directory(tmp_path, tiny):
    with pytest.raises(UnknownNameError):
        run_experiment(
            load_config(tiny(**{"model.name": "nope"})), out=tmp_path / "r", render=False
        )
    assert not (tmp_path / "r").exists()


def test_persistent_client_optimizer_state_resumes_to_identical_metrics(
    tmp_path, tiny, monkeypatch
):
    """Clients keep their Adam moments across the rounds they take part in (3 of 6 a round);
    the state is checkpointed, so a run cut after round 2 resumes to the uninterrupted metrics,
    and it is a different run from the fresh-optimizer one."""
    opt = {"method.client_optimizer": {"name": "adam", "lr": 0.01, "state": "persistent"}}
    cfg = tiny(rounds=4, **{"clients.num": 6, "clients.per_round": 3}, **opt)
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)
    fresh = tiny(
        rounds=4,
        **{"clients.num": 6, "clients.per_round": 3},
        **{"method.client_optimizer": {"name": "adam", "lr": 0.01}},
    )
    assert metrics_without_wall(
        run_experiment(load_config(fresh), out=tmp_path / "fresh", render=False)
    ) != metrics_without_wall(full)


@pytest.mark.parametrize("method", ["baffle", "ntk-baffle"])
def test_zeroth_order_persistent_client_adam_resumes_to_identical_metrics(
    tmp_path, tiny, monkeypatch, method
):
    """Epoch-level BAFFLE and NTK-BAFFLE keep one Adam per client for the run
    (``client_optimizer.state=persistent``, BAFFLE's reference code): the state is checkpointed
    with the clients' state, so a run cut after round 2 resumes to the uninterrupted metrics, and
    it is a different run from the fresh-Adam one."""
    section = {
        "name": method,
        "mode": "epoch",
        "k": 4,
        "batch_size": 16,
        "max_steps": 2,
        "ema": None,
        "client_optimizer": {"name": "adam", "lr": 0.01, "state": "persistent"},
    }
    if method == "ntk-baffle":
        section.update(prune_rounds=2, prune_inputs=8, density=0.5)
    cfg = tiny(rounds=4, method=section, **{"clients.num": 4, "clients.per_round": 2})
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)
    fresh = {**section, "client_optimizer": {"name": "adam", "lr": 0.01}}
    assert metrics_without_wall(
        run_experiment(
            load_config(tiny(rounds=4, method=fresh, **{"clients.num": 4, "clients.per_round": 2})),
            out=tmp_path / "fresh",
            render=False,
        )
    ) != metrics_without_wall(full)


def test_min_replies_with_a_strategy_that_needs_every_reply_is_refused_naming_it(
    tmp_path, tiny, monkeypatch
):
    """Every built-in strategy takes partial replies; one that does not (a user's, here FedAvg's
    made to say no) cannot run under clients.min_replies: a config error names it, nothing is written."""
    from fedge.methods.fedavg import DeltaAveraging

    monkeypatch.setattr(DeltaAveraging, "partial_replies", property(lambda self: False))
    with pytest.raises(
        ConfigError,
        match=r"clients.min_replies=2: method 'fedavg'.*\(DeltaAveraging cannot aggregate a subset\)",
    ):
        run_experiment(
            load_config(tiny(**{"clients.min_replies": 2})), out=tmp_path / "run", render=False
        )
    assert not (tmp_path / "run").exists()


def test_secure_aggregation_over_one_client_a_round_is_refused_at_build(tiny):
    from fedge.experiment.build import build_run

    with pytest.raises(
        ConfigError,
        match=r"method.secure_aggregation=true needs at least 2 clients per round, got "
        r"clients.per_round=1 .*set clients.per_round",
    ):
        build_run(load_config(tiny(**{"clients.per_round": 1, "method.secure_aggregation": True})))


@pytest.mark.parametrize("existing", [False, True])
def test_a_config_error_before_round_1_completes_leaves_the_directory_for_a_corrected_run(
    tmp_path, tiny, monkeypatch, existing
):
    """A config the rounds find cannot run (e.g. PPFL enclaves too small for stage 0, found at
    round 1's sampling) leaves no run claiming the directory: the corrected run takes it."""
    from fedge.runtime.engine import Simulation

    out = tmp_path / "run"
    if existing:
        out.mkdir()  # an empty directory the user made stays, empty
    real = Simulation.run_round

    def refuse(self, rnd):  # noqa: ANN001, ANN202
        raise ConfigError("round 1 finds the config cannot run; fix it")

    monkeypatch.setattr(Simulation, "run_round", refuse)
    with pytest.raises(ConfigError, match="cannot run"):
        run_experiment(load_config(tiny(rounds=2)), out=out, render=False)
    assert (list(out.iterdir()) == []) if existing else not out.exists()
    monkeypatch.setattr(Simulation, "run_round", real)
    run_experiment(load_config(tiny(rounds=2)), out=out, render=False)  # the corrected run
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_an_error_after_round_1_or_not_of_the_config_keeps_the_directory_to_resume(
    tmp_path, tiny, monkeypatch
):
    from fedge.runtime.engine import Simulation

    real = Simulation.run_round

    def fail_at(bad_round, exc):  # noqa: ANN001, ANN202
        def run_round(self, rnd):  # noqa: ANN001, ANN202
            if rnd == bad_round:
                raise exc
            return real(self, rnd)

        return run_round

    monkeypatch.setattr(Simulation, "run_round", fail_at(2, ConfigError("late")))
    with pytest.raises(ConfigError, match="late"):
        run_experiment(load_config(tiny(rounds=2)), out=tmp_path / "a", render=False)
    assert len((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()) == 1
    monkeypatch.setattr(Simulation, "run_round", fail_at(1, RuntimeError("node lost")))
    with pytest.raises(RuntimeError, match="node lost"):
        run_experiment(load_config(tiny(rounds=2)), out=tmp_path / "b", render=False)
    assert (tmp_path / "b" / "config.yaml").exists()  # resumable, as the error says
    monkeypatch.setattr(Simulation, "run_round", real)
    resume_experiment(tmp_path / "b", render=False)
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 2
