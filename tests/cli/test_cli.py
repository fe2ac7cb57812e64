"""The command line: every fault a user can cause ends in one ``error:`` line and exit status 2,
loses nothing (run directories byte-identical after a refused command, absent where they did
not exist) and never leaves a directory that looks complete.

Read-only directories and full disks are simulated by injecting the OSError a real one raises
(CI runs as root, where permissions do not bite)."""

import errno
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import fedge.experiment.storage as storage_mod
from fedge.cli.main import app
from tests_helpers import metrics_without_wall

runner = CliRunner()


def _write_cfg(tmp_path, tiny, **overrides):
    """A tiny federation on the 8x8 digits (scikit-learn, no files to find)."""
    overrides.setdefault("dataset", {"name": "digits"})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny(**overrides)))
    return str(path)


def _snapshot(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def _one_error_line(res, pattern: str) -> str:
    """The command failed with exit 2 and printed exactly one line: ``error: <pattern>``."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert re.fullmatch("error: " + pattern, lines[0]), lines[0]
    assert res.stdout == ""
    return lines[0]


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _resume_refused(run: Path, pattern: str, *args) -> None:
    """``fedge run --resume RUN -q ARGS`` fails with one ``error: <pattern>`` line and changes no byte of the run."""
    before = _snapshot(run)
    _one_error_line(_run("run", "--resume", run, "-q", *args), pattern)
    assert _snapshot(run) == before


def _finished(tmp_path, tiny, name="run", rounds=2, **overrides) -> Path:
    out = tmp_path / name
    res = _run("run", _write_cfg(tmp_path, tiny, rounds=rounds, **overrides), "--out", out, "-q")
    assert res.exit_code == 0, res.output
    return out


def _interrupted(tmp_path, tiny, rounds=3) -> Path:
    """A run that stopped after ``rounds - 1`` of ``rounds`` rounds (as after a kill)."""
    out = _finished(tmp_path, tiny, rounds=rounds - 1)
    for name in ("summary.json", "model.safetensors", "report.md", "report.html"):
        (out / name).unlink()
    for path in (out / "config.yaml", out / ".fedge-config.json"):
        path.write_text(
            path.read_text()
            .replace(f"rounds: {rounds - 1}", f"rounds: {rounds}")
            .replace(f'"rounds": {rounds - 1}', f'"rounds": {rounds}')
        )
    return out


# ---- bad input before anything is written ---------------------------------------------------


@pytest.mark.parametrize(
    "args,pattern",
    [
        (
            ["--set", "rounds=-1"],
            r"config key 'rounds': Input should be greater than or equal to 1 \(got -1\)",
        ),
        (["--set", "no.such.key=1"], r"unknown config key 'no'; valid keys here: .*"),
        (
            ["--set", "clients.per_round=11"],
            r"config key 'clients': clients.per_round=11 must be between 1 and clients.num=10; .*",
        ),
        (
            ["--set", "model.name=resnet99"],
            r"unknown model 'resnet99' \(did you mean 'resnet20'\?\); expected one of: .*",
        ),
        (["--set", "rounds"], r"--set 'rounds': expected KEY=VALUE, e.g. --set rounds=20"),
        (
            ["--set", "method.client_optimizer.lr=inf"],
            r"config key 'method.client_optimizer.lr': 'inf' is not a finite number; give a finite value",
        ),
        (
            ["--set", "method.client_optimizer.lr=.nan"],
            r"config key 'method.client_optimizer.lr': nan is not a finite number; give a finite value",
        ),
        (
            ["--set", "partition.name=dirichlet", "--set", "partition.alpha=-.inf"],
            r"config key 'partition.alpha': -inf is not a finite number; give a finite value",
        ),
        (
            ["--measure-memory", "true"],
            r"unexpected argument 'true' \(--measure-memory, --allow-config-change and --quiet are flags and take "
            r"no value\); e.g. fedge run quickstart --measure-memory",
        ),
        (
            ["--set", "privacy.noise_multiplier=1"],
            r"config key 'privacy': privacy.noise_multiplier=1.0 set, but privacy.mechanism=none: the run would have no "
            r"differential privacy and these keys no effect; set privacy.mechanism=gaussian \(DP-FedAvg\) or tree "
            r"\(DP-FTRL\), or remove them",
        ),
        (
            ["--set", "method.name=baffle", "--set", "method.perturb=[zzz]"],
            r"method.perturb=\['zzz'\]: parameter pattern 'zzz' matches no parameter; parameters: .*",
        ),  # checked at build
        (
            ["--runtime", "flowr"],
            r"--runtime 'flowr' is not known; expected engine, flower-sim or flower",
        ),
        (
            ["--superlink", "h:9093"],
            r"--superlink goes with --runtime flower \(got --runtime engine\); .*",
        ),
        (
            ["--runtime", "flower-sim", "--insecure"],
            r"--insecure goes with --runtime flower \(got --runtime flower-sim\); .*",
        ),
        (
            ["--root-certificates", "ca.crt", "--insecure"],
            r"--insecure and --root-certificates go with --runtime flower \(got --runtime engine\); add --runtime "
            r"flower to run on a Flower deployment, or drop them",
        ),
        (
            ["--set", "dataset.name=cifar[red]"],
            r"unknown dataset 'cifar\[red\]'.*",
        ),  # brackets printed as typed
        (
            [
                "--set",
                "method.name=baffle",
                "--set",
                "method.mode=batch",
                "--set",
                "method.client_optimizer.lr=5",
            ],
            r"config key 'method': method.client_optimizer is not used in batch mode: clients send loss differences "
            r"and the server steps with method.server_optimizer; set method.server_optimizer.\* instead "
            r"\(or method.mode=epoch\)",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, args, pattern):
    out = tmp_path / "run"
    res = _run("run", "quickstart", "--out", out, "-q", *args)
    _one_error_line(res, pattern)
    assert not out.exists()


def test_version_names_fedge_torch_and_python_and_matches_the_installed_package():
    import importlib.metadata
    import platform

    import torch

    import fedge

    res = _run("--version")
    assert res.exit_code == 0, res.output
    assert (
        res.stdout
        == f"fedge {fedge.__version__} (torch {torch.__version__}, Python {platform.python_version()})\n"
    )
    assert fedge.__version__ == importlib.metadata.version(
        "fedge"
    )  # one version, not two that drift


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    _one_error_line(
        _run("run", path, "--out", tmp_path / "run", "-q"),
        r"config file '.*bin.yaml' is not UTF-8 text \(byte 0: invalid start byte\); save it as UTF-8 YAML",
    )
    assert not (tmp_path / "run").exists()


def test_a_user_data_function_that_raises_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "myd.py").write_text("def boom(seed):\n    raise ValueError('my loader failed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    res = _run(
        "run",
        "quickstart",
        "--out",
        tmp_path / "run",
        "-q",
        "--set",
        "dataset.name=module",
        "--set",
        "dataset.target=myd:boom",
    )
    _one_error_line(
        res,
        r"dataset 'module': myd:boom raised ValueError: my loader failed; fix that function "
        r"\(call it alone to see its traceback\)",
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", ["file", "foreign", "complete", "unfinished"])
def test_an_out_that_exists_is_named_for_what_it_holds(tmp_path, tiny, kind):
    """--out on an existing path: the message says what is there and offers --resume only for a
    run that can continue (a complete one: with --set rounds=N); nothing is changed."""
    target = {"file": tmp_path / "f", "foreign": tmp_path / "d"}.get(kind)
    if kind == "file":
        target.write_text("x")
    elif kind == "foreign":
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    elif kind == "complete":
        target = _finished(tmp_path, tiny, rounds=1)
    else:
        target = _interrupted(tmp_path, tiny)
    before = _snapshot(target) if target.is_dir() else target.read_bytes()
    want = {
        "file": r"is a file, not a directory; choose another --out",
        "foreign": r"already holds files and is not a fedge run; choose another --out",
        "complete": r"holds a complete run; choose another --out, or train that run further with: fedge run --resume .* --set rounds=N",
        "unfinished": r"holds an unfinished run; choose another --out, or continue that run with: fedge run --resume .*",
    }[kind]
    _one_error_line(
        _run("run", _write_cfg(tmp_path, tiny, rounds=1), "--out", target, "-q"),
        r"output directory '.*' " + want,
    )
    assert (_snapshot(target) if target.is_dir() else target.read_bytes()) == before


def test_a_refusal_before_any_round_leaves_no_progress_bar(tmp_path):
    """Without -q the progress bar starts at once ("preparing"); a command refused before its
    first round removes it, so the error is the only line (piped here)."""
    _one_error_line(
        _run("run", "--resume", tmp_path / "nope"),
        r"'.*nope' does not exist; give the directory of a fedge run",
    )
    _one_error_line(
        _run(
            "run",
            "quickstart",
            "--out",
            tmp_path / "r",
            "--set",
            "method.name=baffle",
            "--set",
            "method.perturb=[zzz]",
        ),
        r"method.perturb=.*",
    )


def test_resume_with_out_is_refused(tmp_path, tiny):
    run = _interrupted(tmp_path, tiny)
    before = _snapshot(run)
    _one_error_line(
        _run("run", "--resume", run, "--out", tmp_path / "elsewhere", "-q"),
        r"--resume .* continues the run in that directory; --out .* cannot move it \(drop --out\)",
    )
    assert _snapshot(run) == before and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--superlink", "h:9093"],
        ["--insecure"],
        ["--root-certificates", "ca.crt"],
        ["--runtime", "flower-sim", "--superlink", "h:9093"],
    ],
)
def test_resume_refuses_flower_deployment_options_without_runtime_flower(tmp_path, tiny, args):
    """They would be ignored: the run would resume on the engine (or flower-sim), not the SuperLink."""
    _resume_refused(
        _interrupted(tmp_path, tiny),
        r"--(superlink|insecure|root-certificates) goes with --runtime "
        r"flower \(got --runtime (engine|flower-sim)\); .*",
        *args,
    )


def test_resume_without_a_checkpoint_after_several_rounds_is_refused(tmp_path, tiny):
    """A run whose checkpoint.pt is gone cannot continue where it stopped: refused, nothing changed
    (only a run killed before its first checkpoint, one metrics line at most, starts over)."""
    run = _interrupted(tmp_path, tiny, rounds=4)
    (run / "checkpoint.pt").unlink()
    _resume_refused(
        run,
        r"run '.*' has no checkpoint.pt, but metrics.jsonl records 3 rounds: the state after them is "
        r"gone, so the run cannot continue where it stopped; restore checkpoint.pt, or start the run "
        r"anew into another --out \(nothing was changed\)",
    )


def test_non_finite_number_in_a_yaml_file(tmp_path, tiny):
    cfg = tiny(dataset={"name": "digits"})
    cfg["method"]["client_optimizer"]["lr"] = float("inf")
    path = tmp_path / "inf.yaml"
    path.write_text(yaml.safe_dump(cfg))  # written as .inf
    res = _run("run", path, "--out", tmp_path / "run", "-q")
    _one_error_line(
        res,
        r"config key 'method.client_optimizer.lr': inf is not a finite number; give a finite value",
    )
    assert not (tmp_path / "run").exists()


def test_default_run_directory_is_not_created_on_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _run("run", "quickstart", "--set", "rounds=-1")
    _one_error_line(res, r"config key 'rounds': .*")
    assert not (tmp_path / "runs").exists()


def test_measure_memory_is_a_flag_in_help_and_behaviour(tmp_path, tiny):
    helptext = _run("run", "--help").stdout
    line = next(x for x in helptext.splitlines() if "--measure-memory" in x)
    assert "<bool>" not in line and "BOOLEAN" not in line and "flag (no value)" in line
    out = tmp_path / "m"
    res = _run("run", _write_cfg(tmp_path, tiny, rounds=2), "--out", out, "-q", "--measure-memory")
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for x in lines:  # a per-round peak never falls below the round's tensor peak
        assert x["client_peak_bytes"] >= x["client_tensor_peak_bytes"] > 0
        assert "client_rss_growth_bytes" in x
    line = max(lines, key=lambda x: x["client_tensor_peak_bytes"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["client_tensor_peak_bytes"] == line["client_tensor_peak_bytes"]
    assert yaml.safe_load((out / "config.yaml").read_text())["measure"]["memory"] is True


# ---- dataset.root ---------------------------------------------------------------------------

_IDX = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _write_idx(path: Path, array: np.ndarray) -> None:
    path.write_bytes(
        bytes([0, 0, 0x08, array.ndim])
        + np.array(array.shape, ">u4").tobytes()
        + array.astype(np.uint8).tobytes()
    )


def _fake_mnist(directory: Path, names=_IDX) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {
        _IDX[0]: rng.integers(0, 256, (80, 28, 28)),
        _IDX[1]: np.arange(80) % 10,
        _IDX[2]: rng.integers(0, 256, (20, 28, 28)),
        _IDX[3]: np.arange(20) % 10,
    }
    for name in names:
        _write_idx(directory / name, arrays[name])


@pytest.fixture
def mnist_elsewhere(tmp_path, monkeypatch):
    """A complete MNIST in $FEDGE_DATA/mnist: the place a bad dataset.root used to fall back to."""
    _fake_mnist(tmp_path / "data" / "mnist")
    monkeypatch.setenv("FEDGE_DATA", str(tmp_path / "data"))
    return tmp_path / "data" / "mnist"


def test_dataset_root_that_does_not_exist_is_an_error(tmp_path, tiny, mnist_elsewhere):
    cfg = _write_cfg(
        tmp_path,
        tiny,
        dataset={"name": "mnist", "root": str(tmp_path / "nope")},
        model={"name": "mlp"},
    )
    res = _run("run", cfg, "--out", tmp_path / "run", "-q")
    _one_error_line(
        res,
        re.escape(
            f"dataset.root='{tmp_path / 'nope'}' does not hold the 'mnist' files "
            f"(no such directory; names as found in {mnist_elsewhere}); put them there, "
            f"or remove dataset.root to read the copy in {mnist_elsewhere}"
        ),
    )
    assert not (tmp_path / "run").exists()


def test_dataset_root_lacking_files_lists_them(tmp_path, tiny, mnist_elsewhere):
    _fake_mnist(tmp_path / "partial", names=_IDX[:1])
    cfg = _write_cfg(tmp_path, tiny, dataset={"name": "mnist", "root": str(tmp_path / "partial")})
    res = _run("run", cfg, "--out", tmp_path / "run", "-q")
    _one_error_line(
        res,
        re.escape(
            f"dataset.root='{tmp_path / 'partial'}' does not hold the 'mnist' files "
            f"(missing: t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, "
            f"train-labels-idx1-ubyte;"
        )
        + ".*",
    )
    assert not (tmp_path / "run").exists()


def test_run_records_the_data_directory_it_read(tmp_path, tiny, mnist_elsewhere):
    out = _finished(tmp_path, tiny, rounds=1, dataset={"name": "mnist"})
    first = (out / "config.yaml").read_text().splitlines()[0]
    assert first == f"# dataset files read from: {mnist_elsewhere}"
    assert json.loads((out / "summary.json").read_text())["dataset_source"] == str(mnist_elsewhere)


# ---- read-only directory, full disk ---------------------------------------------------------


def _raise(code):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


def test_read_only_out_is_one_line_naming_the_path(tmp_path, tiny, monkeypatch):
    out = tmp_path / "ro" / "run"
    monkeypatch.setattr(storage_mod, "make_dir", _raise(errno.EROFS))
    res = _run("run", _write_cfg(tmp_path, tiny), "--out", out, "-q")
    _one_error_line(
        res,
        re.escape(
            f"cannot create the run directory '{out}' (errno 30: Read-only file system); choose a writable --out"
        ),
    )
    assert not out.exists()


def test_read_only_existing_empty_out_leaves_it_empty(tmp_path, tiny, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setattr(storage_mod, "write_file", _raise(errno.EROFS))
    res = _run("run", _write_cfg(tmp_path, tiny), "--out", out, "-q")
    _one_error_line(
        res,
        re.escape(
            f"cannot write '{out / 'partition.json'}' (errno 30: Read-only file system); "
            "choose a writable --out with free space"
        ),
    )
    assert list(out.iterdir()) == []


def _finished_run(tmp_path, tiny) -> Path:
    out = tmp_path / "run"
    res = _run("run", _write_cfg(tmp_path, tiny, rounds=1), "--out", out, "-q")
    assert res.exit_code == 0, res.output
    return out


def test_export_to_a_read_only_place_is_one_line_naming_the_file(tmp_path, tiny, monkeypatch):
    run = _finished_run(tmp_path, tiny)
    dest = tmp_path / "ro" / "model.pt"
    dest.parent.mkdir()
    monkeypatch.setattr(storage_mod, "write_file", _raise(errno.EROFS))
    res = _run("export", run, "--out", dest)
    _one_error_line(
        res,
        re.escape(
            f"cannot write '{dest}' (errno 30: Read-only file system); choose a writable --out, "
            "e.g. --out ./model.pt"
        ),
    )
    assert list(dest.parent.iterdir()) == []


def test_report_of_a_read_only_run_is_one_line_naming_the_file(tmp_path, tiny, monkeypatch):
    import fedge.report.report as report_mod

    run = _finished_run(tmp_path, tiny)

    def read_only(run_log, folder):  # noqa: ANN001, ANN202  (as matplotlib's savefig raises it)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder / "accuracy.png"))

    monkeypatch.setattr(report_mod, "plot_run", read_only)
    res = _run("report", run)
    _one_error_line(
        res,
        re.escape(
            f"cannot write '{run / 'plots' / 'accuracy.png'}' (errno 30: Read-only file system); "
        )
        + "the report is written into the run directory: make it writable, or copy the run .*",
    )


def _cut_at_round_3(tmp_path, tiny, monkeypatch, fault):  # noqa: ANN001, ANN202
    """A complete 4-round run, then the same run whose round-3 checkpoint write leaves half a
    file and calls ``fault()``: (the complete run, the cut one, the cut run's result)."""
    cfg = _write_cfg(tmp_path, tiny, rounds=4)
    full = tmp_path / "full"
    assert _run("run", cfg, "--out", full, "-q").exit_code == 0
    out = tmp_path / "cut"
    real = storage_mod.save_torch

    def save_then_fault(obj, path):  # noqa: ANN001, ANN202
        if obj["record"]["round"] == 3:
            path.write_bytes(b"half a checkpoint")  # what a full disk or a kill leaves behind
            fault()
        real(obj, path)

    monkeypatch.setattr(storage_mod, "save_torch", save_then_fault)
    res = _run("run", cfg, "--out", out, "-q")
    monkeypatch.setattr(storage_mod, "save_torch", real)
    return full, out, res


def test_disk_full_mid_run_cleans_up_and_resumes(tmp_path, tiny, monkeypatch):
    def disk_full():  # noqa: ANN202
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    full, out, res = _cut_at_round_3(tmp_path, tiny, monkeypatch, disk_full)
    _one_error_line(
        res,
        re.escape(
            f"cannot write '{out / 'checkpoint.pt'}' (errno 28: No space left on device); "
            f"free space or fix the permissions, then continue with: fedge run --resume {out}"
        ),
    )
    assert not list(out.glob("*.tmp")) and not (out / "summary.json").exists()
    res = _run("run", "--resume", out, "-q")
    assert res.exit_code == 0, res.output
    assert metrics_without_wall(out) == metrics_without_wall(full)


@pytest.fixture
def sigterm_is_caught():
    """Should ``fedge run`` not handle SIGTERM itself, it fails the test instead of killing pytest."""

    def unhandled(*_):  # noqa: ANN002, ANN202
        raise AssertionError(
            "SIGTERM reached the test's fallback handler: fedge run did not handle it"
        )

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_mid_run_stops_as_ctrl_c_does_and_the_run_resumes(
    tmp_path, tiny, monkeypatch, sigterm_is_caught
):
    """``kill``, a scheduler's stop or ``timeout`` send SIGTERM: the run stops after cleaning up
    (no temporary file, not complete), says how to continue (exit 143), and resumes to the
    uninterrupted run's metrics."""
    full, out, res = _cut_at_round_3(
        tmp_path, tiny, monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM)
    )
    assert res.exit_code == 143, (
        res.output
    )  # (the signal is handled at once, in this, the main, thread)
    assert res.stderr == f"terminated (SIGTERM); continue with: fedge run --resume {out}\n"
    assert not list(out.glob("*.tmp")) and not (out / "summary.json").exists()
    res = _run("run", "--resume", out, "-q")
    assert res.exit_code == 0, res.output
    assert metrics_without_wall(out) == metrics_without_wall(full)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stop_before_the_run_writes_anything_leaves_nothing_and_offers_no_resume(
    tmp_path, tiny, monkeypatch, how, sigterm_is_caught
):
    """Stopped while loading its data: the claim is undone (no directory), and the message does
    not send the user to ``--resume`` a directory that is not there."""
    import fedge.experiment.run as run_mod

    def stop(cfg):  # noqa: ANN001, ANN202
        if how == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(run_mod, "build_run", stop)
    out = tmp_path / "run"
    res = _run("run", _write_cfg(tmp_path, tiny), "--out", out, "-q")
    assert res.exit_code == (130 if how == "ctrl-c" else 143), res.output
    what = "interrupted" if how == "ctrl-c" else "terminated (SIGTERM)"
    assert (
        res.stderr
        == f"{what} before the run wrote anything; nothing to resume: run the command again\n"
    )
    assert not out.exists()


def test_a_config_file_with_a_key_given_twice_is_one_line_and_writes_nothing(tmp_path, tiny):
    """The second ``method:`` section would otherwise replace the first whole, silently."""
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(tiny(rounds=1)) + "method:\n  name: fedsgd\n")
    _one_error_line(
        _run("run", path, "--out", tmp_path / "run", "-q"),
        r"config file '.*twice.yaml' is not valid YAML at line \d+, column 1 \(key 'method' given twice, "
        r"first on line \d+\); fix it",
    )
    assert not (tmp_path / "run").exists()


