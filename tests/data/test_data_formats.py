"""IDX and CIFAR readers on small files written by the tests; the directory search order."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedge.core.errors import ConfigError, DataNotFoundError
from fedge.data import formats
from fedge.data.formats import locate_files, read_cifar_batch, read_idx, search_dirs

_CODES = {
    np.dtype("u1"): 0x08,
    np.dtype("i1"): 0x09,
    np.dtype(">i2"): 0x0B,
    np.dtype(">i4"): 0x0C,
    np.dtype(">f4"): 0x0D,
    np.dtype(">f8"): 0x0E,
}


def idx_bytes(array: np.ndarray, dtype: str = "u1") -> bytes:
    """The IDX encoding of ``array``, written independently of the reader (the oracle)."""
    dt = np.dtype(dtype)
    header = bytes([0, 0, _CODES[dt], array.ndim]) + np.array(array.shape, ">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=dt).tobytes()


@pytest.mark.parametrize("dtype", ["u1", "i1", ">i2", ">i4", ">f4", ">f8"])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path: Path, dtype: str, gz: bool) -> None:
    a = np.arange(2 * 3 * 4).reshape(2, 3, 4) - (0 if dtype == "u1" else 7)
    data = idx_bytes(a, dtype)
    path = tmp_path / ("a.idx.gz" if gz else "a.idx")
    path.write_bytes(gzip.compress(data) if gz else data)
    out = read_idx(path)
    np.testing.assert_array_equal(out, a)
    assert out.shape == (2, 3, 4) and out.dtype.isnative and not out.flags.writeable


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    path = tmp_path / "labels"  # no .gz suffix
    path.write_bytes(gzip.compress(idx_bytes(np.array([3, 1, 4], np.uint8))))
    np.testing.assert_array_equal(read_idx(path), [3, 1, 4])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "bad IDX magic"),
        (b"\x08\x03\x00\x00" + bytes(16), "bad IDX magic"),  # little-endian-looking header
        (bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 5]), "unknown IDX type code 0x07"),
        (bytes([0, 0, 8, 3, 0, 0]), "truncated IDX header"),
        (idx_bytes(np.zeros((4, 5), np.uint8))[:-3], "truncated"),
        (idx_bytes(np.zeros((4, 5), np.uint8)) + b"xx", "trailing bytes"),
    ],
)
def test_corrupt_idx_is_a_clear_config_error(tmp_path: Path, data: bytes, match: str) -> None:
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=match) as info:
        read_idx(path)
    assert str(path) in str(info.value) and "obtain it again" in str(info.value)


def test_truncated_gzip_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "x.gz"
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    path.write_bytes(gzip.compress(idx_bytes(images))[:2000])
    with pytest.raises(ConfigError, match="corrupt or truncated gzip"):
        read_idx(path)


def test_cifar_batch_layout(tmp_path: Path) -> None:
    # Prepare: row = 1024 red, 1024 green, 1024 blue values, each plane row-major 32x32.
    images = np.random.default_rng(0).integers(0, 256, (3, 3, 32, 32), dtype=np.uint8)
    batch = pickle.dumps({b"data": images.reshape(3, -1), b"labels": [2, 0, 1]}, protocol=2)
    # the real files were pickled by numpy 1 (module numpy.core.multiarray): test both spellings
    for data in (batch, batch.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")):
        path = tmp_path / "data_batch_1"
        path.write_bytes(data)
        x, y = read_cifar_batch(path, b"labels")
        np.testing.assert_array_equal(x, images)
        np.testing.assert_array_equal(y, [2, 0, 1])
        assert y.dtype == np.int64


def test_cifar_reader_refuses_code_in_pickles(tmp_path: Path) -> None:
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps(os.system))  # would be a call to os.system in a crafted file
    with pytest.raises(ConfigError, match="refusing to load global"):
        read_cifar_batch(path, b"labels")


def test_cifar_reader_wrong_content(tmp_path: Path) -> None:
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(ConfigError, match=r"shape \(N, 3072\)"):
        read_cifar_batch(path, b"labels")
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}))
    with pytest.raises(ConfigError, match="b'fine_labels'"):
        read_cifar_batch(path, b"fine_labels")


@pytest.mark.parametrize(
    "labels,shown",
    [
        (
            ["cat", "dog"],
            r"<U3 of shape \(2,\) \(e.g. \['cat', 'dog'\]\)",
        ),  # was: ValueError from int()
        ([None, None], r"object of shape \(2,\)"),  # was: TypeError
        ([[0, 1], [1, 0]], r"int64 of shape \(2, 2\)"),  # was: accepted, then a crash mid-round
        ([[0], [1, 2]], r"object of shape \(2,\)"),
    ],  # ragged
)
def test_cifar_labels_that_are_not_one_integer_per_image(
    tmp_path: Path, labels: list, shown: str
) -> None:
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": labels}))
    with pytest.raises(
        ConfigError,
        match=rf"test_batch: expected b'labels' to hold one integer label per image, got "
        rf"{shown}.*; delete it and extract the archive again",
    ):
        read_cifar_batch(path, b"labels")


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDGE_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(formats, "SYSTEM_DATA_DIR", tmp_path / "system")
    assert search_dirs("mnist", tmp_path / "root") == [
        tmp_path / "root",
        tmp_path / "env" / "mnist",
        tmp_path / "env",
        tmp_path / "cache" / "fedge" / "mnist",
        tmp_path / "system" / "mnist",
    ]


def test_locate_prefers_first_complete_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FEDGE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(formats, "SYSTEM_DATA_DIR", tmp_path / "system")
    partial, full = tmp_path / "root", tmp_path / "cache" / "fedge" / "toy"
    partial.mkdir()
    full.mkdir(parents=True)
    (partial / "a").write_bytes(b"1")
    (full / "a.gz").write_bytes(b"1")
    (full / "b").write_bytes(b"1")
    found = locate_files("toy", {"x": "a", "y": "b"}, root=partial, how_to_get="fix")
    assert found == {"x": full / "a.gz", "y": full / "b"}
    with pytest.raises(DataNotFoundError) as info:
        locate_files("toy", {"x": "a", "z": "c"}, root=partial, how_to_get="do this")
    message = str(info.value)
    for line in (
        f"{partial}  (missing: c)",
        f"{full}  (missing: c)",
        f"{tmp_path / 'system' / 'toy'}  (no such directory)",
        "$FEDGE_DATA  (not set)",
        "To fix: do this",
    ):
        assert line in message
