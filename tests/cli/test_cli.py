"""The command line: exit codes, messages, nothing written on bad input, kill and resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from fedge.cli.main import app
from tests_helpers import metrics_without_wall

runner = CliRunner()


def _write_cfg(tmp_path, tiny, **overrides):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny(**overrides)))
    return str(path)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--set", "rounds=-1"], "rounds"),
        (["--set", "no.such.key=1"], "no"),
        (["--set", "clients.per_round=11"], "per_round"),
        (["--set", "model.name=resnet99"], "resnet99"),
        (["--set", "rounds"], "KEY=VALUE"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, args, needle):
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "quickstart", "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert not out.exists()


def test_default_run_directory_is_not_created_on_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["run", "quickstart", "--set", "rounds=-1"])
    assert res.exit_code == 2 and not (tmp_path / "runs").exists()


def test_run_then_report_and_compare(tmp_path, tiny):
    cfg = _write_cfg(tmp_path, tiny, rounds=2)
    a, b = tmp_path / "a", tmp_path / "b"
    for out, seed in ((a, 0), (b, 1)):
        res = runner.invoke(app, ["run", cfg, "--out", str(out), "-q", "--set", f"seed={seed}"])
        assert res.exit_code == 0, res.output
        assert f"run directory: {out}" in res.output
    assert (a / "report.html").exists() and (a / "plots" / "accuracy.png").exists()
    res = runner.invoke(app, ["report", str(a)])
    assert res.exit_code == 0 and "report.md" in res.output
    res = runner.invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    assert any((tmp_path / "cmp").glob("*.png"))


def test_measure_memory_reports_peaks(tmp_path, tiny):
    cfg = _write_cfg(tmp_path, tiny, rounds=1)
    res = runner.invoke(app, ["run", cfg, "--out", str(tmp_path / "m"), "-q", "--measure-memory"])
    assert res.exit_code == 0, res.output
    line = json.loads((tmp_path / "m" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["client_tensor_peak_bytes"] > 0
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["client_tensor_peak_bytes"] == line["client_tensor_peak_bytes"]


def test_listing_commands():
    res = runner.invoke(app, ["models"])
    assert res.exit_code == 0 and "lenet" in res.output and "26,730" in res.output
    res = runner.invoke(app, ["datasets"])
    assert res.exit_code == 0 and "digits" in res.output and "cifar10" in res.output
    assert runner.invoke(app, ["models", "--input-shape", "1,28"]).exit_code == 2


def test_resume_refuses_extra_arguments(tmp_path):
    res = runner.invoke(app, ["run", "quickstart", "--resume", str(tmp_path)])
    assert res.exit_code == 2


@pytest.mark.parametrize("extra", [["--set", "seed=3"], ["--set", "rounds=2"], ["--set", "rounds=x"],
                                   ["--set", "rounds=5", "--set", "rounds=6"]])
def test_resume_takes_only_a_larger_round_count(tmp_path, tiny, extra):
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", _write_cfg(tmp_path, tiny, rounds=3), "--out", str(out), "-q"]).exit_code == 0
    before = (out / "metrics.jsonl").read_text()
    res = runner.invoke(app, ["run", "--resume", str(out), *extra, "-q"])
    assert res.exit_code == 2 and "rounds" in res.output
    assert (out / "metrics.jsonl").read_text() == before and (out / "summary.json").exists()


def test_resume_with_more_rounds_trains_a_finished_run_further(tmp_path, tiny):
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", _write_cfg(tmp_path, tiny, rounds=2), "--out", str(out), "-q"]).exit_code == 0
    res = runner.invoke(app, ["run", "--resume", str(out), "--set", "rounds=4", "-q"])
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["round"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert json.loads((out / "summary.json").read_text())["rounds"] == 4


def test_killed_process_resumes_to_identical_metrics(tmp_path, tiny):
    """A real SIGKILL mid-run, then `fedge run --resume`: metrics equal an uninterrupted run."""
    cfg = _write_cfg(tmp_path, tiny, rounds=6, **{"method.local_epochs": 8})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fedge = [sys.executable, "-m", "fedge.cli.main"]
    full = tmp_path / "full"
    subprocess.run([*fedge, "run", cfg, "--out", str(full), "-q"], check=True, env=env, capture_output=True)
    cut = tmp_path / "cut"
    proc = subprocess.Popen([*fedge, "run", cfg, "--out", str(cut), "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    metrics = cut / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if (cut / "summary.json").exists():
        pytest.skip("the run finished before it could be killed (machine too fast for this test)")
    res = subprocess.run([*fedge, "run", "--resume", str(cut), "-q"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert metrics_without_wall(cut) == metrics_without_wall(full)
