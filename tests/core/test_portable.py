"""Portable seeded draws (fedge.core.portable): the bits against Philox's definition and
Random123's known answers, the transforms against exact oracles and the normal distribution,
bit-identical results under every CPU capability (subprocesses) and on CUDA, and known answers."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedge
from fedge.core import portable as P

M64 = (1 << 64) - 1

# Random123 1.09 kat_vectors, philox4x64 10 rounds: (counter, key, output), 64-bit words
RANDOM123_KAT = [
    (
        (0, 0, 0, 0),
        (0, 0),
        (0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B, 0x7E68B68AEC7BA23B),
    ),
    (
        (M64,) * 4,
        (M64, M64),
        (0x87B092C3013FE90B, 0x438C3C67BE8D0224, 0x9CC7D7C69CD777B6, 0xA09CAEBF594F0BA0),
    ),
    (
        (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89),
        (0x452821E638D01377, 0xBE5466CF34E90C6C),
        (0xA528F45403E61D95, 0x38C72DBD566E9788, 0xA5A1610E72FD18B5, 0x57BD43B5E52B7FE6),
    ),
]

# Known answers of fedge's own draws (computed once, pinned: a change here changes every run).
KZ = P.stream_key(2026, "zo", "features.conv1.conv.weight")
KI = P.stream_key(2026, "fedpt-init", "conv1.weight")
KP = P.stream_key(2026, "partition")
KM = P.stream_key(2026, "ntk-mask", 0)
KAT = {
    "key": [0x8DA151559A3DC717, 0xE0851B5FB62A2762],
    "words": [
        3080271156,
        3114474085,
        1958871224,
        3285069156,
        4233679754,
        2369134291,
        2676953930,
        46348198,
    ],
    "normal": [
        "bf1311ce",
        "bf19236d",
        "3de1e5c0",
        "bf38d797",
        "c00c2595",
        "be04d618",
        "bea0d194",
        "40130c78",
    ],
    "rows": ["bba96f00", "3e306c60", "bee2e4a2", "3ecd0e8a"],
    "symmetric_uniform": ["be30bc5e", "3d1dfc77", "3e23ac11", "3dd02f4b", "3e2ed834", "bd23e037"],
    "uniform": ["3f118a45", "3dc57b90", "3ecc9714", "3e821d8e"],
    "permutation": [0, 2, 5, 8, 10, 9, 4, 11, 1, 7, 3, 6],
    "integers": [0, 6, 0, 9, 3, 2, 9, 8],
    "bernoulli": [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1],
    "signs": [1, 1, 1, -1, 1, -1, -1, 1, 1, -1, 1, 1, 1, 1, -1, 1],
}


def _hex(t: torch.Tensor) -> list[str]:
    return [f"{v:08x}" for v in t.cpu().numpy().reshape(-1).view(np.uint32).tolist()]


def known_answers() -> dict[str, object]:
    """The draws KAT pins, computed now (also run in the subprocesses below)."""
    return {
        "key": list(KZ),
        "words": P.words(KZ, 8).tolist(),
        "normal": _hex(P.normal(KZ, (8,))),
        "rows": _hex(P.normal_rows(KZ, [3], (10,))[0, :4]),
        "symmetric_uniform": _hex(P.symmetric_uniform(KI, (6,), 1 / math.sqrt(25))),
        "uniform": _hex(P.uniform(KI, (4,))),
        "permutation": P.permutation(KP, 12).tolist(),
        "integers": P.integers(KP, (8,), 10).tolist(),
        "bernoulli": P.bernoulli(KM, (16,), 0.25).int().tolist(),
        "signs": P.signs(KM, (16,)).int().tolist(),
    }


def bundle_digest() -> str:
    """sha256 of a larger set of draws through every path, the torch transform included."""
    k = P.stream_key(1, "bundle")
    w = P.words(k, 1 << 16)
    parts = [
        P.normal(k, (1 << 16,)),
        P.normal_from_words(torch.from_numpy(w.view(np.int32))),  # the torch (device) path
        P.normal_rows(k, [0, 1, 5, 6, 7], (3, 7)),
        *P.normal_many([(k, (5,), 3), (P.stream_key(2, "bundle"), (9,), 100)]),
        P.uniform(k, (999,), low=-2.0, high=3.0),
        P.uniform(k, (999,), low=-2.0, high=3.0, dtype=torch.float64),
        P.symmetric_uniform(k, (999,), 0.125),
        P.integers(k, (999,), 1000).to(torch.float64),
        P.permutation(k, 999).to(torch.float64),
        P.signs(k, (999,), offset=7),
        P.bernoulli(k, (999,), 0.3).to(torch.float32),
    ]
    h = hashlib.sha256()
    for t in parts:
        h.update(t.numpy().tobytes())
    return h.hexdigest()


BUNDLE_SHA256 = "dcfb1a279745cef78987d5a75b4c9c58047f7773ac5ff99bf60344067f94efa7"


# --- the bits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("counter", "key", "expected"), RANDOM123_KAT)
def test_philox_block_matches_random123(counter, key, expected) -> None:
    assert P.philox4x64_10(counter, key) == expected


def _blocks_as_words(key: P.Key, blocks: list[int]) -> list[int]:
    out = []
    for b in blocks:
        for v in P.philox4x64_10([(b >> (64 * i)) & M64 for i in range(4)], key):
            out += [v & 0xFFFFFFFF, v >> 32]
    return out


@pytest.mark.parametrize("block", [0, 1, 5, (1 << 64) - 1, 1 << 64, 3 << 130])
def test_words_are_philox_blocks_low_half_first(block: int) -> None:
    # the counter is the block number across all four words (carries included)
    got = P.words(KZ, 16, offset=8 * block).tolist()
    assert got == _blocks_as_words(KZ, [block, block + 1])


def test_a_numpy_whose_philox_differs_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    P._check_numpy_philox()  # this numpy passes
    monkeypatch.setattr(P, "philox4x64_10", lambda counter, key: (0, 0, 0, 0))
    with pytest.raises(RuntimeError, match="does not compute Philox4x64-10"):
        P._check_numpy_philox()


def test_any_slice_equals_the_stream_in_any_order() -> None:
    full = P.words(KP, 5000)
    rng = np.random.default_rng(0)
    for _ in range(200):  # random access
        o, n = int(rng.integers(0, 4900)), int(rng.integers(0, 100))
        assert np.array_equal(P.words(KP, n, offset=o), full[o : o + n])
    seq = np.concatenate([P.words(KP, 13, offset=13 * i) for i in range(300)])  # sequential
    assert np.array_equal(seq, full[: 13 * 300])
    big = P.words(KP, 100_000)  # several chunks
    assert np.array_equal(big[:5000], full)
    assert np.array_equal(P.words(KP, 70_001, offset=29_999), big[29_999:])


def test_stream_key_is_canonical() -> None:
    assert P.stream_key(0, "zo", 1) != P.stream_key(0, "zo", "1")
    assert P.stream_key(0, "ab", "c") != P.stream_key(0, "a", "bc")
    assert P.stream_key(np.int64(3), "x") == P.stream_key(3, "x")
    assert P.stream_key(-1) != P.stream_key(1)
    with pytest.raises(TypeError, match="ints and strs"):
        P.stream_key(True, "x")
    with pytest.raises(TypeError, match="ints and strs"):
        P.stream_key(0, 1.5)


# --- the normal table and transform -------------------------------------------------------------


def test_table_is_pinned_and_matches_the_quantile_at_build_precision() -> None:
    from scipy.special import ndtri

    raw = (Path(P.__file__).parent / "portable_normal.f32").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == P.NORMAL_TABLE_SHA256
    shipped = np.frombuffer(raw, dtype="<f4").reshape(2, 32, 128).astype(np.float64)
    built = P.build_normal_table()
    assert np.array_equal(shipped, built.astype(np.float32).astype(np.float64))
    # an independent oracle (scipy's ndtri) at every cell's ends: A + D·L = Q(L / 2^31)
    e, i = np.meshgrid(np.arange(31), np.arange(128), indexing="ij")
    lo = 2.0**e * (1 + i / 128)
    q = -ndtri(lo / 2**32)
    assert np.abs(shipped[0, :31] + shipped[1, :31] * lo - q).max() < 2e-6


def test_normal_cdf_error_and_tail_as_documented() -> None:
    from scipy.special import erfc

    # every cell at 17 points, and 2^18 random words: |F − Φ| from the map |V| -> z
    e, i, t = np.meshgrid(np.arange(31), np.arange(128), np.arange(17) / 16, indexing="ij")
    v = np.floor(2.0**e * (1 + (i + t) / 128)).astype(np.int64).ravel() | 1
    v = np.concatenate(
        [np.clip(v, 1, 2**31 - 1), np.random.default_rng(0).integers(0, 2**31, 1 << 18) | 1]
    )
    z = P.normal_from_words(v.astype(np.uint32)).double().numpy()
    err = np.abs(v / 2**31 - erfc(z / math.sqrt(2))) / 2 + 2.0**-31  # + the discretization
    assert err.max() < 1.1e-6
    assert err.max() > 5e-7  # the documented figure is the real one, not a loose bound
    assert P.normal_from_words(np.array([0, 1], np.uint32)).tolist() == [P.NORMAL_TAIL] * 2
    assert P.normal_from_words(np.array([2**31 - 1], np.uint32)).item() == 0.0


def test_normal_is_exactly_symmetric() -> None:
    w = P.words(KZ, 1 << 16)
    v = (w | 1).view(np.int32)
    mirrored = (-v).view(np.uint32)  # the word whose V is −V
    a, b = P.normal_from_words(w), P.normal_from_words(mirrored)
    assert torch.equal(a, -b)


def test_normal_moments_and_ks() -> None:
    from scipy import stats

    z = P.normal(P.stream_key(3, "moments"), (1 << 20,)).double()
    n = z.numel()
    assert abs(z.mean().item()) < 5 / math.sqrt(n)
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / n)
    assert abs(stats.skew(z.numpy())) < 5 * math.sqrt(6 / n)
    assert abs(stats.kurtosis(z.numpy())) < 5 * math.sqrt(24 / n)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    assert z.abs().max().item() <= P.NORMAL_TAIL


def test_torch_transform_equals_numpy_bit_for_bit() -> None:
    w = P.words(KZ, 100_003)
    assert torch.equal(
        P.normal_from_words(torch.from_numpy(w.view(np.int32))), P.normal_from_words(w)
    )


def test_numpy_transform_equals_a_scalar_oracle_on_edge_words() -> None:
    # every cell edge of the table (and its neighbours), the int32 extremes and random words,
    # past one scratch chunk: the vectorised transform (reused scratch, out as scratch) against
    # V = fl32(int32(w | 1)), j from V's bits, fl(A[j] + fl(V · D[j])) one float32 at a time
    edges = [
        2**e + i * 2 ** max(e - 7, 0) + d for e in range(31) for i in range(128) for d in (-1, 0, 1)
    ]
    ints = np.array(edges + [-x for x in edges] + [0, 1, 2**31 - 1, -(2**31), -1], dtype=np.int64)
    rng = np.random.default_rng(0)
    w = np.concatenate([ints % 2**32, rng.integers(0, 2**32, P._CHUNK + 5000)]).astype(np.uint32)
    kept = w.copy()
    z = P.normal_from_words(w).numpy()
    assert np.array_equal(w, kept)  # the words are not written
    v = (w.view(np.int32) | 1).astype(np.float32)
    j = (v.view(np.uint32) >> 16).astype(np.int64)
    want = [np.float32(P._TABLE_A[i]) + np.float32(x * P._TABLE_D[i]) for x, i in zip(v, j)]
    assert np.array_equal(z.view(np.uint32), np.array(want, dtype=np.float32).view(np.uint32))


def test_normal_offsets_and_rows() -> None:
    full = P.normal(KZ, (4000,))
    assert torch.equal(P.normal(KZ, (5, 7), offset=123), full[123:158].view(5, 7))
    for shape in [(16,), (10,), (3, 7), (2, 2, 2)]:
        n = math.prod(shape)
        stride = -(-n // 8) * 8
        rows = [4, 0, 1, 2, 9]
        got = P.normal_rows(KZ, rows, shape)
        want = torch.stack([full[r * stride : r * stride + n].view(shape) for r in rows])
        assert torch.equal(got, want)
        for r in [*rows, 3, 4, 5, 5, 0]:  # one row a call (the lean client's): any order
            assert torch.equal(
                P.normal_rows(KZ, [r], shape)[0],
                want[rows.index(r)] if r in rows else full[r * stride : r * stride + n].view(shape),
            )


def test_normal_many_equals_one_by_one() -> None:
    draws = [(KZ, (16, 1, 5, 5), 0), (KI, (10,), 3), (KZ, (0,), 5), (KP, (3, 7), 1000)]
    got = P.normal_many(draws)
    assert [tuple(z.shape) for z in got] == [(16, 1, 5, 5), (10,), (0,), (3, 7)]
    for z, (key, shape, offset) in zip(got, draws):
        assert torch.equal(z, P.normal(key, shape, offset=offset))
    assert P.normal_many([]) == []


def test_normal_row_many_equals_normal_rows_one_by_one() -> None:
    rows = [(KZ, 3, (16, 1, 5, 5)), (KI, 0, (10,)), (KZ, 7, (0,)), (KP, 5, (3, 7)), (KZ, 3, (6,))]
    got = P.normal_row_many(rows)
    for z, (key, r, shape) in zip(got, rows):
        assert torch.equal(z, P.normal_rows(key, [r], shape)[0])
        assert P.row_stride(shape) == -(-math.prod(shape) // 8) * 8
    with pytest.raises(ValueError, match="non-negative"):
        P.normal_row_many([(KZ, -1, (3,))])


# --- the other draws ------------------------------------------------------------------------------


def test_uniforms_are_exact_grids() -> None:
    w = P.words(KI, 4096)
    u = P.uniform(KI, (4096,)).double().numpy()
    assert np.array_equal(u, (w >> 8) / 2**24)
    c = P.symmetric_uniform(KI, (4096,), 1.0).double().numpy()
    assert np.array_equal(c, (((w.view(np.int32) >> 7) | 1) / 2**24))
    b = np.float32(1 / math.sqrt(25))
    s = P.symmetric_uniform(KI, (4096,), float(b)).numpy()
    assert np.array_equal(s, c.astype(np.float32) * b) and np.abs(s).max() < b and (s != 0).all()
    shifted = P.uniform(KI, (4096,), low=-2.0, high=3.0).numpy()
    assert np.array_equal(shifted, u.astype(np.float32) * np.float32(5.0) + np.float32(-2.0))
    assert abs(P.uniform(KP, (1 << 16,)).mean().item() - 0.5) < 0.01
    w2 = P.words(KI, 2 * 999).astype(object)  # float64: 53 bits of two words, exactly
    want = [((w2[2 * i] + (w2[2 * i + 1] << 32)) >> 11) / 2**53 for i in range(999)]
    u64 = P.uniform(KI, (999,), dtype=torch.float64)
    assert u64.dtype == torch.float64 and u64.tolist() == want
    assert torch.equal(P.uniform(KI, (9,), dtype=torch.float64, offset=990), u64[990:])


def test_integers_permutation_signs_bernoulli() -> None:
    from scipy import stats

    for high in (1, 2, 10, 2**32):
        r = P.integers(KP, (4096,), high)
        assert r.dtype == torch.int64 and int(r.min()) >= 0 and int(r.max()) < high
    w = P.words(KP, 2).astype(object)  # the exact formula, in Python integers
    assert P.integers(KP, (1,), 12345).item() == ((w[0] + (w[1] << 32)) * 12345) >> 64
    counts = np.bincount(P.integers(KP, (60_000,), 6).numpy(), minlength=6)
    assert stats.chisquare(counts).pvalue > 1e-3
    perm = P.permutation(KP, 1000)
    assert sorted(perm.tolist()) == list(range(1000))
    first = np.bincount([P.permutation(P.stream_key(0, "p", i), 4)[0].item() for i in range(2000)])
    assert stats.chisquare(first).pvalue > 1e-3
    s = P.signs(KM, (70,), offset=5)
    assert torch.equal(s, P.signs(KM, (75,))[5:]) and set(s.tolist()) == {-1.0, 1.0}
    bits = np.unpackbits(P.words(KM, 1).astype("<u4").view(np.uint8), bitorder="little")
    assert P.signs(KM, (32,)).tolist() == (1 - 2 * bits.astype(float)).tolist()
    assert not P.bernoulli(KM, (1000,), 0.0).any() and P.bernoulli(KM, (1000,), 1.0).all()
    assert abs(P.bernoulli(KM, (1 << 16,), 0.3).float().mean().item() - 0.3) < 0.01


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="offset >= 0"):
        P.normal(KZ, (3,), offset=-1)
    with pytest.raises(ValueError, match=r"high must be in \[1, 2\^32\]"):
        P.integers(KP, (3,), 0)
    with pytest.raises(ValueError, match="float32 or float64"):
        P.uniform(KI, (3,), dtype=torch.float16)
    with pytest.raises(ValueError, match="probability"):
        P.bernoulli(KM, (3,), 1.5)
    with pytest.raises(ValueError, match="non-negative"):
        P.normal_rows(KZ, [-1], (3,))


# --- the same bits everywhere ---------------------------------------------------------------------


def test_known_answers() -> None:
    assert known_answers() == KAT
    assert bundle_digest() == BUNDLE_SHA256


def test_flush_to_zero_changes_nothing() -> None:
    # no subnormal appears in any transform, so a process that flushes them draws the same
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        assert bundle_digest() == BUNDLE_SHA256
    finally:
        torch.set_flush_denormal(False)


def _capabilities() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    caps = ["default"]
    caps += ["avx2"] if " avx2" in flags else []
    caps += ["avx512"] if " avx512f" in flags else []
    return caps


_PROBE = """
import json, torch, sys
sys.path.insert(0, {tests!r})
from core.test_portable import bundle_digest, known_answers
print(json.dumps({{"capability": torch.backends.cpu.get_cpu_capability(),
                   "digest": bundle_digest(), "kat": known_answers()}}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ATEN_CPU_CAPABILITY probing reads /proc")
def test_bit_identical_under_every_cpu_capability() -> None:
    src = str(Path(fedge.__file__).resolve().parents[1])
    tests = str(Path(__file__).resolve().parents[1])
    runs = {}
    for cap in _capabilities():  # in parallel: each is mostly importing torch
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
        if cap == "default":  # numpy's baseline kernels too (no AVX2/AVX-512 dispatch)
            env["NPY_DISABLE_CPU_FEATURES"] = "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"
        runs[cap] = subprocess.Popen(
            [sys.executable, "-c", _PROBE.format(tests=tests)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    seen = {}
    for cap, run in runs.items():
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        seen[cap] = json.loads(out.strip().splitlines()[-1])
        assert seen[cap]["capability"].lower() == cap
    for cap, got in seen.items():
        assert got["kat"] == KAT, cap
        assert got["digest"] == BUNDLE_SHA256, cap


@pytest.mark.needs_cuda
def test_cuda_draws_equal_cpu_bit_for_bit() -> None:
    k = P.stream_key(5, "cuda")
    for shape, offset in [((1 << 20,), 0), ((64, 16, 5, 5), 77)]:
        gpu = P.normal(k, shape, offset=offset, device="cuda")
        assert gpu.device.type == "cuda"
        assert torch.equal(gpu.cpu(), P.normal(k, shape, offset=offset))
    assert torch.equal(
        P.normal_rows(k, [0, 3, 4], (10,), device="cuda").cpu(), P.normal_rows(k, [0, 3, 4], (10,))
    )
    draws = [(k, (10,), 3), (P.stream_key(6, "cuda"), (64, 16, 5, 5), 0)]
    for gpu, cpu in zip(P.normal_many(draws, device="cuda"), P.normal_many(draws)):
        assert torch.equal(gpu.cpu(), cpu)
    assert torch.equal(P.uniform(k, (999,), device="cuda").cpu(), P.uniform(k, (999,)))
