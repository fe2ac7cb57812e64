"""Unfinished runs carried between machines: packed, merged, restored, and resumed to the same numbers."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import tarfile

import pytest

from fedge.bench.progress import (
    RunStatus,
    progress_status,
    restore_progress,
    save_progress,
    unfinished_runs,
)
from fedge.core.errors import ConfigError
from fedge.experiment.resume import resume_experiment
from tests_helpers import unfinished_run


def _accuracies(path):
    return [
        json.loads(line)["test_accuracy"]
        for line in (path / "metrics.jsonl").read_text().splitlines()
    ]


def test_a_restored_run_resumes_to_the_numbers_of_the_original(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    unfinished_run(here / "seed-0" / "a", 1)
    archive = tmp_path / "rec" / "in-progress.tar.gz"
    held = save_progress(here, archive).held
    assert [(p.run, p.rounds) for p in held] == [("seed-0/a", 1)]
    assert [(p.run, p.rounds) for p in restore_progress(archive, there)] == [("seed-0/a", 1)]
    assert restore_progress(archive, there) == []  # nothing newer the second time
    for root in (here, there):
        resume_experiment(root / "seed-0" / "a", render=False)
    assert _accuracies(there / "seed-0" / "a") == _accuracies(here / "seed-0" / "a")
    assert len(_accuracies(here / "seed-0" / "a")) == 3
    assert unfinished_runs(there) == []
    assert (
        save_progress(there, archive).held == [] and not archive.exists()
    )  # complete here: the archive has nothing to carry


def test_saving_merges_with_the_archive_and_never_loses_a_further_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    archive = tmp_path / "in-progress.tar.gz"
    unfinished_run(a / "x", 2)
    save_progress(a, archive)
    unfinished_run(b / "x", 1)  # behind the archive's copy of x
    unfinished_run(b / "y", 1, seed=1)
    held = {p.run: p.rounds for p in save_progress(b, archive).held}
    assert held == {"x": 2, "y": 1}
    fresh = tmp_path / "fresh"
    save_progress(fresh, archive)  # an empty --out (a new machine) keeps everything
    assert {p.run: p.rounds for p in restore_progress(archive, fresh)} == {"x": 2, "y": 1}
    assert {p.run: p.rounds for p in restore_progress(archive, b)} == {
        "x": 2
    }  # b's x moved forward, y as far
    resume_experiment(b / "x", render=False)
    assert {p.run: p.rounds for p in save_progress(b, archive).held} == {
        "y": 1
    }  # x complete in b: its record carries it


def test_the_same_runs_pack_to_the_same_bytes_wherever_they_are_packed(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    unfinished_run(here / "x", 1)
    unfinished_run(here / "y", 1, seed=1)
    first, again, moved = (tmp_path / n / "in-progress.tar.gz" for n in ("first", "again", "moved"))
    save_progress(here, first)
    (here / "x" / "metrics.jsonl").touch()  # a newer time on a file changes nothing packed
    save_progress(here, again)
    restore_progress(first, there)  # another machine: new files, times, owner
    save_progress(there, moved)
    assert first.read_bytes() == again.read_bytes() == moved.read_bytes()
    save_progress(there, moved)  # merging with itself: unchanged too
    assert moved.read_bytes() == first.read_bytes()
    with tarfile.open(first) as tar:
        assert {(m.mtime, m.uname, m.mode) for m in tar.getmembers()} == {(0, "", 0o644)}


def test_a_run_too_large_to_commit_is_left_out_and_named(tmp_path):
    out, archive = tmp_path / "out", tmp_path / "rec" / "in-progress.tar.gz"
    small, big = unfinished_run(out / "small", 1), unfinished_run(out / "big", 2, seed=1)
    (big / "client_state.bin").write_bytes(bytes(5000))  # what a run's per-client state adds
    sizes = {p.run: p.nbytes for p in unfinished_runs(out)}
    for run in (small, big):  # every file that travels, as a plain sum
        assert sizes[run.name] == sum(f.stat().st_size for f in run.iterdir() if f.is_file())
    limit = sizes["small"] + 1000
    packed = save_progress(out, archive, max_run_bytes=limit)
    assert [(p.run, p.rounds) for p in packed.held] == [("small", 1)]
    assert [(p.run, p.rounds, p.nbytes) for p in packed.left_out] == [("big", 2, sizes["big"])]
    assert [p.run for p in restore_progress(archive, tmp_path / "new")] == ["small"]
    # No limit packs it; a later save under the limit drops the archived copy too, saying so.
    assert [p.run for p in save_progress(out, archive, max_run_bytes=None).held] == ["big", "small"]
    shutil.rmtree(out / "big")
    packed = save_progress(out, archive, max_run_bytes=limit)
    assert [p.run for p in packed.held] == ["small"] and [p.run for p in packed.left_out] == ["big"]
    assert [p.run for p in restore_progress(archive, tmp_path / "newer")] == ["small"]


def test_a_run_recorded_as_finished_elsewhere_leaves_the_archive(tmp_path):
    out, records = tmp_path / "out", tmp_path / "rec"
    archive = records / "in-progress.tar.gz"
    unfinished_run(out / "seed-0" / "a", 1)
    unfinished_run(out / "seed-0" / "b", 1, seed=1)
    assert [p.run for p in save_progress(out, archive, records=records).held] == [
        "seed-0/a",
        "seed-0/b",
    ]
    (records / "seed-0").mkdir()
    (records / "seed-0" / "a.json").write_text("{}")  # another machine finished a and recorded it
    shutil.rmtree(out / "seed-0" / "b")  # b is in the archive only
    (records / "seed-0" / "b.json").write_text("{}")
    packed = save_progress(out, archive, records=records)
    assert packed.held == [] and not archive.exists()
    assert [(p.run, p.rounds) for p in packed.recorded] == [("seed-0/a", 1), ("seed-0/b", 1)]


def test_restore_leaves_a_complete_or_further_run_alone(tmp_path):
    archive = tmp_path / "in-progress.tar.gz"
    unfinished_run(tmp_path / "old" / "x", 1)
    save_progress(tmp_path / "old", archive)
    ahead = unfinished_run(tmp_path / "new" / "x", 2)
    before = (ahead / "checkpoint.pt").read_bytes()
    assert restore_progress(archive, tmp_path / "new") == []
    assert (ahead / "checkpoint.pt").read_bytes() == before
    resume_experiment(ahead, render=False)
    assert restore_progress(archive, tmp_path / "new") == []


def test_restore_leaves_a_run_being_driven_alone(tmp_path):
    from fedge.experiment.rundir import RunDir

    archive = tmp_path / "in-progress.tar.gz"
    unfinished_run(tmp_path / "old" / "x", 2)
    save_progress(tmp_path / "old", archive)
    behind = unfinished_run(tmp_path / "new" / "x", 1)
    before = (behind / "checkpoint.pt").read_bytes()
    driver = RunDir(behind)
    driver.hold()  # a worker is driving it: replacing its directory under it would lose its rounds
    try:
        assert restore_progress(archive, tmp_path / "new") == []
    finally:
        driver.let_go()
    assert (behind / "checkpoint.pt").read_bytes() == before
    assert [(p.run, p.rounds) for p in restore_progress(archive, tmp_path / "new")] == [
        ("x", 2)
    ]  # once let go


def test_a_damaged_or_unsafe_archive_is_refused_with_the_fix(tmp_path):
    bad = tmp_path / "in-progress.tar.gz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(ConfigError, match="unreadable.*restore it from git"):
        restore_progress(bad, tmp_path / "out")
    with pytest.raises(ConfigError, match="unreadable"):
        save_progress(tmp_path / "out", bad)
    assert bad.read_bytes() == b"not a tar"  # a refused save changes nothing
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        for name, data in (
            ("in-progress.json", b'{"../escape": 1}'),
            ("../escape/checkpoint.pt", b"x"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ConfigError, match="unsafe member"):
        restore_progress(evil, tmp_path / "out")
    assert not (tmp_path / "escape").exists()
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_status_says_where_each_run_stands_here_and_in_the_archive(tmp_path):
    """``--progress-status``: each unfinished run here and in the archive, its rounds of the
    run's rounds, whether a process drives it, and what a restore would move forward."""
    from fedge.bench.script import status_lines
    from fedge.experiment.rundir import RunDir

    archive, here, there = tmp_path / "in-progress.tar.gz", tmp_path / "here", tmp_path / "there"
    assert progress_status(here, archive) == []
    assert status_lines([]) == ["no unfinished runs here or in the archive"]
    unfinished_run(there / "x", 2)
    unfinished_run(there / "y", 1, seed=1)
    save_progress(there, archive)
    unfinished_run(here / "x", 1)  # behind the archive's copy
    complete = unfinished_run(here / "z", 1)
    resume_experiment(complete, render=False)  # finished: not listed
    driver = RunDir(here / "x")
    driver.hold()
    try:
        status = progress_status(here, archive)
        assert status[0].round_s is not None and status[0].round_s > 0  # its round's wall_s
        status[0] = dataclasses.replace(status[0], round_s=None)
        assert status == [
            RunStatus("x", here=1, running=True, archived=2, total=3),
            RunStatus("y", here=None, running=False, archived=1, total=3),
        ]
        assert status_lines(status) == [
            "x: round 1 of 3 here (running now); the archive holds round 2",
            "y: not here; the archive holds round 1 of 3 (--restore-progress brings it here)",
        ]
    finally:
        driver.let_go()
    (x,) = [
        dataclasses.replace(s, round_s=None) for s in progress_status(here, archive) if s.run == "x"
    ]
    assert status_lines([x]) == [
        "x: round 1 of 3 here (stopped); the archive holds round 2 (--restore-progress brings it here)"
    ]
    restore_progress(archive, here)
    assert [(s.run, s.here, s.archived) for s in progress_status(here, archive)] == [
        ("x", 2, 2),
        ("y", 1, 1),
    ]
