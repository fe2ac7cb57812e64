"""Unfinished reproduction runs carried from one machine to the next: :func:`save_progress` packs
their checkpoints into one committed archive, :func:`restore_progress` puts them back, and
:func:`progress_status` says where each stands.
Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedge.core.errors import ConfigError
from fedge.core.presets import read_yaml
from fedge.core.rundir_schema import CHECKPOINT, CONFIG, METRICS
from fedge.experiment.rundir import RunDir

__all__ = [
    "ARCHIVE",
    "MAX_RUN_BYTES",
    "Packed",
    "Progress",
    "RunStatus",
    "progress_status",
    "restore_progress",
    "save_progress",
    "unfinished_runs",
]

ARCHIVE = "in-progress.tar.gz"  # its name in a reproduction's records folder
_INDEX = "in-progress.json"  # inside the archive: {run path: completed rounds}
MAX_RUN_BYTES = 8_000_000  # a run larger than this (its files, unpacked) is not carried by default


@dataclass(frozen=True)
class Progress:
    """One unfinished run: its directory relative to ``--out``, its completed rounds and the
    size of its files (unpacked; 0 where not measured)."""

    run: str
    rounds: int
    nbytes: int = 0


@dataclass(frozen=True)
class Packed:
    """What :func:`save_progress` did: the runs the archive now holds, the unfinished runs it
    left out for their size (they restart from round 1 on another machine), and the unfinished
    copies it dropped because their run is recorded as finished (on another machine)."""

    held: list[Progress]
    left_out: list[Progress]
    recorded: list[Progress]


def _rounds_done(run_dir: Path) -> int:
    """Rounds of the run's last checkpoint (0 when it has none yet)."""
    state = RunDir(run_dir).load_checkpoint()
    return 0 if state is None else int(state["record"]["round"])


def unfinished_runs(out: str | Path) -> list[Progress]:
    """Every run directory under ``out`` that holds a checkpoint and is not complete, sorted."""
    root = Path(out)
    if not root.is_dir():
        return []
    found = []
    for ck in root.rglob(CHECKPOINT):
        run_dir = ck.parent
        if (run_dir / CONFIG).is_file() and not RunDir(run_dir).is_complete():
            size = sum(p.stat().st_size for p in _run_files(run_dir))
            found.append(
                Progress(run_dir.relative_to(root).as_posix(), _rounds_done(run_dir), size)
            )
    return sorted(found, key=lambda p: p.run)


def _read_archive(archive: Path) -> tuple[dict[str, int], tarfile.TarFile | None]:
    if not archive.exists():
        return {}, None
    try:
        tar = tarfile.open(archive, "r:gz")
        member = tar.extractfile(_INDEX)
        index = json.loads(member.read()) if member is not None else None
    except (tarfile.TarError, KeyError, OSError, ValueError) as exc:
        raise ConfigError(
            f"progress archive {str(archive)!r} is unreadable ({exc.__class__.__name__}: {exc}); "
            "restore it from git (git checkout -- PATH) or delete it to start those runs afresh"
        ) from None
    if not isinstance(index, dict):
        raise ConfigError(
            f"progress archive {str(archive)!r} has no {_INDEX} index; delete it or restore it from git"
        )
    return {str(k): int(v) for k, v in index.items()}, tar


def _run_files(run_dir: Path) -> list[Path]:
    """The files of a run that travel: all but temporaries, the checkpoint first (see the module
    docstring), the rest by name."""
    files = sorted(p for p in run_dir.iterdir() if p.is_file() and not p.name.endswith(".tmp"))
    return sorted(files, key=lambda p: p.name != CHECKPOINT)


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """``info`` without what only describes the machine that packed it (time, owner, mode), so
    an archive's bytes depend on its contents alone."""
    info = copy.copy(info)
    info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "", ""
    info.pax_headers = {}  # an older archive's may hold its times; a long name gets its own again on writing
    return info


