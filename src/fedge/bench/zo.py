"""Zeroth-order step time (BAFFLE, seed 000, Sec. 4.4) against its floor (the plain forwards), the
hardware bound, backprop and the reference loop. Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedge.bench.machine import (
    busy_warnings,
    load_probe,
    matmul_peak_gflops,
    one_thread_peak,
    retain_freed_memory,
)
from fedge.bench.measured import Section
from fedge.bench.reference import reference_gradient
from fedge.core.meter import FlopCounter
from fedge.core.rng import Draws, check_draws
from fedge.estimators import (
    ZerothOrderSpec,
    estimate_gradient,
    forward_budget,
    loss_differences,
    zeroth_order_gradient,
)
from fedge.estimators.batched import BatchedEvaluator
from fedge.estimators.perturbation import select
from fedge.models import build_model

__all__ = [
    "BENCH_MODELS",
    "FLOOR_RATIO_TARGET",
    "ZO_SECTION",
    "bench_model",
    "fast_path",
    "forward_breakdown",
    "matmul_peak_gflops",
    "reference_gradient",
    "retain_freed_memory",
    "run_zo",
    "zo_markdown",
]

# Models as BAFFLE runs them (Sec. 4.1, 3.3: Hardswish, GroupNorm): input shape.
BENCH_MODELS: dict[str, tuple[int, int, int]] = {
    "lenet": (1, 28, 28),
    "lenet5": (1, 28, 28),
    "wrn-10-2": (3, 32, 32),
}
SIGMA = 1e-4  # BAFFLE's σ
FLOOR_RATIO_TARGET = 1.1  # issue 15: a ZO step within 1.1x of its forwards
_WARMUP_K = 2


def _zo_step(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    *,
    k: int,
    scheme: str,
    mode: str,
    seed: int,
    draws: Draws = "torch",
) -> dict[str, Tensor]:
    """One whole estimate: the client's loss differences, then the server's ĝ."""
    spec = ZerothOrderSpec(k=k, sigma=SIGMA, scheme=scheme, mode=mode, draws=draws)  # type: ignore[arg-type]
    diffs = loss_differences(model, F.cross_entropy, batch, spec, seed=seed)
    return estimate_gradient(dict(model.named_parameters()), diffs, spec, seed=seed)


def _epoch_step(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    *,
    k: int,
    scheme: str,
    seed: int,
    draws: Draws = "torch",
) -> dict[str, Tensor]:
    """The same estimate on one device (epoch-level BAFFLE): the rebuild reuses the forwards' draws."""
    spec = ZerothOrderSpec(k=k, sigma=SIGMA, scheme=scheme, mode="fast", draws=draws)  # type: ignore[arg-type]
    return zeroth_order_gradient(model, F.cross_entropy, batch, spec, seed=seed)


def _bp_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[Tensor, Tensor]) -> None:
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    opt.step()


def bench_model(name: str, batch: int, seed: int = 0) -> tuple[nn.Module, tuple[Tensor, Tensor]]:
    """A model of :data:`BENCH_MODELS` (Hardswish, GroupNorm) and a seeded batch ``(x, y)``."""
    shape = BENCH_MODELS[name]
    model = build_model(
        name, input_shape=shape, num_classes=10, activation="hardswish", norm="group", seed=seed
    )
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *shape, generator=g)  # (B, C, H, W)
    y = torch.randint(0, 10, (batch,), generator=g)
    return model, (x, y)


def fast_path(model: nn.Module, batch: tuple[Tensor, Tensor]) -> str:
    """What fast mode runs for ``model`` on ``batch``: ``"batched"``, ``"lean-fallback"`` (a
    model it cannot batch) or ``"lean-large-batch"`` (batching is slower at this batch size),
    the last two suffixed ``" in N threads"`` when the perturbations are split over N threads."""
    from fedge.estimators.zeroth_order import batched_pays

    ev = BatchedEvaluator.build(model, select(model), 0, batch[0], F.cross_entropy, batch[1])
    if ev is not None and batched_pays(model, batch[0]):
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


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()
    return min(_time(fn) for _ in range(repeats))


