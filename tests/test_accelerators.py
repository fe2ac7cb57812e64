"""The ``needs_cuda`` marker (tests/accelerators.py), run in a pytest of its own with torch told
that no CUDA device is visible (so these run the same on any machine): the marked tests skip with
one line saying why and naming the device-check script; under FEDGE_REQUIRE_CUDA=1 they fail."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import accelerators

import fedge

INNER = """
import pytest


@pytest.mark.needs_cuda
def test_marked():
    pass


@pytest.mark.needs_cuda
class TestMarked:
    def test_in_class(self):
        pass


def test_unmarked():
    pass
"""

# No CUDA device, whatever this machine has.
HIDE = """
import torch

torch.cuda.is_available = lambda: False
"""


def _pytest(tmp_path: Path, **env: str) -> tuple[int, str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "conftest.py").write_text(HIDE)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -q -rfEs\n")
    paths = [Path(accelerators.__file__).parent, Path(fedge.__file__).parents[1]]
    base = {k: v for k, v in os.environ.items() if k != accelerators.REQUIRE_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "accelerators", "-p", "no:cacheprovider"]
        + ["-p", "no:xdist", "test_inner.py"],
        cwd=tmp_path,
        env={**base, "PYTHONPATH": os.pathsep.join(map(str, paths)), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_without_cuda_the_marked_tests_skip_with_one_line(tmp_path: Path) -> None:
    rc, out = _pytest(tmp_path, **{accelerators.REQUIRE_ENV: "0"})  # 0: not required
    assert rc == 0, out
    assert out.splitlines()[-1].startswith("1 passed, 2 skipped"), out
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    pattern = rf"SKIPPED \[(\d+)\] test_inner\.py(:\d+)?: {re.escape(accelerators.MISSING)}"
    matches = [re.fullmatch(pattern, line) for line in skips]
    assert skips and all(matches), out
    assert sum(int(m[1]) for m in matches if m) == 2, out
    assert "benchmarks/device_check.py" in accelerators.MISSING


def test_without_cuda_the_marked_tests_fail_where_it_is_required(tmp_path: Path) -> None:
    rc, out = _pytest(tmp_path, **{accelerators.REQUIRE_ENV: "1"})
    assert rc == 1, out
    assert out.splitlines()[-1].startswith("1 passed, 2 errors"), out
    line = f"{accelerators.MISSING} (FEDGE_REQUIRE_CUDA=1: every needs_cuda test must run)"
    assert out.count(f"\n{line}\n") == 2, out
    assert "SKIPPED" not in out