# ---- resume -----------------------------------------------------------------------------------


def test_resume_refuses_an_edited_config_and_changes_nothing(tmp_path, tiny):
    out = _interrupted(tmp_path, tiny)
    cfg = out / "config.yaml"
    cfg.write_text(cfg.read_text().replace("lr: 0.1", "lr: 0.5"))
    _resume_refused(
        out,
        re.escape(
            f"'{cfg}' was edited since the run used it "
            "(method.client_optimizer.lr 0.1 -> 0.5); resuming would mix two configs in one "
            "run: restore those values (only rounds may grow), or resume with "
            "--allow-config-change to record the change in config_changes.jsonl"
        ),
    )


def test_resume_allow_config_change_records_it(tmp_path, tiny):
    out = _interrupted(tmp_path, tiny)
    cfg = out / "config.yaml"
    cfg.write_text(cfg.read_text().replace("lr: 0.1", "lr: 0.5"))
    res = _run("run", "--resume", out, "-q", "--allow-config-change")
    assert res.exit_code == 0, res.output
    changes = [json.loads(x) for x in (out / "config_changes.jsonl").read_text().splitlines()]
    assert changes == [
        {"after_round": 2, "changes": {"method.client_optimizer.lr": {"from": 0.1, "to": 0.5}}}
    ]
    assert [x["round"] for x in metrics_without_wall(out)] == [1, 2, 3]
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"
    assert yaml.safe_load(cfg.read_text())["method"]["client_optimizer"]["lr"] == 0.5


