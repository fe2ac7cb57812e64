"""The examples in fedge's docstrings run and print what they show.

CI's pytest collects ``tests/`` only, so the ``>>>`` examples in ``src/fedge`` are run here,
one test per module, each in a fresh working directory (several write run directories).
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import fedge

SRC = Path(fedge.__file__).resolve().parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(SRC.rglob("*.py")):
        if ">>> " not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_scan_finds_the_examples():
    assert {"fedge.api", "fedge.core.rng", "fedge.report.compare"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests, f"{name} has '>>> ' in its source but no doctest examples were found"
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for t in tests:
        runner.run(t, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
