"""Accelerators in the tests: a pytest plugin (tests/conftest.py loads it) with the ``needs_cuda``
marker.

A test that needs a CUDA device (a GPU run compared with a CPU run, the CUDA allocator's peak
memory) is marked ``@pytest.mark.needs_cuda``. Where torch sees no CUDA device the test is
skipped with one line saying so and naming the script that runs these tests on a machine with a
GPU (``-rs``, in the project's pytest options, prints it per test). With ``FEDGE_REQUIRE_CUDA=1``
(``benchmarks/device_check.py`` exports it) the test fails with that line instead, so a GPU
check cannot pass by skipping.
"""

from __future__ import annotations

import os

import pytest
import torch

#: The environment variable that turns a missing CUDA device into a failure.
REQUIRE_ENV = "FEDGE_REQUIRE_CUDA"

#: Why a ``needs_cuda`` test does not run here (the skip reason, or the failure).
MISSING = (
    "needs a CUDA device, and torch sees none here (torch.cuda.is_available() is False); "
    "run benchmarks/device_check.py on a machine with an NVIDIA GPU (docs/guide/gpu.md)"
)


def cuda_required() -> bool:
    """Whether a missing CUDA device fails (``FEDGE_REQUIRE_CUDA`` set, and not to 0)."""
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_cuda: needs a CUDA device; skipped where torch sees none, a failure under "
        f"{REQUIRE_ENV}=1 (tests/accelerators.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip each test marked ``needs_cuda`` where torch sees no CUDA device (a mark on the test,
    so ``-rs`` reports it at the test's own line); under ``FEDGE_REQUIRE_CUDA=1`` nothing is
    skipped: :func:`pytest_runtest_setup` fails the test."""
    if cuda_required() or torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("needs_cuda") is not None:
            item.add_marker(pytest.mark.skip(reason=MISSING))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if cuda_required() and not torch.cuda.is_available() and item.get_closest_marker("needs_cuda"):
        pytest.fail(f"{MISSING} ({REQUIRE_ENV}=1: every needs_cuda test must run)", pytrace=False)
