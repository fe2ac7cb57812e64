"""Partitioners: properties every split must have (hypothesis), each scheme's own guarantee,
and parameter validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.data.partition import (
    PARTITIONERS,
    partition,
    partition_summary,
    partitioner_names,
    resolve_partition_params,
)

FAST = settings(max_examples=40, deadline=None)
# params that make every scheme succeed on any input (dirichlet: min_size=0 never retries)
ALWAYS_OK = {
    "iid": {},
    "dirichlet": {"min_size": 0},
    "shards": {"shards_per_client": 1},
    "domain": {},
}


@st.composite
def problems(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, int]:
    n = draw(st.integers(1, 300))
    k = draw(st.integers(1, 12))
    labels = np.array(draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)))
    domains = np.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    counts = np.bincount(domains)
    counts = counts[counts > 0]
    # the domain scheme needs each domain to hold at least as many samples as its clients
    limit = min(n, len(counts) * int(counts.min()))
    num_clients = draw(st.integers(1, max(1, min(limit, 25))))
    return labels, domains, num_clients, draw(st.integers(0, 2**32))


DRAWS = st.sampled_from(["torch", "portable"])


@FAST
@given(problems(), st.sampled_from(sorted(ALWAYS_OK)), DRAWS)
def test_every_index_exactly_once(problem: tuple, name: str, draws: str) -> None:
    labels, domains, num_clients, seed = problem
    kw = dict(seed=seed, domains=domains, draws=draws, **ALWAYS_OK[name])
    parts = partition(name, labels, num_clients, **kw)
    assert len(parts) == num_clients
    assert sum(len(p) for p in parts) == len(labels)
    everything = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(everything), np.arange(len(labels)))
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)  # sorted, no repeats
    again = partition(name, labels, num_clients, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))  # deterministic


@FAST
@given(st.sampled_from(sorted(ALWAYS_OK)), st.integers(0, 2**32), st.integers(0, 2**32), DRAWS)
def test_different_seed_different_split(name: str, s1: int, s2: int, draws: str) -> None:
    if s1 == s2:
        return
    # 3 classes of ~67 cut into shards of 40: which samples of a class share a shard is random
    # (with whole-class shards, 5 clients would have only 5! distinct splits)
    labels = np.arange(200) % 3
    domains = np.arange(200) % 3  # 5 clients over 3 domains: two domains are split in two
    a = partition(name, labels, 5, seed=s1, domains=domains, draws=draws, **ALWAYS_OK[name])
    b = partition(name, labels, 5, seed=s2, domains=domains, draws=draws, **ALWAYS_OK[name])
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))


@FAST
@given(st.integers(1, 500), st.integers(1, 40), st.integers(0, 2**32), DRAWS)
def test_iid_sizes_differ_by_at_most_one(n: int, num_clients: int, seed: int, draws: str) -> None:
    num_clients = min(num_clients, n)
    labels = np.zeros(n, np.int64)
    sizes = [len(p) for p in partition("iid", labels, num_clients, seed=seed, draws=draws)]
    assert max(sizes) - min(sizes) <= 1


def test_portable_partitions_shuffle_with_the_portable_generator() -> None:
    # Oracle: iid spelled out on the first portable permutation of (seed, "partition", "iid").
    from fedge.core import portable

    labels = np.arange(103) % 7
    perm = portable.permutation(portable.stream_key(4, "partition", "iid", "seq", 0), 103)
    owner = np.empty(103, np.int64)
    owner[perm.numpy()] = np.repeat(np.arange(5), [21, 21, 21, 20, 20])
    got = partition("iid", labels, 5, seed=4, draws="portable")
    for c, part in enumerate(got):
        np.testing.assert_array_equal(part, np.flatnonzero(owner == c))
    domains = np.arange(103) % 3
    for name in ("iid", "shards", "domain"):  # portable differs from numpy's shuffles
        a = partition(name, labels, 5, seed=4, domains=domains, draws="portable")
        b = partition(name, labels, 5, seed=4, domains=domains)
        assert not all(np.array_equal(x, y) for x, y in zip(a, b)), name
    # dirichlet needs gamma variates: it stays on numpy whatever draws says
    a = partition("dirichlet", labels, 5, seed=4, min_size=0, draws="portable")
    b = partition("dirichlet", labels, 5, seed=4, min_size=0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert [PARTITIONERS[n].portable for n in ("iid", "dirichlet", "shards", "domain")] == [
        True,
        False,
        True,
        True,
    ]
    with pytest.raises(ConfigError, match="draws must be one of"):
        partition("iid", labels, 5, seed=4, draws="numpy")


@FAST
@given(st.integers(2, 10), st.floats(0.05, 20), st.integers(0, 15), st.integers(0, 2**32))
def test_dirichlet_min_size_honoured(
    num_clients: int, alpha: float, min_size: int, seed: int
) -> None:
    labels = np.arange(400) % 10
    try:
        parts = partition(
            "dirichlet", labels, num_clients, seed=seed, alpha=alpha, min_size=min_size
        )
    except ConfigError as exc:  # allowed only as the documented, actionable failure
        assert "lower partition.min_size or raise partition.alpha" in str(exc)
        return
    assert min(len(p) for p in parts) >= min_size


def test_dirichlet_alpha_controls_label_skew() -> None:
    labels = np.arange(2000) % 10

    def mean_labels(alpha: float) -> float:
        parts = partition("dirichlet", labels, 10, seed=0, alpha=alpha, min_size=0)
        return float(np.mean([len(np.unique(labels[p])) for p in parts]))

    assert mean_labels(1000.0) == 10.0
    assert mean_labels(0.05) < 4


def test_dirichlet_impossible_or_exhausted_min_size() -> None:
    labels = np.arange(100) % 10
    with pytest.raises(ConfigError, match="needs 110 samples, only 100 available"):
        partition("dirichlet", labels, 11, seed=0, min_size=10)
    with pytest.raises(
        ConfigError,
        match="no draw in 100 gave every client at least min_size=9.*lower partition.min_size or raise partition.alpha",
    ):
        partition("dirichlet", labels, 10, seed=0, alpha=0.01, min_size=9)


@FAST
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 6), st.data())
def test_shards_at_most_shards_per_client_labels(
    num_clients: int, spc: int, shard_size: int, data: st.DataObject
) -> None:
    # Prepare: class sizes are multiples of the shard size, so every shard holds one label
    shard_labels = data.draw(
        st.lists(st.integers(0, 9), min_size=num_clients * spc, max_size=num_clients * spc)
    )
    labels = np.repeat(shard_labels, shard_size)
    labels = labels[np.random.default_rng(0).permutation(len(labels))]
    parts = partition(
        "shards",
        labels,
        num_clients,
        seed=data.draw(st.integers(0, 2**32)),
        shards_per_client=spc,
        draws=data.draw(DRAWS),
    )
    for p in parts:
        assert len(p) == spc * shard_size
        assert len(np.unique(labels[p])) <= spc


def test_shards_mcmahan_mnist_setting() -> None:
    # McMahan et al.: 60k label-sorted samples, 200 shards of 300, 100 clients x 2 shards
    labels = np.repeat(np.arange(10), 6000)
    parts = partition("shards", labels, 100, seed=0)
    assert {len(p) for p in parts} == {600}
    assert max(len(np.unique(labels[p])) for p in parts) <= 2
    with pytest.raises(ConfigError, match="200 shards, more than the 100 samples"):
        partition("shards", labels[:100], 100, seed=0)


def test_domain_clients_see_one_domain_and_domains_are_not_split_when_few_clients() -> None:
    domains = np.repeat(["a", "b", "c"], [50, 30, 20])
    labels = np.arange(100) % 10
    many = partition("domain", labels, 7, seed=0, domains=domains)
    assert all(len(np.unique(domains[p])) == 1 for p in many)
    per_domain = {d: sum(1 for p in many if domains[p[0]] == d) for d in "abc"}
    assert sorted(per_domain.values()) == [2, 2, 3]  # round-robin over the 3 domains
    few = partition("domain", labels, 2, seed=0, domains=domains)
    for d in "abc":  # every domain whole on one client
        assert sum(1 for p in few if np.any(domains[p] == d)) == 1
    with pytest.raises(ConfigError, match="needs a domain key per sample, got domains=None"):
        partition("domain", labels, 2, seed=0)
    with pytest.raises(ConfigError, match="domains has shape"):
        partition("domain", labels, 2, seed=0, domains=domains[:10])
    with pytest.raises(ConfigError, match="has 20 samples for 21 clients"):
        partition("domain", labels, 63, seed=0, domains=domains)


def test_validation_messages() -> None:
    labels = np.arange(50) % 5
    with pytest.raises(UnknownNameError, match="unknown partitioner 'noniid'; expected one of"):
        partition("noniid", labels, 2, seed=0)
    with pytest.raises(
        ConfigError, match="has no parameter beta; valid parameters: alpha, balance, min_size"
    ):
        partition("dirichlet", labels, 2, seed=0, beta=1.0)
    with pytest.raises(ConfigError, match="valid parameters: \\(none\\)"):
        partition("iid", labels, 2, seed=0, alpha=1.0)
    with pytest.raises(ConfigError, match="alpha must be a finite number > 0, got 0"):
        partition("dirichlet", labels, 2, seed=0, alpha=0)
    with pytest.raises(ConfigError, match="alpha must be a finite number > 0, got True"):
        partition("dirichlet", labels, 2, seed=0, alpha=True)
    with pytest.raises(ConfigError, match="shards_per_client must be an integer >= 1, got 0"):
        partition("shards", labels, 2, seed=0, shards_per_client=0)
    with pytest.raises(ConfigError, match="balance must be true or false"):
        partition("dirichlet", labels, 2, seed=0, balance="yes")
    for bad in (0, 51, True, 2.0):
        with pytest.raises(
            ConfigError,
            match=r"num_clients must be an integer in \[1, 50\].*lower the number of clients \(clients.num\)",
        ):
            partition("iid", labels, bad, seed=0)  # type: ignore[arg-type]
    # the fix names the config keys a run sets (clients.num, partition.*), not the parameter names
    with pytest.raises(
        ConfigError, match=r"lower partition.min_size or the number of clients \(clients.num\)"
    ):
        partition("dirichlet", labels, 20, seed=0, alpha=1.0, min_size=3)
    with pytest.raises(
        ConfigError,
        match=r"clients.num \* shards_per_client = 20 \* 3.*partition.shards_per_client or clients.num",
    ):
        partition("shards", labels, 20, seed=0, shards_per_client=3)
    with pytest.raises(ConfigError, match="1-D integer array"):
        partition("iid", labels.reshape(5, 10), 2, seed=0)


def test_registry_exposes_defaults() -> None:
    assert partitioner_names() == ["dirichlet", "domain", "iid", "shards"]
    assert dict(PARTITIONERS["dirichlet"].params) == {"alpha": 0.5, "min_size": 10, "balance": True}
    assert dict(PARTITIONERS["shards"].params) == {"shards_per_client": 2}
    assert PARTITIONERS["domain"].needs_domains and not PARTITIONERS["iid"].needs_domains
    assert resolve_partition_params("dirichlet", {"alpha": 1}) == {
        "alpha": 1.0,
        "min_size": 10,
        "balance": True,
    }


def test_summary_is_json_and_adds_up() -> None:
    labels = np.arange(120) % 4
    parts = partition("dirichlet", labels, 6, seed=2, alpha=0.3, min_size=5)
    summary = partition_summary(parts, labels, 4)
    json.dumps(summary)
    assert summary["num_samples"] == 120 and summary["label_counts"] == [30] * 4
    assert [c["num_samples"] for c in summary["clients"]] == [len(p) for p in parts]
    assert summary["size_min"] >= 5
    with pytest.raises(ConfigError, match=r"labels must lie in \[0, 3\)"):
        partition_summary(parts, labels, 3)


@pytest.mark.parametrize(
    "owner, message",
    [
        (
            lambda n, c: None,
            r"returned NoneType of shape None; it must return an integer array of shape \(12,\)",
        ),
        (lambda n, c: np.full(n, 99), r"gave client ids 99..99; expected 0..2 \(clients.num=3\)"),
        (lambda n, c: np.full(n, -1), r"gave client ids -1..-1; expected 0..2"),
        (
            lambda n, c: np.zeros(n) + 0.5,
            r"returned ndarray of shape \(12,\); it must return an integer array",
        ),
    ],
)
def test_a_registered_partitioner_must_give_every_sample_a_client(owner, message) -> None:
    from fedge.data.partition import _REGISTRY, PartitionerSpec, register_partitioner

    register_partitioner(
        PartitionerSpec(
            "test-bad",
            "d",
            lambda labels, c, rng, domains=None: owner(len(labels), c),
            lambda p: dict(p),
            {},
        )
    )
    try:
        with pytest.raises(ConfigError, match=r"partitioner 'test-bad' " + message):
            partition("test-bad", np.arange(12) % 3, 3, seed=0)
    finally:
        _REGISTRY.unregister("test-bad")
    with pytest.raises(ConfigError, match=r"register_partitioner takes a PartitionerSpec"):
        register_partitioner("test-bad")  # type: ignore[arg-type]