def forward_breakdown(model: nn.Module, x: Tensor, *, repeats: int = 3) -> dict[str, float]:
    """Seconds of one forward per leaf-module kind (``"Conv2d"``, ``"GroupNorm"``, ...).

    Each leaf module is re-run alone on the input it received in a recorded forward (best of
    ``repeats``), so the parts add up to about the forward (less Python dispatch between them).
    """
    leaves = [(n, m) for n, m in model.named_modules() if next(m.children(), None) is None]
    inputs: dict[str, Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda _m, i, _o, n=n: inputs.__setitem__(n, i[0]))
        for n, m in leaves
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    out: dict[str, float] = {}
    with torch.no_grad():
        for n, m in leaves:
            if n in inputs:
                kind = type(m).__name__
                out[kind] = out.get(kind, 0.0) + _best(functools.partial(m, inputs[n]), repeats)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _allocator_probe(
    models: Sequence[str], *, k: int, batch: int, threads: int, repeats: int
) -> dict[str, Any]:
    """Central-scheme rows at a small ``k`` in two fresh processes: glibc's default vs retained."""
    out: dict[str, Any] = {}
    for retain in (False, True):
        code = (
            "import json, torch; from fedge.bench import zo\n"
            f"applied = zo.retain_freed_memory() if {retain} else False\n"
            f"torch.set_num_threads({threads})\n"
            f"rows = [r for m in {list(models)!r} for r in zo._bench_model("
            f"m, schemes=('central',), k={k}, batch={batch}, repeats={repeats}, peak1=1.0,"
            " diagnose=False)]\n"
            "print(json.dumps({'applied': applied, 'rows': rows}))"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"allocator probe failed:\n{proc.stderr[-2000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        key = "retained" if retain else "glibc_default"
        for r in got["rows"]:
            out.setdefault(r["model"], {})[key] = {
                f: r[f]
                for f in (
                    "forward_s",
                    "bp_step_s",
                    "zo_step_s",
                    "zo_lean_step_s",
                    "reference_loop_step_s",
                )
            }
    return {"k": k, "scheme": "central", "batch": batch, "models": out}


def _bench_model(
    name: str,
    *,
    schemes: Sequence[str],
    k: int,
    batch: int,
    repeats: int,
    peak1: float,
    diagnose: bool = True,
    draws: Draws = "torch",
) -> list[dict[str, Any]]:
    """Rows (one per scheme) for one model; every variant timed in interleaved repetitions.

    ``peak1``: the 1-thread peak GFLOP/s the hardware bound is computed from.
    """
    model, data = bench_model(name, batch)
    bp_model, _ = bench_model(
        name, batch
    )  # BP updates its weights: keep them apart from the ZO model
    opt = torch.optim.SGD(bp_model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def forward() -> None:
        with torch.no_grad():
            model(data[0])

    def loop(n: int) -> Callable[[], object]:
        def run() -> None:
            with torch.no_grad():
                for _ in range(n):
                    model(data[0])

        return run

    def zo(scheme: str, mode: str, kk: int) -> Callable[[], object]:
        return lambda: _zo_step(model, data, k=kk, scheme=scheme, mode=mode, seed=7, draws=draws)

    def epoch(scheme: str, kk: int) -> Callable[[], object]:
        return lambda: _epoch_step(model, data, k=kk, scheme=scheme, seed=7, draws=draws)

    def ref(scheme: str, kk: int) -> Callable[[], object]:
        return lambda: reference_gradient(
            model, F.cross_entropy, data, k=kk, sigma=SIGMA, scheme=scheme, generator=gen
        )

    # name -> (warm-up, timed): the ZO variants warm up at a small K (first-call costs only).
    variants: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "forward": (forward, forward),
        "bp": (lambda: _bp_step(bp_model, opt, data),) * 2,
    }
    for s in schemes:
        variants[f"{s}/loop"] = (loop(1), loop(forward_budget(k, s)))  # type: ignore[arg-type]
        variants[f"{s}/fast"] = (zo(s, "fast", _WARMUP_K), zo(s, "fast", k))
        variants[f"{s}/lean"] = (zo(s, "lean", _WARMUP_K), zo(s, "lean", k))
        variants[f"{s}/epoch"] = (epoch(s, _WARMUP_K), epoch(s, k))
        variants[f"{s}/reference"] = (ref(s, _WARMUP_K), ref(s, k))
    for warm, _ in variants.values():
        warm()
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeats):
        for key, (_, timed) in variants.items():
            best[key] = min(best[key], _time(timed))

    diag: dict[str, Any] = {}
    if diagnose:
        cl_model = copy.deepcopy(model).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        cl_x = data[0].contiguous(memory_format=torch.channels_last)

        def cl_forward() -> None:
            with torch.no_grad():
                cl_model(cl_x)

        diag = {
            "forward_channels_last_s": _best(cl_forward, repeats),
            "forward_breakdown": forward_breakdown(model, data[0], repeats=repeats),
        }

    threads = torch.get_num_threads()
    fwd_flops = _forward_flops(model, data[0])
    bp, fwd_s = best["bp"], best["forward"]
    bound_fwd_s = fwd_flops / (peak1 * 1e9 * threads)  # the hardware bound at this thread count
    rows = []
    for s in schemes:
        fast, lean, reference = best[f"{s}/fast"], best[f"{s}/lean"], best[f"{s}/reference"]
        fwd_loop = best[f"{s}/loop"]
        forwards = forward_budget(k, s)  # type: ignore[arg-type]
        floor = forwards * fwd_s
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
                "zo_epoch_step_s": best[f"{s}/epoch"],
                "epoch_over_split": best[f"{s}/epoch"] / fast,
                "bp_step_s": bp,
                "reference_loop_step_s": reference,
                "forward_s": fwd_s,
                "forwards_per_step": forwards,
                "forward_gflops": fwd_flops / 1e9,  # GFLOP of one forward (conv/matmul)
                "forward_achieved_gflops": fwd_flops / fwd_s / 1e9,  # GFLOP/s
                "zo_achieved_gflops": forwards * fwd_flops / fast / 1e9,
                "zo_lean_achieved_gflops": forwards * fwd_flops / lean / 1e9,
                "peak_1thread_gflops": peak1,
                "forward_efficiency": fwd_flops / fwd_s / 1e9 / (peak1 * threads),
                "zo_floor_s": floor,
                "zo_floor_ratio": fast / floor,
                "zo_lean_floor_ratio": lean / floor,
                "meets_floor_ratio": fast / floor <= FLOOR_RATIO_TARGET,
                "forward_loop_s": fwd_loop,
                "zo_loop_ratio": fast / fwd_loop,
                "zo_lean_loop_ratio": lean / fwd_loop,
                "zo_bound_s": forwards * bound_fwd_s,
                "zo_over_bound": fast / (forwards * bound_fwd_s),
                "bp_over_forward": bp / fwd_s,
                "zo_over_bp_per_k": fast / (k * bp),
                "zo_lean_over_bp_per_k": lean / (k * bp),
                "zo_over_bp_per_k_bound": forwards * bound_fwd_s / (k * bp),
                "speedup_vs_reference": reference / fast,
                "zo_lean_speedup_vs_reference": reference / lean,
                "speedup_vs_reference_bound": reference / (forwards * bound_fwd_s),
                **diag,
            }
        )
    return rows


