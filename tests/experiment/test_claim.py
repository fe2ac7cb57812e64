"""Owning a run directory: one run claims it, one process holds it; a race has one winner, a dead
claimant's directory is taken over, and a refused claim leaves nothing behind."""

from __future__ import annotations

import json
import os

import pytest

import fedge.experiment.claim as claim_mod
from fedge.core.errors import ConfigError
from fedge.core.rundir_schema import CLAIM
from fedge.experiment import storage
from fedge.experiment.claim import Claim, RunDirBusyError
from fedge.experiment.rundir import RunDir


def test_claim_is_exclusive_and_release_removes_what_it_made(tmp_path):
    a, b = RunDir(tmp_path / "r"), RunDir(tmp_path / "r")
    a.claim()
    with pytest.raises(RunDirBusyError):
        b.claim()
    a.release()
    assert not (tmp_path / "r").exists()


def test_claim_lost_at_the_exclusive_create(tmp_path, monkeypatch):
    # both passed the emptiness check; the O_EXCL create decides
    monkeypatch.setattr(RunDir, "check_new", staticmethod(lambda path: None))
    a, b = RunDir(tmp_path / "r"), RunDir(tmp_path / "r")
    a.claim()
    with pytest.raises(
        RunDirBusyError, match="was claimed by another fedge run started at the same time"
    ):
        b.claim()
    assert [p.name for p in (tmp_path / "r").iterdir()] == [".fedge-claim"]


def test_hold_is_exclusive_until_let_go_and_writes_nothing(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("rounds: 1\n")
    a, b = RunDir(tmp_path / "r"), RunDir(tmp_path / "r")
    a.hold()
    assert b.busy() and a.busy()  # a probe is another holder: both see it held
    with pytest.raises(
        RunDirBusyError, match=r"being run by another fedge process.*fedge run --resume"
    ):
        b.hold()
    with pytest.raises(RunDirBusyError, match="being run by another fedge process"):
        RunDir.check_new(tmp_path / "r")  # a fresh run aimed at it: busy, not merely "exists"
    a.let_go()
    assert not b.busy()
    b.hold()
    b.let_go()
    with pytest.raises(
        ConfigError,
        match=r"holds an unfinished run; choose another --out, or continue that run with: fedge run --resume",
    ):
        RunDir.check_new(tmp_path / "r")
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["config.yaml"]
    RunDir(tmp_path / "missing").hold()  # nothing to hold: the caller's own checks name the problem


def test_a_dead_holder_lets_go(tmp_path):
    import subprocess
    import sys

    (tmp_path / "r").mkdir()
    code = (
        "import sys, time; from fedge.experiment.rundir import RunDir; RunDir(sys.argv[1]).hold(); "
        "print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "r")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        assert RunDir(tmp_path / "r").busy()  # held by another process
    finally:
        proc.kill()
        proc.wait()
    assert not RunDir(tmp_path / "r").busy()  # the kernel dropped the lock with the process


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("with_host", [True, False])  # claims written before the host was kept
def test_a_claim_whose_run_died_before_writing_is_taken_over(tmp_path, with_host):
    """A run killed (SIGKILL, out of memory) while loading its data leaves only .fedge-claim;
    the next run aimed there takes the directory over, saying so, instead of refusing it."""
    import json
    import socket

    (tmp_path / "r").mkdir()
    pid = _dead_pid()
    info = {
        "pid": pid,
        **({"host": socket.gethostname()} if with_host else {}),
        "time": "2026-01-01T12:00:00",
    }
    (tmp_path / "r" / ".fedge-claim").write_text(json.dumps(info))
    RunDir.check_new(tmp_path / "r")  # usable
    run = RunDir(tmp_path / "r")
    with pytest.warns(
        RuntimeWarning,
        match=rf"output directory '.*r' held only the claim of a fedge run \(pid {pid} on "
        r".*, claimed at 2026-01-01T12:00:00\) that died before writing anything; this run takes the "
        r"directory over$",
    ):
        run.claim()
    assert json.loads((tmp_path / "r" / ".fedge-claim").read_text())["pid"] == os.getpid()
    assert [p.name for p in (tmp_path / "r").iterdir()] == [".fedge-claim"]
    run.create({"rounds": 1}, {"clients": []})
    run.let_go()
    assert (tmp_path / "r" / "config.yaml").is_file()


def test_a_dead_claim_another_process_is_taking_over_is_busy_and_left_alone(tmp_path, monkeypatch):
    """Two runs finding the same dead claim: the one holding the directory's lock takes it over;
    the other gets RunDirBusyError and changes nothing (whether it sees the lock while checking
    the directory, or only after, when its own claim fails)."""
    import json
    import socket

    (tmp_path / "r").mkdir()
    text = json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "time": "t"})
    (tmp_path / "r" / ".fedge-claim").write_text(text)
    first = RunDir(tmp_path / "r")
    first.hold()  # mid-takeover
    try:
        with pytest.raises(RunDirBusyError, match="is being set up by another fedge run"):
            RunDir(tmp_path / "r").claim()
        monkeypatch.setattr(
            RunDir, "check_new", staticmethod(lambda path: None)
        )  # it checked before the lock was taken
        with pytest.raises(
            RunDirBusyError, match="was claimed by another fedge run started at the same time"
        ):
            RunDir(tmp_path / "r").claim()
    finally:
        first.let_go()
    assert (tmp_path / "r" / ".fedge-claim").read_text() == text