def test_resume_without_the_config_record_is_refused_unless_the_change_is_allowed(tmp_path, tiny):
    """.fedge-config.json deleted: an edit of config.yaml could no longer be seen, so resume is
    refused (nothing changed); with --allow-config-change it takes config.yaml as it is and says
    so in config_changes.jsonl, which restores the record."""
    out = _interrupted(tmp_path, tiny)
    (out / ".fedge-config.json").unlink()
    cfg = out / "config.yaml"
    cfg.write_text(cfg.read_text().replace("seed: 0", "seed: 5"))
    _resume_refused(
        out,
        r"'.*\.fedge-config\.json', the record of the config this run used, is missing, so edits of "
        r"config.yaml cannot be checked; restore it, or resume with --allow-config-change to take "
        r"config.yaml as it is \(nothing was changed\)",
    )
    res = _run("run", "--resume", out, "-q", "--allow-config-change")
    assert res.exit_code == 0, res.output
    (change,) = [json.loads(x) for x in (out / "config_changes.jsonl").read_text().splitlines()]
    assert change["after_round"] == 2 and change["changes"] == {}
    assert (
        ".fedge-config.json was missing" in change["note"]
        and (out / ".fedge-config.json").is_file()
    )


def test_resume_refuses_rounds_below_those_already_run_even_with_allow_config_change(
    tmp_path, tiny
):
    """Two of three rounds ran; config.yaml edited to rounds: 1. The run would "finish" with
    two rounds in metrics.jsonl under a config that says one."""
    out = _interrupted(tmp_path, tiny)
    cfg = out / "config.yaml"
    cfg.write_text(cfg.read_text().replace("rounds: 3", "rounds: 1"))
    _resume_refused(
        out,
        re.escape(
            f"run {str(out)!r} has run 2 rounds, but its config.yaml now says rounds=1; rounds "
            "cannot go below the rounds already run: set rounds to 2 or more (nothing was "
            "changed)"
        ),
        "--allow-config-change",
    )


