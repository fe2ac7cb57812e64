"""Shared helpers for the secure-aggregation tests."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest


def _stream(label: str) -> Callable[[int], bytes]:
    """A fixed byte stream (SHAKE-256 in counter mode) standing in for ``os.urandom``.

    Only tests fix the clients' randomness, so that statistical tests cannot flake.
    """
    counter = 0

    def entropy(n: int) -> bytes:
        nonlocal counter
        counter += 1
        return hashlib.shake_256(f"{label}/{counter}".encode()).digest(n)

    return entropy


@pytest.fixture(scope="session")
def fixed_entropy() -> Callable[[str], Callable[[int], bytes]]:
    return _stream
