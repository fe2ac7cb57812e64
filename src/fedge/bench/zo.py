"""Zeroth-order step time: fedge's estimate against one backprop step and the reference loop.

BAFFLE (seed 000, Sec. 4.4) prices a zeroth-order (ZO) step at K forward passes against one
backprop (BP) step, "approximately K/5 times the computation expense of BP". This benchmark
measures, per model and difference scheme, the wall time of

- **ZO step** (``zo_step_s``, fast mode; ``zo_lean_step_s``, lean mode): the whole computation of
  one estimate, client and server, i.e. :func:`~fedge.estimators.loss_differences` then
  :func:`~fedge.estimators.estimate_gradient` on the same seed;
- **BP step** (``bp_step_s``): forward, backward and a plain SGD step (no momentum) on the same
  batch;
- **reference loop** (``reference_loop_step_s``): the same estimate computed the way the BAFFLE
  reference code does (:func:`reference_gradient`): for each k, a fresh ``torch.randn`` per
  parameter, ``W += σz`` in place, a forward (central: ``W -= 2σz``, a forward), restore, and
  ``g += ΔL·z`` per parameter;
- the machine's float32 matmul peak (``torch.mm`` of two 2048×2048 matrices) at the same thread
  count, to read the forwards' achieved GFLOP/s against.

Timing protocol (shared machines are noisy): every variant is warmed up once (ZO variants with a
small K), then the repetitions are interleaved (one of each variant per round) and the minimum
is reported. By default the process keeps freed heap memory instead of returning it to the OS
(glibc ``mallopt``, :func:`retain_freed_memory`): returning and re-faulting the pages of large
activations on every forward costs up to 2x forward time here. It applies to every variant
alike; :func:`run_zo` also times every variant at a small K in two fresh processes, with and
without it, and reports both (``allocator``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedge.estimators import estimate_gradient, forward_budget, loss_differences
from fedge.estimators.batched import BatchedEvaluator
from fedge.estimators.perturbation import select
from fedge.models import build_model
from fedge.core.meter import FlopCounter

__all__ = [
    "BENCH_MODELS",
    "bench_model",
    "fast_path",
    "matmul_peak_gflops",
    "reference_gradient",
    "retain_freed_memory",
    "run_zo",
    "zo_markdown",
]

# The BAFFLE models (Sec. 4.1, 3.3): input shape, Hardswish, GroupNorm.
BENCH_MODELS: dict[str, tuple[int, int, int]] = {"lenet": (1, 28, 28), "wrn-10-2": (3, 32, 32)}
SIGMA = 1e-4  # BAFFLE's σ
# Targets of the BAFFLE issue: ZO step ≤ factor · K BP steps; fast ≥ 2x the reference loop.
ZO_OVER_BP_TARGET: dict[str, float] = {"lenet": 0.35, "wrn-10-2": 0.75}
SPEEDUP_TARGET = 2.0
_WARMUP_K = 2
# glibc mallopt parameters (malloc.h): M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_MAX_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def retain_freed_memory() -> bool:
    """Make glibc keep freed heap memory for reuse instead of returning it to the OS.

    Raises the mmap threshold to its maximum (32 MiB: smaller blocks come from the heap, not from
    fresh mmaps) and disables trimming of the heap top. A process-wide setting that cannot be
    undone; True if glibc accepted both, False elsewhere (musl, macOS).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX_THRESHOLD) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    return ok_mmap and ok_trim


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of ``torch.mm`` on two ``n × n`` float32 matrices (best of ``repeats``)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def reference_gradient(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    batch: tuple[Tensor, Tensor],
    *,
    k: int,
    sigma: float,
    scheme: str,
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """BAFFLE Eq. (6) computed as the reference code does: in-place perturbation, K loops.

    For each k: ``z ~ N(0, I)`` drawn per parameter from ``generator``, ``W += σz`` in place,
    ``L+`` from a forward; central: ``W -= 2σz``, ``L-`` from a forward, ``W += σz``; forward
    scheme: ``W -= σz`` and ``L-`` is the one baseline loss ``L(W)``; then ``g += ΔL·z``.
    Returns ``g / (c·K·σ)`` (c = 2 central, 1 forward). The weights are restored by the
    inverse additions, so they drift by rounding, a few ulps per k (fedge's modes never write
    them).
    """
    if scheme not in ("central", "forward"):
        raise ValueError(f"scheme must be 'central' or 'forward', got {scheme!r}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = [torch.zeros_like(p) for _, p in named]
    x, y = batch
    with torch.no_grad():
        base = float(loss_fn(model(x), y)) if scheme == "forward" else 0.0
        for _ in range(k):
            zs = [torch.randn(p.shape, generator=generator) for _, p in named]
            for (_, p), z in zip(named, zs):
                p.add_(z, alpha=sigma)
            plus = float(loss_fn(model(x), y))
            if scheme == "central":
                for (_, p), z in zip(named, zs):
                    p.sub_(z, alpha=2 * sigma)
                minus = float(loss_fn(model(x), y))
                for (_, p), z in zip(named, zs):
                    p.add_(z, alpha=sigma)
            else:
                minus = base
                for (_, p), z in zip(named, zs):
                    p.sub_(z, alpha=sigma)
            for g, z in zip(grads, zs):
                g.add_(z, alpha=plus - minus)
    c = 2.0 if scheme == "central" else 1.0
    return {n: g.div_(c * k * sigma) for (n, _), g in zip(named, grads)}


def _zo_step(model: nn.Module, batch: tuple[Tensor, Tensor], *, k: int, scheme: str, mode: str,
             seed: int) -> dict[str, Tensor]:  # fmt: skip
    """One whole estimate: the client's loss differences, then the server's ĝ."""
    diffs = loss_differences(model, F.cross_entropy, batch, k=k, sigma=SIGMA, seed=seed,
                             scheme=scheme, mode=mode)  # type: ignore[arg-type]  # fmt: skip
    return estimate_gradient(dict(model.named_parameters()), diffs, sigma=SIGMA, seed=seed,
                             scheme=scheme)  # type: ignore[arg-type]  # fmt: skip


def _bp_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[Tensor, Tensor]) -> None:
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    opt.step()


def bench_model(name: str, batch: int, seed: int = 0) -> tuple[nn.Module, tuple[Tensor, Tensor]]:
    """A BAFFLE model of :data:`BENCH_MODELS` (Hardswish, GroupNorm) and a seeded batch ``(x, y)``."""
    shape = BENCH_MODELS[name]
    model = build_model(name, input_shape=shape, num_classes=10, activation="hardswish",
                        norm="group", seed=seed)  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *shape, generator=g)  # (B, C, H, W)
    y = torch.randint(0, 10, (batch,), generator=g)
    return model, (x, y)