def test_resume_accepts_rounds_grown_in_config_yaml(tmp_path, tiny):
    out = _finished(tmp_path, tiny, rounds=2)
    cfg = out / "config.yaml"
    cfg.write_text(cfg.read_text().replace("rounds: 2", "rounds: 3"))
    res = _run("run", "--resume", out, "-q")
    assert res.exit_code == 0, res.output
    assert [x["round"] for x in metrics_without_wall(out)] == [1, 2, 3]
    assert not (out / "config_changes.jsonl").exists()


def test_resume_with_invalid_yaml_is_one_line(tmp_path, tiny):
    out = _interrupted(tmp_path, tiny)
    (out / "config.yaml").write_text("seed: 0\nrounds: [3\n")
    _resume_refused(
        out,
        re.escape(
            f"'{out / 'config.yaml'}' is not valid YAML at line 3, column 1 "
            "(expected ',' or ']', but got '<stream end>'); fix or restore it, then resume "
            "again"
        ),
    )


def test_resume_with_a_corrupt_middle_metrics_line_changes_nothing(tmp_path, tiny):
    out = _interrupted(tmp_path, tiny, rounds=4)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = '{"round": 2, "test_acc\n'
    (out / "metrics.jsonl").write_text("".join(lines))
    _resume_refused(
        out,
        re.escape(
            f"'{out / 'metrics.jsonl'}' line 2 is not a metrics record "
            '(\'{"round": 2, "test_acc\'); only the last line may be torn by a crash: '
            "restore the file or delete that line, then resume again (nothing was changed)"
        ),
    )


