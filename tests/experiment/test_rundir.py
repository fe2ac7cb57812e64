"""RunDir: what a run directory holds: its creation, read-only resume checks, config diffs."""

import pytest

import fedge.experiment.rundir as rd
from fedge.core.errors import ResumeError
from fedge.experiment.rundir import RunDir, config_diff, default_run_path


def test_config_diff_names_dotted_keys():
    old = {
        "rounds": 3,
        "method": {"name": "fedavg", "client_optimizer": {"lr": 0.1, "momentum": 0.5}},
    }
    new = {
        "rounds": 4,
        "method": {"name": "fedavg", "client_optimizer": {"lr": 0.2, "momentum": 0.5}},
        "x": 1,
    }
    assert config_diff(old, new) == {
        "method.client_optimizer.lr": (0.1, 0.2),
        "rounds": (3, 4),
        "x": (None, 1),
    }
    assert config_diff(old, old) == {}


def test_read_metrics_reads_only_and_tolerates_only_a_torn_last_line(tmp_path):
    run = RunDir(tmp_path / "r")
    run.create({"rounds": 3}, {"clients": []})
    (run.path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n{"round": 3, "te')
    before = (run.path / "metrics.jsonl").read_bytes()
    assert run.read_metrics(2) == [{"round": 1}, {"round": 2}]
    assert (run.path / "metrics.jsonl").read_bytes() == before
    (run.path / "metrics.jsonl").write_text('{"round": 1}\n[1, 2]\n{"round": 3}\n')
    with pytest.raises(ResumeError, match="line 2 is not a metrics record"):
        run.read_metrics(3)


def test_default_run_path_is_stamped_and_skips_taken_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rd.time, "strftime", lambda fmt: "20260101-120000")
    first = default_run_path("quickstart")
    assert first == rd.Path("runs/quickstart-20260101-120000")
    first.mkdir(parents=True)
    rd.Path("runs/quickstart-20260101-120000-1").mkdir()
    assert default_run_path("quickstart") == rd.Path("runs/quickstart-20260101-120000-2")


@pytest.mark.parametrize("text", ["[1, 2]", '"complete"', "3", "null"])
def test_a_summary_that_is_not_a_mapping_is_not_complete(tmp_path, text):
    run = RunDir(tmp_path / "r")
    run.create({"rounds": 1}, {"clients": []})
    (run.path / "summary.json").write_text(text)
    assert not run.is_complete()  # was: AttributeError ('list' object has no attribute 'get')


def test_a_config_record_that_is_not_a_mapping_is_corrupt_not_missing(tmp_path):
    run = RunDir(tmp_path / "r")
    run.create({"rounds": 1}, {"clients": []})
    (run.path / ".fedge-config.json").write_text("[1, 2]")
    with pytest.raises(
        ResumeError, match=r"\.fedge-config\.json' is corrupt \(holds list, not a mapping"
    ):
        run.applied_config()


def test_read_config_refuses_a_key_given_twice(tmp_path):
    run = RunDir(tmp_path / "r")
    run.create({"rounds": 1}, {"clients": []})
    (run.path / "config.yaml").write_text(
        "rounds: 1\nmethod: {name: fedavg}\nmethod: {name: fedsgd}\n"
    )
    with pytest.raises(
        ResumeError,
        match=r"config.yaml' is not valid YAML at line 3, column 1 \(key 'method' given "
        r"twice, first on line 2\); fix or restore it",
    ):
        run.read_config()