def save_progress(
    out: str | Path,
    archive: str | Path,
    *,
    records: str | Path | None = None,
    max_run_bytes: int | None = MAX_RUN_BYTES,
) -> Packed:
    """Pack the unfinished runs under ``out`` into ``archive`` (written whole, then renamed).

    The archive's earlier runs are merged, never silently lost: a run kept there that is further
    along than (or absent from) ``out`` stays as it was; a run that is complete under ``out``
    leaves the archive (its record carries it now), and so does a run recorded as finished in
    ``records`` (``records/<run>.json``, :func:`fedge.bench.variants.run_variants`' layout: it
    finished on another machine, and the copy here or in the archive would never be resumed). A
    run (the copy chosen, from ``out`` or the archive) whose files exceed ``max_run_bytes`` is
    left out and reported (None: no limit). With nothing left to carry the archive is removed.
    The same runs give the same bytes."""
    root, archive = Path(out), Path(archive)
    old, old_tar = _read_archive(archive)
    old_sizes: dict[str, int] = {}
    for member in old_tar.getmembers() if old_tar is not None else []:
        if (run := _run_of(member.name, old)) is not None:
            old_sizes[run] = old_sizes.get(run, 0) + member.size
    local = {p.run: p for p in unfinished_runs(root)}
    complete = {run for run in old if RunDir(root / run).is_complete()}
    keep_old = {
        run: Progress(run, r, old_sizes.get(run, 0))
        for run, r in old.items()
        if run not in complete and r > (local[run].rounds if run in local else -1)
    }
    take_local = {run: p for run, p in local.items() if run not in keep_old}
    candidates = sorted({**keep_old, **take_local}.values(), key=lambda p: p.run)
    finished = [
        p for p in candidates if records is not None and (Path(records) / f"{p.run}.json").is_file()
    ]
    chosen = [p for p in candidates if p not in finished]
    left_out = [p for p in chosen if max_run_bytes is not None and p.nbytes > max_run_bytes]
    held = [p for p in chosen if p not in left_out]
    try:
        if not held:
            archive.unlink(missing_ok=True)
            return Packed(held, left_out, finished)
        archive.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=archive.name + ".", suffix=".tmp", dir=archive.parent)
        try:
            with (
                os.fdopen(fd, "wb") as f,
                gzip.GzipFile(
                    filename="", mode="wb", fileobj=f, mtime=0
                ) as gz,  # no name, no time in its header
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                index = json.dumps(
                    {p.run: p.rounds for p in held}, indent=1, sort_keys=True
                ).encode()
                info = tarfile.TarInfo(_INDEX)
                info.size = len(index)
                tar.addfile(_plain(info), io.BytesIO(index))
                for p in held:
                    if p.run in take_local:
                        for path in _run_files(root / p.run):
                            with path.open("rb") as data:
                                tar.addfile(
                                    _plain(tar.gettarinfo(path, arcname=f"{p.run}/{path.name}")),
                                    data,
                                )
                    else:
                        assert old_tar is not None
                        for member in old_tar.getmembers():
                            if _run_of(member.name, {p.run: p.rounds}) is not None:
                                tar.addfile(_plain(member), old_tar.extractfile(member))
            os.chmod(tmp, 0o644)  # mkstemp makes it private; an archive to commit is not
            os.replace(tmp, archive)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    finally:
        if old_tar is not None:
            old_tar.close()
    return Packed(held, left_out, finished)


def _run_of(name: str, runs: dict[str, int]) -> str | None:
    """The run (a key of ``runs``) that archive member ``name`` belongs to, if any."""
    parent = name.rsplit("/", 1)[0] if "/" in name else ""
    return parent if parent in runs else None


def restore_progress(archive: str | Path, out: str | Path) -> list[Progress]:
    """Put the archive's runs back under ``out`` where that moves them forward: a run missing
    there, or unfinished there with fewer rounds, is replaced by the archive's copy (unpacked
    beside it, then swapped in); a complete run, one as far along, or one a process is driving
    now is left alone. Members that
    would land outside ``out`` (absolute paths, ``..``, links) are refused. Returns what was
    restored."""
    root, archive = Path(out), Path(archive)
    index, tar = _read_archive(archive)
    if tar is None:
        return []
    restored = []
    with tar:
        for run, rounds in sorted(index.items()):
            target = root / run
            if RunDir(target).is_complete() or (
                target.exists() and (RunDir(target).busy() or _rounds_done(target) >= rounds)
            ):
                continue
            members = [m for m in tar.getmembers() if _run_of(m.name, {run: rounds}) is not None]
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".restore-", dir=target.parent))
            try:
                try:
                    tar.extractall(staging, members=members, filter="data")
                except tarfile.FilterError as exc:
                    raise ConfigError(
                        f"progress archive {str(archive)!r} holds an unsafe member ({exc}); delete it"
                    ) from None
                if target.exists():
                    shutil.rmtree(target)
                (staging / run).rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            restored.append(Progress(run, rounds))
    return restored


@dataclass(frozen=True)
class RunStatus:
    """Where an unfinished run stands: its directory relative to ``--out``; the rounds
    checkpointed there (None: not there); whether a process is driving it there now; the rounds
    the archive holds of it (None: not in the archive); the run's rounds (None: its config
    is unreadable); and the wall seconds of its last round there (None: none recorded)."""

    run: str
    here: int | None
    running: bool
    archived: int | None
    total: int | None
    round_s: float | None = None


def _last_round_s(run_dir: Path) -> float | None:
    """``wall_s`` of the last line of the run's ``metrics.jsonl`` (None: none there)."""
    try:
        lines = (run_dir / METRICS).read_text().splitlines()
        wall = json.loads(lines[-1]).get("wall_s") if lines else None
    except (OSError, ValueError, AttributeError):
        return None
    return float(wall) if isinstance(wall, int | float) else None


def _total_rounds(text: str | None) -> int | None:
    try:
        raw = read_yaml(text) if text is not None else None
    except yaml.YAMLError:
        return None
    rounds = raw.get("rounds") if isinstance(raw, dict) else None
    return rounds if isinstance(rounds, int) else None


def progress_status(out: str | Path, archive: str | Path) -> list[RunStatus]:
    """Every unfinished run under ``out`` and every run ``archive`` carries, by run: how far it
    is here and in the archive, whether a process drives it now, and of how many rounds (reads
    only; what :func:`restore_progress` would move forward is a run whose ``archived`` exceeds
    its ``here``)."""
    root = Path(out)
    local = {p.run: p for p in unfinished_runs(root)}
    index, tar = _read_archive(Path(archive))
    configs: dict[str, str | None] = {}
    if tar is not None:
        with tar:
            for run in index:
                try:
                    member = tar.extractfile(f"{run}/{CONFIG}")
                except KeyError:
                    member = None
                configs[run] = None if member is None else member.read().decode("utf-8", "replace")
    out_list = []
    for run in sorted(local.keys() | index.keys()):
        here = local.get(run)
        text = configs.get(run)
        if here is not None:
            try:
                text = (root / run / CONFIG).read_text()
            except OSError:
                pass
        out_list.append(
            RunStatus(
                run,
                None if here is None else here.rounds,
                here is not None and RunDir(root / run).busy(),
                index.get(run),
                _total_rounds(text),
                None if here is None else _last_round_s(root / run),
            )
        )
    return out_list
