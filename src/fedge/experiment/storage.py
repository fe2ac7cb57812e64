"""The writes of a run directory, the only places that touch its disk: whole-file replaces and
appends, every ``OSError`` turned into one :class:`StorageError` naming the path.
Design notes: docs/decisions.md#experiment-and-reports.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as safetensors_bytes

from fedge.core.errors import FedgeError

__all__ = [
    "StorageError",
    "append_file",
    "atomic_write",
    "create_exclusive",
    "failing_as",
    "make_dir",
    "save_safetensors",
    "save_torch",
    "storage_error",
    "write_file",
]


class StorageError(FedgeError, OSError):
    """The run directory could not be written (read-only filesystem, disk full, permissions)."""


def make_dir(path: Path) -> bool:
    """Create ``path`` (and parents); True if this call created it."""
    try:
        path.mkdir(parents=True)
        return True
    except FileExistsError:
        return False


def create_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data``; :class:`FileExistsError` if it exists (``O_EXCL``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    """Write ``path`` in place and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def append_file(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)
        f.flush()


def save_torch(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` through :func:`write_file` (a full disk is an OSError)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_file(path, buf.getvalue())


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """``tensors`` as a safetensors file at ``path`` through :func:`write_file`."""
    write_file(path, safetensors_bytes(tensors, metadata=metadata))


def _describe(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


@contextmanager
def failing_as(path: Path, doing: str, fix: str, *, tmp: Path | None = None) -> Iterator[None]:
    """Turn an OSError into one StorageError line naming ``path``; remove ``tmp`` if left."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        if tmp is not None:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        raise storage_error(path, doing, exc, fix) from None


def storage_error(path: Path | str, doing: str, exc: OSError, fix: str) -> StorageError:
    """``cannot <doing> '<path>' (errno N: <reason>); <fix>`` as one :class:`StorageError`."""
    errno_txt = f"errno {exc.errno}: " if exc.errno else ""
    return StorageError(f"cannot {doing} {str(path)!r} ({errno_txt}{_describe(exc)}); {fix}")


def atomic_write(path: Path, data: bytes, fix: str) -> None:
    """Write ``path`` whole: to ``<path>.tmp``, then renamed over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with failing_as(path, "write", fix, tmp=tmp):
        write_file(tmp, data)
        os.replace(tmp, path)
