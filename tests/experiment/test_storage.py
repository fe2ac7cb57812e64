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


@pytest.mark.parametrize("target", ["checkpoint.pt", "model.safetensors"])
def test_a_disk_full_mid_run_is_one_line_naming_the_file_and_resume_finishes_it(
    tmp_path, tiny, monkeypatch, target
):
    """torch.save / safetensors writing to a path turn ENOSPC into a bare RuntimeError: tensors
    go through storage.write_file, so a full disk is the same one line as any other write."""
    from fedge.core.config import load_config
    from fedge.experiment.resume import resume_experiment
    from fedge.experiment.run import run_experiment
    from tests_helpers import metrics_without_wall

    cfg = tiny(rounds=3)
    whole = run_experiment(load_config(cfg), out=tmp_path / "whole", render=False)
    real, writes = storage.write_file, []

    def full_at_round_2(path, data):
        if path.name == target + ".tmp":
            writes.append(path)
            if len(writes) == 2 or target == "model.safetensors":
                path.write_bytes(data[:10])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(storage, "write_file", full_at_round_2)
    out = tmp_path / "run"
    with pytest.raises(StorageError) as exc:
        run_experiment(load_config(cfg), out=out, render=False)
    msg = str(exc.value)
    assert "\n" not in msg and f"'{out / target}'" in msg and "No space left" in msg, msg
    assert f"fedge run --resume {out}" in msg
    assert not list(out.glob("*.tmp")) and not RunDir(out).is_complete()

    monkeypatch.setattr(storage, "write_file", real)  # space freed
    resume_experiment(out, render=False)
    assert RunDir(out).is_complete()
    assert metrics_without_wall(out) == metrics_without_wall(whole)