def test_resume_of_a_run_another_process_drives_is_one_line_and_changes_nothing(tmp_path, tiny):
    from fedge.experiment.rundir import RunDir

    out = _interrupted(tmp_path, tiny)
    before = _snapshot(out)
    driver = RunDir(out)
    driver.hold()  # as the process driving its rounds does
    try:
        res = _run("run", "--resume", out, "-q")
    finally:
        driver.let_go()
    _one_error_line(
        res,
        re.escape(
            f"run directory {str(out)!r} is being run by another fedge process right now; wait for "
            f"it to finish (or stop it), then continue it with: fedge run --resume {out}"
        ),
    )
    assert _snapshot(out) == before


def test_resume_refuses_extra_arguments(tmp_path):
    res = _run("run", "quickstart", "--resume", tmp_path)
    _one_error_line(
        res,
        r"--resume takes only the run directory \(its config.yaml fixes everything else\) and "
        r"optionally --set rounds=N to train a run further; drop the config quickstart \(to change "
        r"the run's config: edit .*config.yaml and add --allow-config-change\)$",
    )


@pytest.mark.parametrize(
    "extra,pattern",
    [
        (
            ["--set", "seed=3"],
            r"--resume takes only the run directory .*; drop --set seed=3 \(to change.*",
        ),
        (
            ["--set", "seed=3", "--runtime", "flower"],
            r"--resume takes only .*; drop --set seed=3",
        ),  # --allow-config-change: not on flower
        (
            ["--set", "rounds=2"],
            r"rounds=2 does not extend run '.*', which has rounds=3; give a larger total \(e.g. rounds=6\)",
        ),
        (
            ["--set", "rounds=-1"],
            r"rounds=-1 does not extend run '.*', which has rounds=3; give a larger total.*",
        ),
        (["--set", "rounds=x"], r"--set rounds=x: rounds must be a whole number of rounds"),
        (
            ["--set", "rounds=5", "--set", "rounds=6"],
            r"--set rounds given twice \(--set rounds=5 and --set rounds=6\); give each key once",
        ),
        (
            ["--set", "rounds=5", "--workers", "2", "--measure-memory"],
            r"--resume takes only .*; drop --measure-memory, --workers 2 \(to change.*",
        ),
    ],
)
def test_resume_takes_only_a_larger_round_count(tmp_path, tiny, extra, pattern):
    _resume_refused(_finished(tmp_path, tiny, rounds=3), pattern, *extra)


def test_resume_with_more_rounds_trains_a_finished_run_further(tmp_path, tiny):
    out = _finished(tmp_path, tiny, rounds=2)
    res = _run("run", "--resume", out, "--set", "rounds=4", "-q")
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["round"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]
    assert json.loads((out / "summary.json").read_text())["rounds"] == 4


# ---- divergence -------------------------------------------------------------------------------


def test_fedavg_divergence_names_keys_that_exist(tmp_path, tiny):
    out = tmp_path / "run"
    res = _run(
        "run", _write_cfg(tmp_path, tiny, **{"method.client_optimizer.lr": 1e6}), "--out", out, "-q"
    )
    msg = _one_error_line(res, r"training diverged in round 1: .*")
    assert (
        "lower method.client_optimizer.lr (now 1000000.0) or method.server_optimizer.lr (now 1.0)"
        in msg
    )
    assert "clip" not in msg  # FedAvg has no clip key
    assert not (out / "summary.json").exists() and (out / "metrics.jsonl").read_text() == ""


def test_baffle_divergence_stops_with_the_round_and_collapsed_warnings(tmp_path, tiny):
    out = tmp_path / "run"
    method = {
        "name": "baffle",
        "mode": "batch",
        "k": 10,
        "batch_size": 64,
        "clip": None,
        "ema": None,
        "server_optimizer": {"name": "sgd", "lr": 1e5},
    }
    res = _run("run", _write_cfg(tmp_path, tiny, rounds=4, method=method), "--out", out, "-q")
    assert res.exit_code == 2, res.output
    errors = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and res.stderr.splitlines()[-1] == errors[0]
    assert re.fullmatch(
        r"error: training diverged in round 1: test_loss=\S+ \(limit 100·ln\(10\) = 230.3\); likely cause: a step "
        r"size too large for this model: lower method.server_optimizer.lr \(now 100000.0\), or turn on method.clip "
        r"\(now null; the reference code uses 0.3\)\. The run directory '.*' keeps round 1 and is not complete: .*",
        errors[0],
    )
    warning_lines = [x for x in res.stderr.splitlines() if x.startswith("warning:")]
    assert (
        len(warning_lines) == len({x.split(":")[1] for x in warning_lines}) <= 2
    )  # no repeated raw warnings
    assert not (out / "summary.json").exists()
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["diverged"] is True


@pytest.mark.filterwarnings("ignore::fedge.core.errors.PrivacyWarning")
@pytest.mark.parametrize(
    "method, keys",
    [
        (
            {"name": "fedkseed", "k": 8, "local_steps": 3, "lr": 1e30},
            r"method.lr \(now 1e\+30\), or lower method.eps",
        ),
        ({"name": "feedsign", "lr": 1e30}, r"method.lr \(now 1e\+30\), or lower method.eps"),
        (
            {"name": "decomfl", "p": 2, "local_steps": 3, "optimizer": {"name": "sgd", "lr": 1e30}},
            r"method.optimizer.lr \(now 1e\+30\), or lower method.mu",
        ),
    ],
)
def test_a_forward_only_peer_that_diverges_stops_with_one_line(tmp_path, tiny, method, keys):
    """A non-finite two-point scalar on a client is the run's divergence: one ``error:`` line
    (after any warnings) naming the round and the method's own keys to lower, exit 2, no
    summary (not a traceback)."""
    out = tmp_path / "run"
    method = {**method, "batch_size": 16, "secure_aggregation": False}
    res = _run("run", _write_cfg(tmp_path, tiny, method=method), "--out", out, "-q")
    assert res.exit_code == 2, res.output
    errors = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and res.stderr.splitlines()[-1] == errors[0]  # warnings may precede
    assert re.match(r"error: training diverged in round 1: ", errors[0]), errors[0]
    assert re.search(
        r"likely cause: a step size too large for this model: lower " + keys, errors[0]
    )
    assert "Traceback" not in res.output and not (out / "summary.json").exists()


