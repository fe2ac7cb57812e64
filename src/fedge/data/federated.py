"""Federated datasets whose clients exist only while they are sampled (client ``i``'s data is a
pure function of (run seed, i)), with ``synthetic-fed``, the Synthetic(α, β) benchmark of Li et
al. (FedProx, arXiv:1812.06127v5, Section 5.1). Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import torch

from fedge.core.context import ClientData
from fedge.core.errors import ConfigError
from fedge.core.rng import derive_seed, generator

__all__ = ["LazyClients", "SyntheticFederated"]

_DIM, _CLASSES = 60, 10
_TEST_DEVICES, _TEST_PER_DEVICE = 100, 100


@dataclass(frozen=True)
class SyntheticFederated:
    """Synthetic(α, β) with ``num_clients`` devices; every draw derives from ``seed``."""

    num_clients: int
    seed: int
    alpha: float = 1.0
    beta: float = 1.0
    max_samples: int = 2000

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(
                    f"dataset.{name}={v!r}: expected a finite number >= 0 (FedProx uses 0, 0.5 or 1)"
                )
        if self.num_clients < 1:
            raise ConfigError(
                f"synthetic-fed needs at least one client, got clients.num={self.num_clients}"
            )

    num_classes = _CLASSES
    input_shape = (_DIM,)

    def size(self, cid: int) -> int:
        """Client ``cid``'s number of samples (the power law), without generating its data."""
        g = generator(self.seed, "synthetic-fed", "size", cid)
        z = float(torch.randn((), generator=g, dtype=torch.float64))
        return min(self.max_samples, int(math.exp(4.0 + 2.0 * z)) + 50)

    def _device(self, cid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_k, b_k, v_k) of device ``cid``."""
        g = generator(self.seed, "synthetic-fed", "device", cid)
        u = float(torch.randn((), generator=g)) * math.sqrt(self.alpha)
        big_b = float(torch.randn((), generator=g)) * math.sqrt(self.beta)
        w = torch.randn(_CLASSES, _DIM, generator=g) + u
        b = torch.randn(_CLASSES, generator=g) + u
        v = torch.randn(_DIM, generator=g) + big_b
        return w, b, v

    def _samples(self, cid: int, n: int, stream: str) -> tuple[torch.Tensor, torch.Tensor]:
        w, b, v = self._device(cid)
        g = generator(self.seed, "synthetic-fed", stream, cid)
        std = torch.arange(1, _DIM + 1, dtype=torch.float32).pow(-0.6)  # sqrt(j^-1.2)
        x = v + torch.randn(n, _DIM, generator=g) * std  # (n, 60)
        y = (x @ w.t() + b).argmax(dim=1)
        return x, y

    def client(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client ``cid``'s training data (x (n, 60) float32, y (n,) int64)."""
        if not 0 <= cid < self.num_clients:
            raise ConfigError(f"client {cid} is outside the population [0, {self.num_clients})")
        return self._samples(cid, self.size(cid), "train")

    def test_devices(self) -> list[int]:
        """The devices the test set is drawn from (seeded, O(1) in the population)."""
        k = min(_TEST_DEVICES, self.num_clients)
        return sorted(
            {
                derive_seed(self.seed, "synthetic-fed", "test-device", j) % self.num_clients
                for j in range(k)
            }
        )

    def test_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """10,000 held-out samples: fresh draws from :meth:`test_devices`' models."""
        devices = self.test_devices()
        per = math.ceil(_TEST_DEVICES * _TEST_PER_DEVICE / len(devices))
        xs, ys = zip(*(self._samples(c, per, "test") for c in devices), strict=True)
        return torch.cat(xs)[: _TEST_DEVICES * _TEST_PER_DEVICE], torch.cat(ys)[
            : _TEST_DEVICES * _TEST_PER_DEVICE
        ]

    def summary(self, *, sample: int = 10_000) -> dict[str, Any]:
        """What ``partition.json`` records for a lazily generated population: the law and the
        sizes of a seeded sample of clients (listing a million clients would defeat the point).
        One client's shard: :meth:`client` (``fedge partition RUN --client I``)."""
        n = self.num_clients
        ids = (
            range(n)
            if n <= sample
            else sorted({derive_seed(self.seed, "summary", j) % n for j in range(sample)})
        )
        sizes = sorted(self.size(c) for c in ids)
        return {
            "name": "synthetic-fed",
            "params": {"alpha": self.alpha, "beta": self.beta, "max_samples": self.max_samples},
            "num_clients": n,
            "lazy": True,
            "size_law": "min(max_samples, int(lognormal(4, 2)) + 50)",
            "sampled_clients": len(sizes),
            "sizes": {
                "min": sizes[0],
                "median": sizes[len(sizes) // 2],
                "max": sizes[-1],
                "mean": sum(sizes) / len(sizes),
            },
        }


class LazyClients(Sequence[ClientData]):
    """The population as a sequence of :class:`ClientData`, built when indexed and kept for
    the most recent ``cache`` clients only (regenerating one costs ~0.1 ms), so memory follows
    the round, not the population."""

    def __init__(self, source: SyntheticFederated, *, cache: int = 64) -> None:
        self.source, self.cache = source, cache
        self._recent: OrderedDict[int, ClientData] = OrderedDict()

    def __len__(self) -> int:
        return self.source.num_clients

    @overload
    def __getitem__(self, cid: int) -> ClientData: ...

    @overload
    def __getitem__(self, cid: slice) -> Sequence[ClientData]: ...

    def __getitem__(self, cid: int | slice) -> ClientData | Sequence[ClientData]:
        if isinstance(cid, slice):
            return [self[i] for i in range(*cid.indices(len(self)))]
        hit = self._recent.get(cid)
        if hit is not None:
            self._recent.move_to_end(cid)
            return hit
        x, y = self.source.client(cid)
        data = ClientData(x, y, torch.arange(x.shape[0]))
        self._recent[cid] = data
        if len(self._recent) > self.cache:
            self._recent.popitem(last=False)
        return data

    def sizes(self) -> Sequence[int]:
        """Client sizes as a lazy sequence (no list of the population)."""
        return _Sizes(self.source)


class _Sizes(Sequence[int]):
    def __init__(self, source: SyntheticFederated) -> None:
        self.source = source

    def __len__(self) -> int:
        return self.source.num_clients

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.source.size(c) for c in range(*i.indices(len(self)))]
        return self.source.size(int(i))
