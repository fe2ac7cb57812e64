"""Readers for the on-disk formats fedge's datasets ship in (IDX, CIFAR python batches read by a
restricted unpickler), and the search for their files. Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError, DataNotFoundError

__all__ = [
    "SYSTEM_DATA_DIR",
    "file_key",
    "find_file",
    "locate_files",
    "read_cifar_batch",
    "read_bytes",
    "read_idx",
    "search_dirs",
]

#: Where Debian's ``dataset-*`` packages install data (e.g. ``dataset-fashion-mnist``).
SYSTEM_DATA_DIR = Path("/usr/share/datasets")

# IDX type code -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


def search_dirs(name: str, root: str | Path | None = None) -> list[Path]:
    """Directories searched for dataset ``name``, in order.

    1. ``root`` (the ``root=`` argument of ``load_dataset``), if given;
    2. ``$FEDGE_DATA/<name>``, then ``$FEDGE_DATA``, if the variable is set;
    3. ``$XDG_CACHE_HOME/fedge/<name>`` (default ``~/.cache/fedge/<name>``);
    4. ``/usr/share/datasets/<name>`` (Debian's ``dataset-<name>`` packages).
    """
    dirs: list[Path] = []
    if root is not None:
        dirs.append(Path(root).expanduser())
    env = os.environ.get("FEDGE_DATA")
    if env:
        dirs += [Path(env).expanduser() / name, Path(env).expanduser()]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    dirs += [cache / "fedge" / name, SYSTEM_DATA_DIR / name]
    unique: list[Path] = []
    for d in dirs:  # keep order, drop repeats (root may equal $FEDGE_DATA)
        if d not in unique:
            unique.append(d)
    return unique


def find_file(directory: Path, stem: str, suffixes: Sequence[str] = ("", ".gz")) -> Path | None:
    """``directory/stem + suffix`` for the first suffix that exists as a file, else None."""
    for suffix in suffixes:
        path = directory / (stem + suffix)
        if path.is_file():
            return path
    return None


def locate_files(
    name: str,
    stems: Mapping[str, str],
    *,
    root: str | Path | None = None,
    subdirs: Sequence[str] = ("",),
    how_to_get: str,
) -> dict[str, Path]:
    """Find every file of a dataset in one directory, trying :func:`search_dirs` in order.

    Args:
        name: dataset name (selects ``$FEDGE_DATA/<name>`` etc.).
        stems: role -> file name without ``.gz``, e.g.
            ``{"train_images": "train-images-idx3-ubyte"}``; each may be gzipped (``<stem>.gz``).
        root: the user's ``root=`` directory, searched first.
        subdirs: layouts tried under each searched directory, e.g. ``("", "MNIST/raw")``.
        how_to_get: the fix, appended to the error.

    Returns:
        role -> path, all from the first directory that holds every file.

    Raises:
        DataNotFoundError: listing every directory searched (and what each lacked) and the fix.
    """
    tried: list[str] = []
    for base in search_dirs(name, root):
        for sub in subdirs:
            directory = base / sub if sub else base
            if not directory.is_dir():
                tried.append(f"  {directory}  (no such directory)")
                continue
            found = {role: find_file(directory, stem) for role, stem in stems.items()}
            if all(path is not None for path in found.values()):
                return {role: path for role, path in found.items() if path is not None}
            missing = [stems[role] for role, path in found.items() if path is None]
            tried.append(f"  {directory}  (missing: {', '.join(missing)})")
    if not os.environ.get("FEDGE_DATA"):
        tried.append("  $FEDGE_DATA  (not set)")
    files = ", ".join(f"{stem}[.gz]" for stem in stems.values())
    raise DataNotFoundError(
        f"dataset {name!r} not found. Looked for {files} in:\n"
        + "\n".join(tried)
        + f"\nTo fix: {how_to_get}"
    )


def file_key(paths: Mapping[str, Path]) -> tuple[tuple[str, str, int, int], ...]:
    """A hashable key naming files and their versions (mtime, size): for per-process caches."""
    key = []
    for role, path in sorted(paths.items()):
        st = path.stat()
        key.append((role, str(path), st.st_mtime_ns, st.st_size))
    return tuple(key)


def read_bytes(path: str | Path) -> bytes:
    """The contents of ``path``, gunzipped if it starts with the gzip magic number."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise ConfigError(
            f"{path}: corrupt or truncated gzip data ({exc}); delete the file and obtain it again"
        ) from None


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (optionally gzipped) into a native-endian, read-only numpy array.

    Raises:
        ConfigError: bad magic number, unknown type code, or a size that does not match the
            header (truncated or trailing bytes).
    """
    path = Path(path)
    data = read_bytes(path)
    fix = "the file is not a valid IDX file; delete it and obtain it again"
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ConfigError(
            f"{path}: bad IDX magic number {data[:4].hex() or '(empty file)'}; expected 00 00 <type> <ndim>; {fix}"
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise ConfigError(
            f"{path}: unknown IDX type code 0x{code:02x}; expected one of "
            f"{', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)}; {fix}"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ConfigError(f"{path}: truncated IDX header ({len(data)} bytes, need {header}); {fix}")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header
    if found != expected:
        what = "truncated" if found < expected else "has trailing bytes"
        raise ConfigError(
            f"{path}: IDX file {what}: header says shape {shape} ({expected} bytes of "
            f"{dtype.name}), found {found} bytes; {fix}"
        )
    array = np.frombuffer(data, dtype, offset=header).reshape(shape)
    if dtype.itemsize > 1:
        array = array.astype(dtype.newbyteorder("="))
    array.flags.writeable = False
    return array


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickler that rebuilds numpy arrays and plain containers, and nothing else."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how protocol-2 pickles spell bytes objects
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return super().find_class(module, name)


def read_cifar_batch(path: str | Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR python batch: images (N, 3, 32, 32) uint8 and labels (N,) int64.

    Args:
        path: a pickled batch (``data_batch_1``, ``test_batch``, ``train``, ``test``).
        label_key: ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` (CIFAR-100).
    """
    path = Path(path)
    fix = "delete it and extract the archive again"
    try:
        batch = _ArrayOnlyUnpickler(io.BytesIO(read_bytes(path)), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a readable CIFAR python batch ({exc}); {fix}") from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ConfigError(
            f"{path}: expected a dict with keys b'data' and {label_key!r}, got {keys}; {fix}"
        )
    x = np.asarray(batch[b"data"])
    try:
        y = np.asarray(batch[label_key])
    except ValueError:  # ragged lists
        y = np.asarray(batch[label_key], dtype=object)
    if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
        raise ConfigError(
            f"{path}: expected {label_key!r} to hold one integer label per image, got {y.dtype} of shape "
            f"{y.shape} (e.g. {y.ravel()[:3].tolist()}); {fix}"
        )
    y = y.astype(np.int64)
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or len(x) != len(y):
        raise ConfigError(
            f"{path}: expected uint8 data of shape (N, 3072) and N labels, got data "
            f"{x.dtype}{x.shape} and {len(y)} labels; {fix}"
        )
    # Each row is 1024 red, 1024 green, 1024 blue values, each a row-major 32x32 plane.
    return x.reshape(-1, 3, 32, 32), y