# ---- two runs, one --out ----------------------------------------------------------------------


def _claimant(cfg_path: str, out: str, barrier, results) -> None:
    from fedge.core.config import load_config
    from fedge.core.errors import FedgeError
    from fedge.experiment.run import run_experiment

    cfg = load_config(cfg_path)
    barrier.wait()
    try:
        run_experiment(cfg, out=out, render=False)
        results.put(("ok", os.getpid()))
    except FedgeError as exc:
        results.put(("refused", str(exc)))


def test_concurrent_runs_on_one_out_never_mix(tmp_path, tiny):
    """Two processes race for one --out, 20 times: one writes it, the other is refused at claim time."""
    cfg = _write_cfg(tmp_path, tiny, rounds=1, **{"clients.num": 2, "clients.per_round": 2})
    ctx = mp.get_context("fork")
    for trial in range(20):
        out = tmp_path / f"race{trial}"
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [
            ctx.Process(target=_claimant, args=(cfg, str(out), barrier, results)) for _ in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        outcome = sorted(results.get(timeout=5) for _ in procs)
        assert [o[0] for o in outcome] == ["ok", "refused"], outcome
        assert re.fullmatch(
            r"output directory '.*' (was claimed by another fedge run started at the same time|"
            r"is being set up by another fedge run|is being run by another fedge process|"
            r"holds (a complete|an unfinished) run).*",
            outcome[1][1],
        )
        claim = json.loads((out / ".fedge-claim").read_text())
        assert claim["pid"] == outcome[0][1]  # the directory belongs to the process that finished
        assert json.loads((out / "summary.json").read_text())["status"] == "complete"
        assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


# ---- reading commands -------------------------------------------------------------------------


def test_run_then_report_and_compare(tmp_path, tiny):
    cfg = _write_cfg(tmp_path, tiny, rounds=2)
    a, b = tmp_path / "a", tmp_path / "b"
    for out, seed in ((a, 0), (b, 1)):
        res = _run("run", cfg, "--out", out, "-q", "--set", f"seed={seed}")
        assert res.exit_code == 0, res.output
        assert res.stdout.splitlines()[-1] == f"run directory: {out}"
        assert re.fullmatch(r"final test accuracy: 0\.\d{4}", res.stdout.splitlines()[-2])
    assert (a / "report.html").exists() and (a / "plots" / "accuracy.png").exists()
    res = _run("report", a)
    assert (
        res.exit_code == 0 and res.stdout == f"wrote {a / 'report.md'}\nwrote {a / 'report.html'}\n"
    )
    res = _run("compare", a, b, "--out", tmp_path / "cmp")
    assert res.exit_code == 0, res.output
    assert any((tmp_path / "cmp").glob("*.png"))
    assert "…" not in res.stdout and f"plots in {tmp_path / 'cmp'}" in res.stdout
    rows = [x for x in res.stdout.splitlines() if x.startswith("│ ")]
    assert [r.split("│")[1].strip() for r in rows] == ["a", "b"]


def test_report_and_compare_show_warnings_on_one_line(tmp_path, tiny):
    """A torn last metrics line is a warning, shown as ``warning: Category: message`` (not
    Python's two lines with the source file and code)."""
    run = _finished(tmp_path, tiny, rounds=2)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"round": 3, "test_acc')
    for args in (["report", run], ["compare", run, run, "--out", tmp_path / "cmp"]):
        res = _run(*args)
        assert res.exit_code == 0, res.output
        assert res.stderr == (
            f"warning: RunLogWarning: {run / 'metrics.jsonl'} line 3 is truncated (the run probably "
            "stopped mid-write); ignoring that round\n"
        )


def test_listing_commands_print_everything_when_piped():
    import fedge
    from fedge.data import available_datasets
    from fedge.methods import get_method

    res = _run("models")
    assert res.exit_code == 0 and "26,730" in res.stdout and "…" not in res.stdout
    res = _run("methods")
    assert res.exit_code == 0 and "…" not in res.stdout
    rows = {ln.split("│")[1].strip(): ln for ln in res.stdout.splitlines() if ln.count("│") == 4}
    assert set(fedge.method_names()) <= set(rows)  # one row a registered method
    for name in fedge.method_names():  # each with its description, whole
        assert get_method(name).description in res.stdout
    assert "privacy.*" in rows["fedavg"] and "method.secure_aggregation" in rows["fedavg"]
    assert "device: cuda" in rows["fedavg"] and "device: cuda" not in rows["ppfl"]
    assert "privacy.*" not in rows["fednova"]  # FedNova's server sums no replies
    res = _run("datasets")
    assert res.exit_code == 0 and "…" not in res.stdout
    for st in available_datasets():  # every row whole, however long its location or hint
        assert str(st.location or st.how_to_get) in res.stdout and st.description in res.stdout
    assert (
        "synthetic-fed │ yes" in res.stdout
    )  # the generated population, not a registry entry, listed too
    _one_error_line(
        _run("run", "quickstart", "-q", "--set", "dataset.name=foo"),
        r"unknown dataset 'foo'; expected one of: .*, synthetic-fed",
    )
    _one_error_line(
        _run("models", "--input-shape", "1,28"),
        r"--input-shape '1,28': expected C,H,W such as 1,28,28",
    )
    _one_error_line(
        _run("models", "--input-shape", "1,x,28"),
        r"--input-shape '1,x,28': expected comma-separated positive integers such as 1,28,28",
    )


def test_killed_process_resumes_to_identical_metrics(tmp_path, tiny):
    """A real SIGKILL mid-run, then `fedge run --resume`: metrics equal an uninterrupted run."""
    cfg = _write_cfg(
        tmp_path, tiny, rounds=6, dataset={"name": "synthetic"}, **{"method.local_epochs": 8}
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fedge = [sys.executable, "-m", "fedge.cli.main"]
    full = tmp_path / "full"
    subprocess.run(
        [*fedge, "run", cfg, "--out", str(full), "-q"], check=True, env=env, capture_output=True
    )
    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [*fedge, "run", cfg, "--out", str(cut), "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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
    res = subprocess.run(
        [*fedge, "run", "--resume", str(cut), "-q"], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert metrics_without_wall(cut) == metrics_without_wall(full)


def test_partition_of_a_config_before_running_equals_the_runs(tmp_path, tiny):
    """``fedge partition`` reads a run directory, or a preset/YAML file (with --set) before
    anything runs: the same shard either way, and --set changes it."""
    cfg = _write_cfg(tmp_path, tiny, **{"partition": {"name": "dirichlet", "alpha": 0.3}})
    run = _finished(tmp_path, tiny, **{"partition": {"name": "dirichlet", "alpha": 0.3}})
    before = _run("partition", cfg, "--client", 2)
    assert before.exit_code == 0, before.output
    shard = json.loads(before.stdout)
    assert shard == json.loads(_run("partition", run, "--client", 2).stdout)
    assert sum(shard["label_counts"]) == shard["samples"] > 0
    other = json.loads(_run("partition", cfg, "--client", 2, "--set", "partition.alpha=100").stdout)
    assert other != shard and other["client"] == 2
    _one_error_line(
        _run("partition", run, "--client", 2, "--set", "seed=1"),
        r"--set goes with a preset or YAML file; '.*' is a run directory, whose config.yaml fixes its population",
    )
    (tmp_path / "empty").mkdir()
    _one_error_line(
        _run("partition", tmp_path / "empty", "--client", 0),
        r"'.*' is not a fedge run directory \(no config.yaml\); give a run directory, a preset or a YAML file",
    )
    _one_error_line(
        _run("partition", "no-such-preset", "--client", 0), r"unknown preset 'no-such-preset'; .*"
    )
    for gone in (tmp_path / "gone", "./gone"):
        _one_error_line(
            _run("partition", gone, "--client", 0),
            r"'.*gone' does not exist; give a run directory, a YAML file or a preset name",
        )


def _commands(typer_app, prefix=()):
    """(command words, callback) of every command of a Typer app, its sub-apps' too."""
    for info in typer_app.registered_commands:
        yield (*prefix, info.name or info.callback.__name__.replace("_", "-")), info.callback
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, (*prefix, group.name))


def test_every_commands_help_shows_its_arguments_help():
    """Each positional argument's help text reaches ``--help`` (typer 0.20 with click 8.5 drops it,
    hence the click pin in constraints.txt)."""
    import typing

    import typer

    checked = 0
    for words, callback in _commands(app):
        hints = typing.get_type_hints(callback, include_extras=True)
        helps = [
            m.help
            for h in hints.values()
            for m in getattr(h, "__metadata__", ())
            if isinstance(m, typer.models.ArgumentInfo) and m.help
        ]
        if not helps:
            continue
        page = " ".join(_run(*words, "--help").stdout.replace("│", " ").split())
        for text in helps:
            assert " ".join(text.split()) in page, (words, text)
            checked += 1
    assert checked >= 8  # run, export, report, compare, partition, attack, fedpt-search, bench ...


def test_command_descriptions_have_one_line_paragraphs():
    """Typer's rich help keeps a docstring's line breaks, so a paragraph wrapped in the source
    would print as ragged lines: each paragraph of a command's docstring is one line."""
    import inspect

    for words, callback in _commands(app):
        for paragraph in (inspect.getdoc(callback) or "").split("\n\n"):
            assert "\n" not in paragraph, (words, paragraph)


def test_an_empty_npz_dataset_is_one_line_naming_the_file(tmp_path):
    empty = tmp_path / "e.npz"
    empty.write_bytes(b"")  # `: > e.npz` (numpy raises a bare EOFError, click prints "Aborted.")
    out = tmp_path / "run"
    res = _run(
        "run", "quickstart", "--set", "dataset.name=npz", "--set", f"dataset.path={empty}",
        "--set", "rounds=1", "--out", out, "-q",
    )  # fmt: skip
    _one_error_line(
        res,
        re.escape(f"dataset 'npz': '{empty}' is not a readable .npz file of numeric arrays ")
        + r"\(the file is empty\); a valid one holds the arrays x_train, y_train, x_test, y_test.*",
    )
    assert not out.exists()


def test_a_set_key_given_twice_is_refused_before_anything_is_written(tmp_path, tiny):
    out = tmp_path / "run"
    res = _run(
        "run", _write_cfg(tmp_path, tiny), "--set", "rounds=1", "--set", "rounds=2", "--out", out
    )
    _one_error_line(
        res,
        re.escape(
            "--set rounds given twice (--set rounds=1 and --set rounds=2); give each key once"
        ),
    )
    assert not out.exists()


def test_a_privacy_budget_that_allows_no_round_says_why_and_exits_1(tmp_path, tiny):
    """The run is complete (a resume could run nothing more: the budget is spent before round 1)
    but trained nothing: the terminal says why and the exit status is not success."""
    privacy = {"mechanism": "gaussian", "noise_multiplier": 1.0, "target_epsilon": 0.001}
    out = tmp_path / "run"
    res = _run("run", _write_cfg(tmp_path, tiny, privacy=privacy), "--out", out, "-q")
    assert res.exit_code == 1, res.output
    assert re.search(
        r"^stopped early: privacy.target_epsilon=0.001 reached: round 1 would bring ε to .*"
        r"stopped after round 0$",
        res.stdout,
        re.M,
    ), res.stdout
    assert "final test accuracy: n/a" in res.stdout
    assert res.stderr.splitlines()[-1] == (
        "the run trained no round: its model is the untrained initial one; raise "
        "privacy.target_epsilon or privacy.noise_multiplier until round 1 fits (fedge privacy "
        "epsilon gives ε per round)"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["rounds"] == 0 and "stopped" in summary


def test_piped_output_gets_one_plain_line_per_round(tmp_path, tiny):
    """stdout not a terminal (``fedge run ... | cat``, a log, CI): a line per round, as it ends."""
    out = tmp_path / "run"
    res = _run("run", _write_cfg(tmp_path, tiny, rounds=3, eval_every=2), "--out", out)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert len(lines) == 5 and lines[3].startswith("final test accuracy: "), lines
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for line, m in zip(lines[:3], metrics, strict=True):
        acc = "-" if m["test_accuracy"] is None else f"{m['test_accuracy']:.4f}"
        assert re.fullmatch(
            rf"round {m['round']}/3: acc {re.escape(acc)}, [0-9.]+ [kMG]?B moved server↔client, "
            r"\d+:\d\d:\d\d",
            line,
        ), line
    quiet = _run("run", _write_cfg(tmp_path, tiny, rounds=2), "--out", tmp_path / "q", "-q")
    assert not any(x.startswith("round ") for x in quiet.stdout.splitlines()), quiet.stdout


def test_piped_output_gets_a_line_per_pruning_round_inside_round_one(tmp_path, tiny):
    """NTK-Ori's pruning rounds (the first exchanges of round 1, possibly minutes each) show
    one plain line each, as they are checkpointed, before round 1's own line."""
    method = {
        "name": "ntk-baffle",
        "mode": "batch",
        "k": 4,
        "batch_size": 16,
        "max_steps": 1,
        "density": 0.5,
        "prune_rounds": 2,
        "prune_inputs": 4,
        "prune_data": "client",
        "prune_k": 3,
        "secure_aggregation": False,
    }
    cfg = _write_cfg(tmp_path, tiny, rounds=1, method=method, model={"name": "mlp", "hidden": [8]})
    res = _run("run", cfg, "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    for i, t in enumerate((1, 2)):
        assert re.fullmatch(rf"round 1/1: pruning {t}/2 done \(saved\), \d+:\d\d:\d\d", lines[i]), (
            lines
        )
    assert lines[2].startswith("round 1/1: acc "), lines


def test_ppfl_profile_enclave_too_small_for_a_stage_is_refused_before_anything_is_written(
    tmp_path,
):
    """The enclave check is validation: one line naming the profile, its enclave_mb, the stage's
    need and the fix; exit 2; no run directory left (not a round-1 failure to clean up)."""
    out = tmp_path / "run"
    res = _run(
        "run",
        "ppfl-fmnist-lenet",
        "--set",
        "clients.profiles=[{name: t, fraction: 1.0, enclave_mb: 0.1}]",
        "--set",
        "dataset.name=synthetic",
        "--set",
        "dataset.shape=[1, 16, 16]",
        "--out",
        out,
    )
    _one_error_line(
        res,
        r"ppfl stage 0 \(features.conv1\) needs S_l = [0-9.]+ MiB of enclave memory at batch \d+, more than any "
        r"client's enclave: clients.profiles 't' \(enclave_mb=0.1\); set enclave_mb to at least [0-9.]+ in "
        r"clients.profiles, allow smaller batches \(method.min_batch_size\) or use a smaller model",
    )
    assert not out.exists()


def test_resume_of_a_directory_left_with_only_a_claim_names_it_and_the_way_out(tmp_path):
    """A run killed while loading its data leaves only .fedge-claim: --resume says what the
    directory is and how to get out (one line, exit 2, nothing changed), and that way works."""
    import socket
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a process that has exited
    run = tmp_path / "r"
    run.mkdir()
    info = {"pid": proc.pid, "host": socket.gethostname(), "time": "2026-01-01T12:00:00"}
    (run / ".fedge-claim").write_text(json.dumps(info))
    _resume_refused(
        run,
        rf"'{re.escape(str(run))}' holds only the claim of a run that stopped before it wrote anything "
        rf"\(pid {proc.pid} on .*\): there is nothing to resume; start the run again with --out "
        rf"{re.escape(str(run))} \(it takes the claim over\), or remove the directory",
    )
    (run / ".fedge-claim").write_text(json.dumps({"pid": os.getpid()}))  # alive: maybe being set up
    _resume_refused(
        run,
        r".* holds only a run's claim \(a run being set up now, or one that stopped before it wrote "
        r"anything\): there is nothing to resume; if no fedge process is setting it up, remove the "
        r"directory and start the run again",
    )


def test_resume_of_a_run_an_older_fedge_wrote_names_what_it_cannot_read_and_the_way_out(
    tmp_path, tiny
):
    """A checkpoint without what this engine reads, or a config.yaml with a key it does not
    know (an older fedge's run): one line naming it and the way out, never a traceback."""
    import torch

    run = _finished(tmp_path, tiny)
    (run / "summary.json").unlink()  # unfinished
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    for key, what in (
        ("record", "it lacks 'record'"),
        ("client_states", "it lacks 'client_states'"),
    ):
        torch.save({k: v for k, v in state.items() if k != key}, run / "checkpoint.pt")
        _resume_refused(
            run,
            rf"'.*checkpoint.pt' cannot be continued by this fedge \({what}; another fedge version wrote "
            r"it, or it was edited\): resume with the fedge that wrote it, or start the run anew into another "
            r"--out or after removing '.*' \(nothing was changed\)",
        )
    torch.save({**state, "record": {**state["record"], "retired": 1}}, run / "checkpoint.pt")
    _resume_refused(run, r".*its record holds 'retired', which this fedge does not know.*")
    torch.save(state, run / "checkpoint.pt")
    for name in (".fedge-config.json", "sessions.jsonl"):  # a run from before they were kept
        (run / name).unlink()
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text() + "retired_key: 1\n")
    _resume_refused(
        run,
        r"run '.*': its config.yaml does not validate with this fedge \(unknown config key "
        r"'retired_key'.*\); edit '.*config.yaml' to fix it and resume again \(with "
        r"--allow-config-change if it says the config was edited\), or start the run anew into another "
        r"--out \(nothing was changed\)",
    )


def test_flops_not_measured_are_absent_and_read_not_measured_everywhere(tmp_path, tiny):
    cfg = _write_cfg(tmp_path, tiny, rounds=1)
    a, b = tmp_path / "a", tmp_path / "b"
    res = _run("run", cfg, "--out", a, "-q", "--set", "measure.flops=false")
    assert res.exit_code == 0, res.output
    assert _run("run", cfg, "--out", b, "-q").exit_code == 0
    line = json.loads((a / "metrics.jsonl").read_text().splitlines()[0])
    assert "client_flops" not in line and "cum_client_flops" not in line
    assert json.loads((a / "summary.json").read_text())["total_client_flops"] is None
    report = (a / "report.md").read_text()
    assert "0 FLOP" not in report
    assert re.search(r"client FLOPs \(total\).*not measured", report)
    res = _run("compare", a, b, "--out", tmp_path / "cmp")
    assert res.exit_code == 0, res.output
    assert "not measured" in res.stdout and " 0 FLOP" not in res.stdout


def test_the_progress_byte_count_names_its_links_and_counts_side_links():
    from fedge.cli.run import moved_text

    line = {"cum_bytes_down": 40_000, "cum_bytes_up": 12_600}
    assert moved_text(line) == "52.6 kB moved server↔client"
    # EPPFL: the device↔edge links carry far more than the server↔client messages
    line |= {"bytes.client->edge": 35_000_000, "bytes.edge->client": 35_100_000}
    assert moved_text(line) == "52.6 kB moved server↔client, 70.1 MB client↔edge this round"
