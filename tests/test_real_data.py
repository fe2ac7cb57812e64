"""The ``needs_data`` marker (tests/real_data.py), run in a pytest of its own on a machine
without Fashion-MNIST (every directory fedge searches is an empty one), then with it: a
missing data set skips the marked tests with one line naming it and the command that installs
it, fails them under FEDGE_REQUIRE_DATA=1 (as CI runs), and with the data nothing is skipped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import real_data

import fedge

INNER = """
import pytest

from fedge.data.registry import load_dataset


@pytest.mark.needs_data("fashion-mnist")
def test_marked():
    assert load_dataset("fashion-mnist").x_train.shape[1:] == (1, 28, 28)


def test_both(fashion_mnist):
    assert load_dataset("fashion-mnist").source == str(fashion_mnist)


def test_unmarked():
    pass
"""

# The machine's own copy is hidden: the system directory fedge searches last is an empty one.
HIDE = """
from pathlib import Path

from fedge.data import formats

formats.SYSTEM_DATA_DIR = Path(__file__).parent / "system"
"""

LINE = (
    "needs the real dataset 'fashion-mnist', which fedge's search does not find: "
    "`sudo apt-get install dataset-fashion-mnist`, or put its four IDX files in "
    "$FEDGE_DATA/fashion-mnist"
)


def _pytest(tmp_path: Path, **env: str) -> tuple[int, str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "conftest.py").write_text(HIDE)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -q -rfEs\n")
    paths = [Path(real_data.__file__).parent, Path(fedge.__file__).parents[1]]
    base = {k: v for k, v in os.environ.items() if k not in ("FEDGE_DATA", real_data.REQUIRE_ENV)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "real_data", "-p", "no:cacheprovider"]
        + ["-p", "no:xdist", "test_inner.py"],
        cwd=tmp_path,
        env={
            **base,
            "PYTHONPATH": os.pathsep.join(map(str, paths)),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_without_the_data_the_marked_tests_skip_naming_the_command(tmp_path: Path) -> None:
    rc, out = _pytest(tmp_path, **{real_data.REQUIRE_ENV: "0"})  # 0: not required
    assert rc == 0, out
    assert out.splitlines()[-1].startswith("2 passed, 2 skipped"), out
    # one line per skipped test, or per file (pytest folds the skips marked on the tests of a
    # file into one line with their count): each names the data set and the command
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    pattern = rf"SKIPPED \[(\d+)\] test_inner\.py(:\d+)?: {re.escape(LINE)}"
    matches = [re.fullmatch(pattern, line) for line in skips]
    assert skips and all(matches), out
    assert sum(int(m[1]) for m in matches if m) == 2, out


def test_without_the_data_the_marked_tests_fail_where_it_is_required(tmp_path: Path) -> None:
    rc, out = _pytest(tmp_path, **{real_data.REQUIRE_ENV: "1"})
    assert rc == 1, out
    assert out.splitlines()[-1].startswith("2 passed, 2 errors"), out
    assert out.count(f"\n{LINE} (FEDGE_REQUIRE_DATA=1: every test must run)\n") == 2, out
    assert "SKIPPED" not in out


def test_with_the_data_every_test_runs(tmp_path: Path) -> None:
    """Made files in $FEDGE_DATA/fashion-mnist stand in for the real ones: fedge's search finds
    them, so the marked tests run (and ``fashion_mnist[real]`` reads them)."""
    real_data.write_fake_idx(tmp_path / "data" / "fashion-mnist", n_train=20, n_test=10)
    rc, out = _pytest(tmp_path, FEDGE_DATA=str(tmp_path / "data"), **{real_data.REQUIRE_ENV: "1"})
    assert rc == 0 and out.splitlines()[-1].startswith("4 passed"), out
    assert "skipped" not in out


@pytest.mark.parametrize("gz", [(True,), (False,), (True, False)])
def test_made_files_read_back_through_fedges_loader(tmp_path: Path, monkeypatch, gz) -> None:
    """The made Fashion-MNIST is what fedge's IDX reader returns, gzipped or plain: 28x28
    uint8 images in [0, 255], balanced labels, found in $FEDGE_DATA/fashion-mnist."""
    from fedge.data import formats
    from fedge.data.registry import load_dataset

    written = real_data.write_fake_idx(tmp_path / "fashion-mnist", n_train=30, n_test=20, gz=gz)
    monkeypatch.setenv("FEDGE_DATA", str(tmp_path))
    monkeypatch.setattr(formats, "SYSTEM_DATA_DIR", tmp_path / "system")
    names = sorted(p.name for p in (tmp_path / "fashion-mnist").iterdir())
    assert sum(n.endswith(".gz") for n in names) == sum(gz[i % len(gz)] for i in range(4))
    ds = load_dataset("fashion-mnist")
    assert ds.source == str(tmp_path / "fashion-mnist")
    train = written["train-images-idx3-ubyte"]
    assert train.dtype == np.uint8 and train.shape == (30, 28, 28) and train.max() > 200
    pixels = ds.x_train[:, 0].numpy() * ds.std[0] + ds.mean[0]  # undo the normalization
    np.testing.assert_allclose(pixels, train / 255.0, atol=1e-5)
    assert np.bincount(ds.y_test.numpy()).tolist() == [2] * 10
