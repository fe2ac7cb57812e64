"""Torch's intra-op thread count for a span of work: :func:`torch_threads`.

Float reductions (a convolution's gradient, a matrix product's sums) may add in another order
with another thread count, so a result can change in its last bits, and pruning or any other
threshold on such results can then change outright. A run therefore computes everything it
computes (the build: warm start, pruning, masks; the rounds) under its ``threads`` key, whatever
the calling process uses, and gives the caller its own count back afterwards.

Example:
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> with torch_threads(1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["torch_threads"]


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block under ``threads`` torch intra-op threads (None: the caller's, unchanged),
    restoring the caller's count after it, also when the block raises."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