def test_a_takeover_that_cannot_write_or_lock_lets_go_and_says_what_to_do(tmp_path, monkeypatch):
    """A claim that cannot be rewritten (disk full) is a StorageError and leaves the directory
    unlocked (a long-lived process must not keep it); without locks the dead claim is named,
    with the fix, rather than taken over racily."""
    import json
    import socket

    (tmp_path / "r").mkdir()
    text = json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "time": "t"})
    (tmp_path / "r" / ".fedge-claim").write_text(text)

    def full(path, data):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(storage, "write_file", full)
        with pytest.raises(storage.StorageError, match="No space left on device"):
            RunDir(tmp_path / "r").claim()
    assert not RunDir(tmp_path / "r").busy()
    monkeypatch.setattr(claim_mod, "fcntl", None)
    with pytest.raises(
        ConfigError,
        match=r"holds only the claim of a fedge run \(pid .*\) that is no longer running: "
        r".*delete the directory \(rm -r .*r\) and run again, or choose another --out$",
    ):
        RunDir(tmp_path / "r").claim()
    assert (tmp_path / "r" / ".fedge-claim").read_text() == text


def test_a_claim_of_a_live_or_unknown_run_is_still_busy(tmp_path):
    import json

    (tmp_path / "r").mkdir()
    for info in ({"pid": os.getpid()}, {"pid": _dead_pid(), "host": "another-machine"}, "not json"):
        (tmp_path / "r" / ".fedge-claim").write_text(
            info if isinstance(info, str) else json.dumps(info)
        )
        with pytest.raises(RunDirBusyError, match="is being set up by another fedge run"):
            RunDir.check_new(tmp_path / "r")


def test_a_claim_waits_out_a_momentary_lock_and_then_holds_the_directory(tmp_path):
    """Another process's busy() probe (or takeover check) holds the lock for an instant: the run
    that owns the new claim waits it out instead of refusing (which had left two racing runs
    both refused), and holds the directory from its claim on."""
    import threading

    out = tmp_path / "r"
    out.mkdir()
    probe = RunDir(out)
    probe.hold()
    timer = threading.Timer(0.2, probe.let_go)  # well inside HOLD_WAIT_S
    timer.start()
    run = RunDir(out)
    run.claim()
    timer.join()
    assert (out / CLAIM).is_file() and RunDir(out).busy()  # held by the claimant now
    run.release()
    assert not RunDir(out).busy() and not (out / CLAIM).exists()


def test_a_claim_refused_by_a_lasting_lock_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(claim_mod, "HOLD_WAIT_S", 0.05)
    out = tmp_path / "r"
    out.mkdir()
    other = RunDir(out)
    other.hold()
    with pytest.raises(
        RunDirBusyError,
        match=r"output directory '.*' is in use by another fedge process; choose another --out$",
    ):
        RunDir(out).claim()
    assert list(out.iterdir()) == []  # the claim was undone
    other.let_go()


def test_a_live_claim_is_refused_without_waiting_for_its_lock(tmp_path, monkeypatch):
    """The loser of a race finds the winner's live claim (this process's pid) and is refused at
    once: it must not try the lock, which the winner holds for the whole run."""
    out = tmp_path / "r"
    winner = RunDir(out)
    winner.claim()
    monkeypatch.setattr(
        RunDir, "check_new", staticmethod(lambda path: None)
    )  # as if it raced past the check
    monkeypatch.setattr(Claim, "hold", lambda self, **kw: pytest.fail("the loser tried the lock"))
    with pytest.raises(
        RunDirBusyError, match="was claimed by another fedge run started at the same time"
    ):
        RunDir(out).claim()
    assert json.loads((out / CLAIM).read_text())["pid"] == os.getpid()  # the winner's claim stands
    monkeypatch.undo()
    winner.release()