def run_zo(
    models: Sequence[str] = ("lenet", "lenet5", "wrn-10-2"),
    *,
    k: int = 100,
    batch: int = 64,
    repeats: int = 3,
    threads: int = 1,
    schemes: Sequence[str] = ("central", "forward"),
    retain_memory: bool = True,
    probe_k: int | None = 8,
    draws: Draws = "torch",
) -> dict[str, Any]:
    """Time ZO steps (fast, lean), a forward, a BP step and the reference loop; see the module
    docstring.

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
        draws: the directions' generator (:data:`fedge.core.rng.Draws`): ``"torch"`` or
            ``"portable"`` (the ZO steps only; the reference loop keeps torch's).

    Warns (RuntimeWarning) when the load probe saw other work; the reasons are also in
    ``warnings`` of the returned report.
    """
    unknown = [m for m in models if m not in BENCH_MODELS]
    if not models or unknown:
        raise ValueError(
            f"unknown model(s) {unknown or models}; choose from {sorted(BENCH_MODELS)}"
        )
    bad = [s for s in schemes if s not in ("central", "forward")]
    if not schemes or bad:
        raise ValueError(f"unknown scheme(s) {bad or schemes}; choose from ['central', 'forward']")
    if min(k, batch, repeats, threads, probe_k or 1) < 1:
        raise ValueError(
            f"k, batch, repeats, threads and probe_k must be >= 1, got {k}, {batch}, {repeats}, {threads}, {probe_k}"
        )
    retained = retain_freed_memory() if retain_memory else False
    torch.set_num_threads(threads)  # left set, like the engine benchmark: the docs line reports it
    probe_before, peak_before = load_probe(), one_thread_peak()
    peak = matmul_peak_gflops()
    rows = [
        r
        for m in models
        for r in _bench_model(
            m,
            schemes=schemes,
            k=k,
            batch=batch,
            repeats=repeats,
            peak1=peak_before["peak"],
            draws=check_draws(draws),
        )
    ]
    probe_after, peak_after = load_probe(), one_thread_peak()
    busy = busy_warnings(
        probe_before,
        probe_after,
        threads=threads,
        peak_before=peak_before["peak"],
        peak_after=peak_after["peak"],
    )
    for msg in busy:
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    allocator = None
    if probe_k is not None:
        allocator = _allocator_probe(
            models, k=probe_k, batch=batch, threads=threads, repeats=repeats
        )
    return {
        "benchmark": "zo-step",
        "threads": threads,
        "cores": probe_before["cores"],
        "sigma": SIGMA,
        "draws": draws,
        "repeats": repeats,
        "timing": "minimum over interleaved repetitions, after one warm-up of each variant",
        "malloc_retained": retained,
        "bp_optimizer": "plain SGD (no momentum), lr 1e-3",
        "matmul_peak_gflops": peak,
        "peak_1thread": {"start": peak_before, "end": peak_after},
        "load": {"start": probe_before, "end": probe_after},
        "warnings": busy,
        "floor_ratio_target": FLOOR_RATIO_TARGET,
        "results": rows,
        "allocator": allocator,
    }


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("pass" if ok else "FAIL")