def fast_path(model: nn.Module, batch: tuple[Tensor, Tensor]) -> str:
    """What fast mode runs for ``model`` on ``batch``: ``"batched"``, ``"lean-fallback"`` (a
    model it cannot batch) or ``"lean-large-batch"`` (batching is slower at this batch size),
    the last two suffixed ``" in N threads"`` when the perturbations are split over N threads."""
    from fedge.estimators.zeroth_order import _MAX_BATCHED_BATCH

    ev = BatchedEvaluator.build(model, select(model), 0, batch[0], F.cross_entropy, batch[1])
    if ev is not None and batch[0].shape[0] <= _MAX_BATCHED_BATCH:
        return "batched"
    path = "lean-fallback" if ev is None else "lean-large-batch"
    spans = torch.get_num_threads()
    return path if spans == 1 else f"{path} in {spans} threads"


def _forward_flops(model: nn.Module, x: Tensor) -> int:
    counter = FlopCounter()
    with torch.no_grad(), counter:
        model(x)
    return counter.flops


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _allocator_probe(models: Sequence[str], *, k: int, batch: int, threads: int,
                     repeats: int) -> dict[str, Any]:  # fmt: skip
    """Central-scheme rows at a small ``k`` in two fresh processes: glibc's default vs retained."""
    out: dict[str, Any] = {}
    for retain in (False, True):
        code = (
            "import json, torch; from fedge.bench import zo\n"
            f"applied = zo.retain_freed_memory() if {retain} else False\n"
            f"torch.set_num_threads({threads})\n"
            f"peak = zo.matmul_peak_gflops()\n"
            f"rows = [r for m in {list(models)!r} for r in zo._bench_model("
            f"m, schemes=('central',), k={k}, batch={batch}, repeats={repeats}, peak=peak)]\n"
            "print(json.dumps({'applied': applied, 'rows': rows}))"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"allocator probe failed:\n{proc.stderr[-2000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        key = "retained" if retain else "glibc_default"
        for r in got["rows"]:
            out.setdefault(r["model"], {})[key] = {
                f: r[f] for f in ("forward_s", "bp_step_s", "zo_step_s", "zo_lean_step_s",
                                  "reference_loop_step_s", "matmul_peak_gflops")
            }  # fmt: skip
    return {"k": k, "scheme": "central", "batch": batch, "models": out}


def _bench_model(name: str, *, schemes: Sequence[str], k: int, batch: int, repeats: int,
                 peak: float) -> list[dict[str, Any]]:  # fmt: skip
    """Rows (one per scheme) for one model; every variant timed in interleaved repetitions."""
    model, data = bench_model(name, batch)
    bp_model, _ = bench_model(name, batch)  # BP updates its weights: keep them apart from the ZO model
    opt = torch.optim.SGD(bp_model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def forward() -> None:
        with torch.no_grad():
            model(data[0])

    def zo(scheme: str, mode: str, kk: int) -> Callable[[], object]:
        return lambda: _zo_step(model, data, k=kk, scheme=scheme, mode=mode, seed=7)

    def ref(scheme: str, kk: int) -> Callable[[], object]:
        return lambda: reference_gradient(model, F.cross_entropy, data, k=kk, sigma=SIGMA,
                                          scheme=scheme, generator=gen)  # fmt: skip

    # name -> (warm-up, timed): the ZO variants warm up at a small K (first-call costs only).
    variants: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "forward": (forward, forward),
        "bp": (lambda: _bp_step(bp_model, opt, data),) * 2,  # type: ignore[dict-item]
    }
    for s in schemes:
        variants[f"{s}/fast"] = (zo(s, "fast", _WARMUP_K), zo(s, "fast", k))
        variants[f"{s}/lean"] = (zo(s, "lean", _WARMUP_K), zo(s, "lean", k))
        variants[f"{s}/reference"] = (ref(s, _WARMUP_K), ref(s, k))
    for warm, _ in variants.values():
        warm()
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeats):
        for key, (_, timed) in variants.items():
            best[key] = min(best[key], _time(timed))

    fwd_flops = _forward_flops(model, data[0])
    bp, fwd_s = best["bp"], best["forward"]
    target = ZO_OVER_BP_TARGET.get(name)
    rows = []
    for s in schemes:
        fast, lean, reference = best[f"{s}/fast"], best[f"{s}/lean"], best[f"{s}/reference"]
        forwards = forward_budget(k, s)  # type: ignore[arg-type]
        rows.append(
            {
                "model": name,
                "scheme": s,
                "k": k,
                "batch": batch,
                "params": sum(p.numel() for p in model.parameters()),
                "fast_path": fast_path(model, data),
                "zo_step_s": fast,
                "zo_lean_step_s": lean,
                "bp_step_s": bp,
                "reference_loop_step_s": reference,
                "forward_s": fwd_s,
                "forwards_per_step": forwards,
                "matmul_peak_gflops": peak,
                "forward_gflops": fwd_flops / 1e9,
                "forward_achieved_gflops": fwd_flops / fwd_s / 1e9,
                "zo_achieved_gflops": forwards * fwd_flops / fast / 1e9,
                "zo_lean_achieved_gflops": forwards * fwd_flops / lean / 1e9,
                "bp_over_forward": bp / fwd_s,
                "zo_over_bp_per_k": fast / (k * bp),
                "zo_lean_over_bp_per_k": lean / (k * bp),
                # What K·BP / forwards-at-plain-forward-speed allows: no estimate that runs
                # `forwards` plain forwards can do better than these.
                "zo_over_bp_per_k_floor": forwards * fwd_s / (k * bp),
                "speedup_vs_reference": reference / fast,
                "zo_lean_speedup_vs_reference": reference / lean,
                "speedup_vs_reference_ceiling": reference / (forwards * fwd_s),
                "target_zo_over_bp_per_k": target,
                "meets_zo_over_bp": None if target is None else fast / (k * bp) <= target,
                "zo_lean_meets_zo_over_bp": None if target is None else lean / (k * bp) <= target,
                "meets_speedup_vs_reference": reference / fast >= SPEEDUP_TARGET,
            }
        )
    return rows


