"""Stopping what loopback started: the whole process group, and only once none of it runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fedge.experiment.flower import _group_running, _stop

CHILD = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"


def test_stop_ends_the_process_and_what_it_started():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(_members(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_members(proc.pid)) == 2 and _group_running(proc.pid)  # leader and grandchild
        _stop(proc)
        assert proc.poll() is not None and not _group_running(proc.pid)  # the grandchild too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _members(pgid: int) -> list[str]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append(stat.parent.name)
    return out


def test_a_group_that_does_not_exist_is_not_running():
    assert not _group_running(2**22 + 12345)  # above the default pid_max, so never a group