def zo_markdown(report: dict[str, Any], command: str) -> str:
    """The docs/benchmarks.md section for :func:`run_zo`."""
    t = report["threads"]
    p1 = report["peak_1thread"]["start"]
    target = report["floor_ratio_target"]
    rows = [
        "| model | scheme | K | batch | fast path | forward ms | fwd GFLOP/s (of bound) "
        "| ZO fast s | ZO GFLOP/s | floor s | fast/floor | lean/floor | fast/loop | bound s | BP step "
        "| fast/(K·BP) | reference s | fast vs ref | epoch-level s (vs fast) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        rows.append(
            f"| {r['model']} | {r['scheme']} | {r['k']} | {r['batch']} | {r['fast_path']} "
            f"| {r['forward_s'] * 1e3:.2f} | {r['forward_achieved_gflops']:.0f} "
            f"({r['forward_efficiency']:.0%}) | {r['zo_step_s']:.3f} "
            f"| {r['zo_achieved_gflops']:.0f} | {r['zo_floor_s']:.3f} "
            f"| {r['zo_floor_ratio']:.3f} ≤ {target}: {_mark(r['meets_floor_ratio'])} "
            f"| {r['zo_lean_floor_ratio']:.3f} | {r['zo_loop_ratio']:.3f} | {r['zo_bound_s']:.3f} "
            f"| {r['bp_step_s'] * 1e3:.1f} ms | {r['zo_over_bp_per_k']:.3f} "
            f"| {r['reference_loop_step_s']:.3f} | {r['speedup_vs_reference']:.2f}x "
            f"| {r['zo_epoch_step_s']:.3f} ({r['epoch_over_split']:.2f}x) |"
        )
    lines = [
        "Time of one zeroth-order step (client `loss_differences` + server `estimate_gradient`: one",
        "whole estimate) in fast and lean mode, read against its **floor** (forwards × one plain",
        "forward: *fast/floor* ≤ 1.1 means the step's own overhead is at most 10%; *fast/loop*: the",
        "step against the same number of plain forwards run back to back in the same rounds, which",
        "compares like with like when other processes compete) and the",
        "**hardware bound** (forwards × the forward's conv/matmul FLOPs / (1-thread peak ×",
        "threads): no step running these forwards can beat it). *fwd GFLOP/s (of bound)*: one",
        "forward's conv/matmul FLOPs per second and its share of 1-thread peak × threads. Also one",
        "backprop step (forward, backward, plain SGD step) and the BAFFLE reference code's loop",
        "(per k: fresh `torch.randn` per parameter, in-place `W += σz`, forward(s), restore,",
        "`g += ΔL·z`). Models as BAFFLE runs them: Hardswish and GroupNorm; LeNet and LeNet-5 on",
        "1×28×28, WRN-10-2 on 3×32×32; σ = 1e-4. *lean-fallback*: the batched path cannot run the",
        "model (residual units), so fast mode runs the lean loop; *lean-large-batch*: one forward",
        "of the batch costs more than ~90 MFLOP, where batching is slower than one plain forward per",
        "perturbation, so fast mode runs the lean loop; *in N threads*: fast mode splits the K",
        "perturbations over N threads. *epoch-level*: the same estimate on one device",
        "(`zeroth_order_gradient`, fast mode, as BAFFLE's epoch-level clients run it), whose rebuild",
        "of ĝ reuses the directions its forwards drew; *(vs fast)* its time over the ZO fast step's.",
        "",
        f"{t} torch thread(s) of {report['cores']} cores. 1-thread peak (best of a 1024² `torch.mm` "
        f"and a 64→64 3×3 conv on 64×64×16×16): {p1['peak']:.0f} GFLOP/s at the start "
        f"(matmul {p1['matmul']:.0f}, conv {p1['conv']:.0f}), "
        f"{report['peak_1thread']['end']['peak']:.0f} at the end; 2048² `torch.mm` at {t} "
        f"thread(s): {report['matmul_peak_gflops']:.0f} GFLOP/s. {report['timing'].capitalize()}; "
        f"{report['repeats']} repetitions. glibc told to retain freed memory: "
        f"{'yes' if report['malloc_retained'] else 'no'}, for every variant alike.",
        "",
    ]
    if report["warnings"]:
        lines += [
            "**Machine busy — timings slowed by other work:**",
            "",
            *[f"- {w}" for w in report["warnings"]],
            "",
        ]
    else:
        lines += ["Load probe: no other work seen at the start or the end of the run.", ""]
    lines += [f"Command: `{command}`", "", *rows]
    diag = [
        r
        for r in report["results"]
        if "forward_breakdown" in r and r["scheme"] == report["results"][0]["scheme"]
    ]
    if diag:
        lines += [
            "",
            "Where one forward's time goes (each leaf module re-run alone on its recorded input; "
            "ms per layer kind, share of their sum) and the same forward in channels_last "
            "(not the default: its kernels round differently, so outputs change in the last bits):",
            "",
            "| model | forward ms | channels_last ms | layer kinds |",
            "|---|---|---|---|",
        ]
        for r in diag:
            parts = r["forward_breakdown"]
            total = sum(parts.values())
            kinds = ", ".join(
                f"{k} {v * 1e3:.2f} ({v / total:.0%})"
                for k, v in parts.items()
                if v / total >= 0.01
            )
            lines.append(
                f"| {r['model']} | {r['forward_s'] * 1e3:.2f} | {r['forward_channels_last_s'] * 1e3:.2f} | {kinds} |"
            )
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
                v = by[setting]
                lines.append(
                    f"| {m} | {setting.replace('_', ' ')} | {v['forward_s'] * 1e3:.1f} ms "
                    f"| {v['bp_step_s'] * 1e3:.1f} ms | {v['zo_step_s'] * 1e3:.0f} ms "
                    f"| {v['zo_lean_step_s'] * 1e3:.0f} ms | {v['reference_loop_step_s'] * 1e3:.0f} ms "
                    f"| {v['reference_loop_step_s'] / v['zo_step_s']:.2f}x |"
                )
    return "\n".join(lines)


#: The docs section this benchmark measures (:mod:`fedge.bench.measured`).
ZO_SECTION = Section("zo-step", "Zeroth-order step time", zo_markdown)