def run_zo(
    models: Sequence[str] = ("lenet", "wrn-10-2"),
    *,
    k: int = 100,
    batch: int = 64,
    repeats: int = 3,
    threads: int = 1,
    schemes: Sequence[str] = ("central", "forward"),
    retain_memory: bool = True,
    probe_k: int | None = 8,
) -> dict[str, Any]:
    """Time ZO steps (fast, lean), a BP step and the reference loop; see the module docstring.

    Args:
        models: names from :data:`BENCH_MODELS`.
        k: loss differences per estimate (K).
        batch: samples per step.
        repeats: interleaved timed repetitions (the minimum is reported).
        threads: torch intra-op threads for every measurement (set for the process).
        schemes: ``"central"`` and/or ``"forward"``.
        retain_memory: apply :func:`retain_freed_memory` first (process-wide, not undone).
        probe_k: also time every variant (central, this K) in two fresh processes, with
            glibc's default allocator and with retained memory; None skips it.
    """
    unknown = [m for m in models if m not in BENCH_MODELS]
    if not models or unknown:
        raise ValueError(f"unknown model(s) {unknown or models}; choose from {sorted(BENCH_MODELS)}")
    bad = [s for s in schemes if s not in ("central", "forward")]
    if not schemes or bad:
        raise ValueError(f"unknown scheme(s) {bad or schemes}; choose from ['central', 'forward']")
    if min(k, batch, repeats, threads, probe_k or 1) < 1:
        raise ValueError(
            f"k, batch, repeats, threads and probe_k must be >= 1, got {k}, {batch}, {repeats}, "
            f"{threads}, {probe_k}"
        )
    retained = retain_freed_memory() if retain_memory else False
    torch.set_num_threads(threads)  # left set, like the engine benchmark: the docs line reports it
    peak = matmul_peak_gflops()
    rows = [r for m in models
            for r in _bench_model(m, schemes=schemes, k=k, batch=batch, repeats=repeats, peak=peak)]  # fmt: skip
    probe = None
    if probe_k is not None:
        probe = _allocator_probe(models, k=probe_k, batch=batch, threads=threads, repeats=repeats)
    return {
        "benchmark": "zo-step",
        "threads": threads,
        "sigma": SIGMA,
        "repeats": repeats,
        "timing": "minimum over interleaved repetitions, after one warm-up of each variant",
        "malloc_retained": retained,
        "bp_optimizer": "plain SGD (no momentum), lr 1e-3",
        "matmul_peak_gflops": peak,
        "results": rows,
        "allocator": probe,
    }


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("pass" if ok else "FAIL")


