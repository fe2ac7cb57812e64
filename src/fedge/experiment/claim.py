"""Owning a run directory: one run claims it (``.fedge-claim``, ``O_EXCL``) and one process at a
time holds it (``flock``) while it drives the run's rounds. Design notes: docs/decisions.md#experiment-and-reports.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from fedge.core.errors import ConfigError
from fedge.core.rundir_schema import CLAIM
from fedge.experiment import storage

try:
    import fcntl
except ImportError:  # not POSIX (Windows): runs are not locked; do not resume one run twice at once
    fcntl = None  # type: ignore[assignment]

__all__ = ["HOLD_WAIT_S", "Claim", "RunDirBusyError"]

HOLD_WAIT_S = 1.0
"""How long ``Claim.hold(wait=True)`` retries the lock before refusing (a new claim, a takeover,
a resume): other processes' :meth:`Claim.busy` probes hold it for an instant."""


class RunDirBusyError(ConfigError):
    """Another run claimed the output directory first, or another process is running it now."""


class Claim:
    """The ownership of the run directory ``path``: the claim this run made (or took over) and
    the lock this process holds."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._created = False
        self._claimed = False
        self._held: int | None = None  # the descriptor whose flock holds the directory

    @property
    def claimed(self) -> bool:
        """Whether this run claimed the directory (:meth:`take`) and has not released it."""
        return self._claimed

    def take(self) -> None:
        """Own the directory: create it (if needed) and ``.fedge-claim`` exclusively.

        Of two runs started at once with the same ``--out``, exactly one succeeds; the other
        gets :class:`RunDirBusyError` and writes nothing. On return the directory is also held
        (:meth:`hold`): call :meth:`let_go` when the run ends, or :meth:`release` if it fails
        before writing anything, to leave no directory behind."""
        fix = "choose a writable --out"
        with storage.failing_as(self.path, "create the run directory", fix):
            self._created = storage.make_dir(self.path)
        info = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        ).encode()
        try:
            storage.create_exclusive(self.path / CLAIM, info)
        except FileExistsError:
            self._take_over_dead_claim(info)
        except OSError as exc:
            self._remove_if_created()
            with storage.failing_as(self.path, "create the run directory", fix):
                raise exc
        self._claimed = True
        try:
            # ours from now on: another process's busy check may hold the lock for an instant
            # (and then finds this live claim), so wait that out rather than refuse
            self.hold(wait=True)
        except RunDirBusyError:
            self.release()
            raise RunDirBusyError(
                f"output directory {str(self.path)!r} is in use by another fedge process; choose another --out"
            ) from None
        except BaseException:
            self.release()
            raise
        others = [p.name for p in self.path.iterdir() if p.name != CLAIM]
        if others:  # a file appeared between the check and the claim: not ours to write into
            self.release()
            raise ConfigError(
                f"output directory {str(self.path)!r} is not empty ({', '.join(sorted(others)[:3])}); "
                "choose another --out"
            )

    def _take_over_dead_claim(self, info: bytes) -> None:
        """Replace the claim of a run of this host that died before writing anything with ours
        (``info``), under the directory's lock, which the run then keeps: of two runs taking it
        over at once one wins and the other, finding a live claim, gets :class:`RunDirBusyError`
        (so does any run finding a live, unknown or foreign claim). Without locks (some network
        filesystems) a takeover could race another: a dead claim is then reported, with the fix."""
        busy = RunDirBusyError(
            f"output directory {str(self.path)!r} was claimed by another fedge run started at the "
            "same time; choose another --out"
        )
        if fcntl is not None and self._dead(self._claim_info()) is None:
            raise busy  # a live (or foreign, or unreadable) claimant: nothing to take over, no lock needed
        try:
            self.hold(wait=True)  # another process's busy() check holds the lock for an instant
        except RunDirBusyError:
            raise busy from None
        try:
            gone = self._dead(self._claim_info())
            if self._held is None:  # no locks here
                if gone is None:
                    raise busy
                raise ConfigError(
                    f"output directory {str(self.path)!r} holds only the claim of a fedge run ({gone}) that is no "
                    f"longer running: it was stopped before it wrote anything; delete the directory (rm -r {self.path}) "
                    "and run again, or choose another --out"
                )
            if gone is None or [x.name for x in self.path.iterdir()] != [CLAIM]:
                raise busy
            with storage.failing_as(self.path / CLAIM, "write", "choose a writable --out"):
                storage.write_file(
                    self.path / CLAIM, info
                )  # in place: the lock keeps other runs out meanwhile
        except BaseException:
            self.let_go()
            raise
        warnings.warn(
            f"output directory {str(self.path)!r} held only the claim of a fedge run ({gone}) that died "
            "before writing anything; this run takes the directory over",
            RuntimeWarning,
            stacklevel=3,
        )

    # -- holding (one process drives a run's rounds at a time) ------------------------
    def hold(self, *, wait: bool = False) -> None:
        """Hold the directory while this process runs it: an exclusive, non-blocking ``flock``.

        Raises :class:`RunDirBusyError` when another process (or another :class:`Claim` of this
        one) holds it, with ``wait`` after retrying for :data:`HOLD_WAIT_S` seconds (other
        processes' :meth:`busy` probes hold it for an instant; a run, as long as it runs). Call
        :meth:`let_go` when done; a process that dies lets go by itself. A directory that does
        not exist (yet) is not held, nor one on a filesystem without locks (there the caller
        must not run one directory twice at once)."""
        if fcntl is None or self._held is not None or not self.path.is_dir():
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # unreadable: the run's own reads will name the problem
            return
        deadline = time.monotonic() + (HOLD_WAIT_S if wait else 0.0)
        try:
            locked = self._lock(fd, deadline)
        except BaseException:  # busy, or interrupted while waiting: the descriptor goes with it
            os.close(fd)
            raise
        if locked:
            self._held = fd
        else:  # no locks here (e.g. some network filesystems): run unheld
            os.close(fd)

    def _lock(self, fd: int, deadline: float) -> bool:
        """``flock`` ``fd`` for :meth:`hold`, retrying until ``deadline``: True once locked, False
        where the filesystem has no locks; :class:`RunDirBusyError` when still held by another."""
        assert fcntl is not None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                raise RunDirBusyError(
                    f"run directory {str(self.path)!r} is being run by another fedge process right now; wait for it "
                    f"to finish (or stop it), then continue it with: fedge run --resume {self.path}"
                ) from None
            except OSError:
                return False

    def let_go(self) -> None:
        """Release :meth:`hold` (closing the descriptor drops the lock)."""
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def busy(self) -> bool:
        """Whether another process (or another :class:`Claim` here) holds the directory now."""
        probe = Claim(self.path)
        try:
            probe.hold()
        except RunDirBusyError:
            return True
        probe.let_go()
        return False

    def dead_claimant(self) -> str | None:
        """``"pid N on HOST, claimed at T"`` when the run that claimed the directory has died (a
        process of this host that no longer exists and holds no lock; this one may hold it), else
        None: alive, on another host, or not known."""
        if self._held is None and self.busy():
            return None
        return self._dead(self._claim_info())  # held by this process: no other one holds it

    def _claim_info(self) -> Any:
        try:
            return json.loads((self.path / CLAIM).read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _dead(info: Any) -> str | None:
        """:meth:`dead_claimant` of a claim's contents, the lock aside."""
        pid = info.get("pid") if isinstance(info, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        host = info.get(
            "host", socket.gethostname()
        )  # claims from before the host was kept: this one's
        if host != socket.gethostname():
            return None
        try:
            os.kill(pid, 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            return f"pid {pid} on {host}, claimed at {info.get('time', '?')}"
        except OSError:  # exists, but another user's
            return None
        return None

    def _remove_if_created(self) -> None:
        if self._created:
            try:
                self.path.rmdir()
            except OSError:
                pass

    def release(self) -> None:
        """Undo :meth:`take` (the run failed before writing anything)."""
        self.let_go()
        if self._claimed:
            (self.path / CLAIM).unlink(missing_ok=True)
            self._claimed = False
        self._remove_if_created()
