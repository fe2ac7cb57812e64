"""Run-directory writes: a failed write is one StorageError naming the path, and leaves neither
its temporary file nor a half-written file behind."""

from __future__ import annotations

import errno
import os

import pytest

from fedge.experiment import storage
from fedge.experiment.rundir import RunDir
from fedge.experiment.storage import StorageError


def test_storage_error_removes_the_temp_file(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "r")
    run.create({"rounds": 1}, {"clients": []})

    def half_write(path, data):
        path.write_bytes(data[:3])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(storage, "write_file", half_write)
    with pytest.raises(
        StorageError, match=r"^cannot write '.*summary.json' \(errno 28: No space left on device\)"
    ):
        storage.atomic_write(run.path / "summary.json", b"{}", "fix")
    assert not list(run.path.glob("*.tmp")) and not (run.path / "summary.json").exists()