def zo_markdown(report: dict[str, Any], command: str) -> str:
    """The docs/benchmarks.md section for :func:`run_zo`."""
    rows = [
        "| model | scheme | K | batch | fast path | ZO fast s | ZO lean s | BP step | reference s "
        "| fast/(K·BP) | lean/(K·BP) | floor | fast vs ref | lean vs ref | ceiling "
        "| GFLOP/s ZO fast, lean (1 fwd) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        target = r["target_zo_over_bp_per_k"]
        rows.append(
            f"| {r['model']} | {r['scheme']} | {r['k']} | {r['batch']} | {r['fast_path']} "
            f"| {r['zo_step_s']:.3f} | {r['zo_lean_step_s']:.3f} | {r['bp_step_s'] * 1e3:.1f} ms "
            f"| {r['reference_loop_step_s']:.3f} "
            f"| {r['zo_over_bp_per_k']:.3f} ≤ {target}: {_mark(r['meets_zo_over_bp'])} "
            f"| {r['zo_lean_over_bp_per_k']:.3f} ≤ {target}: {_mark(r['zo_lean_meets_zo_over_bp'])} "
            f"| {r['zo_over_bp_per_k_floor']:.3f} "
            f"| {r['speedup_vs_reference']:.2f}x ≥ 2: {_mark(r['meets_speedup_vs_reference'])} "
            f"| {r['zo_lean_speedup_vs_reference']:.2f}x | {r['speedup_vs_reference_ceiling']:.2f}x "
            f"| {r['zo_achieved_gflops']:.0f}, {r['zo_lean_achieved_gflops']:.0f} "
            f"({r['forward_achieved_gflops']:.0f}) |"
        )
    lines = [
        "Time of one zeroth-order step (client `loss_differences` + server `estimate_gradient`: one",
        "whole estimate) in fast and lean mode, against one backprop step (forward, backward, plain",
        "SGD step without momentum, same batch) and against the BAFFLE reference code's loop (per k:",
        "fresh `torch.randn` per parameter, in-place `W += σz`, forward(s), restore, `g += ΔL·z`).",
        "Models as BAFFLE runs them: Hardswish and GroupNorm; LeNet on 1×28×28, WRN-10-2 on",
        "3×32×32; σ = 1e-4. Targets (issue): ZO step ≤ 0.35·K BP steps",
        "(LeNet), ≤ 0.75·K (WRN-10-2); fast ≥ 2x the reference loop. *floor* = forwards × (one",
        "plain forward) / (K·BP) and *ceiling* = reference / (forwards × one plain forward): the",
        "best any estimate running that many plain forwards could reach. *lean-fallback*: the",
        "batched path cannot run the model (WRN-10-2's residual units are not a Sequential chain),",
        "so fast mode runs the lean loop. *lean-large-batch*: above 8 samples batching is slower",
        "than one plain forward per perturbation, so fast mode runs the lean loop. *in N threads*:",
        "fast mode splits the K perturbations into N spans, one thread each (one intra-op thread",
        "per span), where lean, BP and the reference loop use N intra-op threads.",
        "",
        f"{report['threads']} torch thread(s); float32 matmul peak (2048² `torch.mm`, same threads): "
        f"{report['matmul_peak_gflops']:.1f} GFLOP/s. {report['timing'].capitalize()}; "
        f"{report['repeats']} repetitions. glibc told to retain freed memory (`mallopt`, see below): "
        f"{'yes' if report['malloc_retained'] else 'no'}, for every variant alike.",
        "",
        f"Command: `{command}`",
        "",
        *rows,
    ]
    probe = report.get("allocator")
    if probe:
        lines += [
            "",
            f"Allocator effect: every variant at K = {probe['k']} ({probe['scheme']}, batch "
            f"{probe['batch']}) in a fresh process with glibc's default allocator vs one that "
            "retains freed memory (`mallopt` M_MMAP_THRESHOLD = 32 MiB, M_TRIM_THRESHOLD = max):",
            "",
            "| model | allocator | forward | BP step | ZO fast | ZO lean | reference | fast vs ref |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m, by in probe["models"].items():
            for setting in ("glibc_default", "retained"):
                t = by[setting]
                lines.append(
                    f"| {m} | {setting.replace('_', ' ')} | {t['forward_s'] * 1e3:.1f} ms "
                    f"| {t['bp_step_s'] * 1e3:.1f} ms | {t['zo_step_s'] * 1e3:.0f} ms "
                    f"| {t['zo_lean_step_s'] * 1e3:.0f} ms | {t['reference_loop_step_s'] * 1e3:.0f} ms "
                    f"| {t['reference_loop_step_s'] / t['zo_step_s']:.2f}x |"
                )
    return "\n".join(lines)
