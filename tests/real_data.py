"""Real data sets in the tests: a pytest plugin (tests/conftest.py loads it) with the
``needs_data`` marker, and small made stand-ins for Fashion-MNIST.

A test that needs a real data set (a figure published in docs/benchmarks.md, the real files'
published statistics) is marked ``@pytest.mark.needs_data("fashion-mnist")``. Where fedge's own
search (:func:`fedge.data.formats.search_dirs`: ``dataset.root``, ``$FEDGE_DATA/<name>``,
``$FEDGE_DATA``, ``~/.cache/fedge/<name>``, ``/usr/share/datasets/<name>``) finds no copy, the
test is skipped with one line naming the data set and the command that provides it (``-rs``,
in the project's pytest options, prints it per test). With ``FEDGE_REQUIRE_DATA=1`` (``.ci/run``
exports it, so CI runs every test) the test fails with that line instead.

Every code path such a test exercises also runs on data the tests make: :func:`write_fake_idx`
writes a Fashion-MNIST look-alike (28x28 uint8 IDX files, ten classes of smooth blobs, gzipped
and plain) that the ``fake_fashion_mnist`` fixture puts where fedge's search finds it first,
with any real copy hidden. The ``fashion_mnist`` fixture runs a test on both: the made data
always, the real data as ``needs_data``. So a skip loses no coverage of fedge's code.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

#: The environment variable that turns a missing real data set into a failure.
REQUIRE_ENV = "FEDGE_REQUIRE_DATA"

#: Data set -> how to provide it: Debian's ``dataset-<name>`` package, or the files by hand.
#: (Another name falls back on its registry entry's ``how_to_get``.)
FIX = {
    "fashion-mnist": "`sudo apt-get install dataset-fashion-mnist`, or put its four IDX files "
    "in $FEDGE_DATA/fashion-mnist"
}

IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def data_required() -> bool:
    """Whether a missing real data set fails (``FEDGE_REQUIRE_DATA`` set, and not to 0)."""
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def missing_line(name: str) -> str | None:
    """None where fedge's search finds data set ``name``; else the one line that says how to
    get it (the skip reason, or the failure under ``FEDGE_REQUIRE_DATA=1``)."""
    from fedge.data.registry import get_dataset_spec

    spec = get_dataset_spec(name)  # an unknown name fails here, naming the known ones
    if spec.locate(root=None) is not None:
        return None
    fix = FIX.get(name) or spec.how_to_get
    return f"needs the real dataset {name!r}, which fedge's search does not find: {fix}"


def fake_images(labels: np.ndarray, seed: int) -> np.ndarray:
    """28x28 uint8 images, one smooth blob each, placed by class (a model can tell the classes
    apart, and a total-variation prior suits them as it suits photographs), with seeded jitter
    and pixel noise."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    angle = 2 * np.pi * labels / 10
    cy = 14 + 7 * np.sin(angle) + rng.normal(0, 1, n)
    cx = 14 + 7 * np.cos(angle) + rng.normal(0, 1, n)
    radius = rng.uniform(3.5, 5.5, n)
    yy, xx = np.mgrid[0:28, 0:28]
    d2 = (yy[None] - cy[:, None, None]) ** 2 + (xx[None] - cx[:, None, None]) ** 2
    img = 230 * np.exp(-d2 / (2 * radius[:, None, None] ** 2)) + rng.normal(0, 4, (n, 28, 28))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    """``array`` (uint8) as an IDX file: magic ``00 00 08 ndim``, big-endian dims, the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data, compresslevel=1, mtime=0) if gz else data)


def write_fake_idx(
    directory: Path, *, n_train: int = 6000, n_test: int = 2000, gz: tuple[bool, ...] = (True,)
) -> dict[str, np.ndarray]:
    """A Fashion-MNIST look-alike in ``directory``: the four IDX files under their real names
    (:data:`IDX_STEMS`), balanced labels 0..9; ``gz``: whether each file is gzipped, in the
    order of :data:`IDX_STEMS`, cycled. Returns file stem -> array written."""
    directory.mkdir(parents=True, exist_ok=True)
    y_train = np.arange(n_train) % 10
    y_test = np.arange(n_test) % 10
    arrays = {
        IDX_STEMS[0]: fake_images(y_train, 1),
        IDX_STEMS[1]: y_train,
        IDX_STEMS[2]: fake_images(y_test, 2),
        IDX_STEMS[3]: y_test,
    }
    for i, (stem, array) in enumerate(arrays.items()):
        zipped = gz[i % len(gz)]
        write_idx(directory / (stem + (".gz" if zipped else "")), array, zipped)
    return arrays


# --- the plugin ----------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_data(name): needs the real dataset NAME; skipped where fedge's search finds "
        f"none, a failure under {REQUIRE_ENV}=1 (tests/real_data.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip each test marked ``needs_data(NAME)`` whose data set fedge's search does not find.
    The skip is a mark on the test, so ``-rs`` reports it at the test's own line. Under
    ``FEDGE_REQUIRE_DATA=1`` nothing is skipped: :func:`pytest_runtest_setup` fails the test."""
    if data_required():
        return
    missing: dict[str, str | None] = {}
    for item in items:
        for mark in item.iter_markers("needs_data"):
            name = mark.args[0]
            if name not in missing:
                missing[name] = missing_line(name)
            line = missing[name]
            if line:
                item.add_marker(pytest.mark.skip(reason=line))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not data_required():
        return
    for mark in item.iter_markers("needs_data"):
        line = missing_line(mark.args[0])
        if line:
            pytest.fail(f"{line} ({REQUIRE_ENV}=1: every test must run)", pytrace=False)


@pytest.fixture
def fake_fashion_mnist(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A made Fashion-MNIST (:func:`write_fake_idx`: 6000 train and 2000 test images, enough
    for every preset's ``limit_train``/``validation``; train files gzipped, test files plain)
    that ``load_dataset("fashion-mnist")`` reads: it lies in ``$FEDGE_DATA/fashion-mnist``, and
    the cache and system directories searched after it are empty ones, so a real copy is not
    read. Written once per session (per xdist worker). Returns its directory."""
    from fedge.data import formats

    base = tmp_path_factory.getbasetemp() / "fake-fashion-mnist"
    directory = base / "data" / "fashion-mnist"
    if not (directory / IDX_STEMS[-1]).is_file():  # the last file written
        write_fake_idx(directory, gz=(True, True, False, False))
    monkeypatch.setenv("FEDGE_DATA", str(base / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    monkeypatch.setattr(formats, "SYSTEM_DATA_DIR", base / "system")
    return directory


@pytest.fixture(
    params=["made", pytest.param("real", marks=pytest.mark.needs_data("fashion-mnist"))]
)
def fashion_mnist(request: pytest.FixtureRequest) -> Path:
    """Fashion-MNIST for a test that reads it through fedge's search, twice: the made stand-in
    (``fake_fashion_mnist``, always) and the real data (``needs_data``). Returns the directory
    ``load_dataset("fashion-mnist")`` reads in this test."""
    if request.param == "made":
        return Path(request.getfixturevalue("fake_fashion_mnist"))
    from fedge.data.registry import get_dataset_spec

    return Path(str(get_dataset_spec("fashion-mnist").locate(root=None)))
