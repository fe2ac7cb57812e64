"""Peak memory of one client step (inference, backprop, lean and fast zeroth-order), by tensor
accounting and by peak RSS in fresh processes (BAFFLE, seed 000, Sec. 4.4, Table 4,
Appendix C). Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedge.bench.measured import Section
from fedge.bench.zo import BENCH_MODELS, SIGMA, bench_model, fast_path
from fedge.core.meter import TensorAccountant, module_bytes, rss_peak_reset, rss_peak_since_reset
from fedge.estimators import ZerothOrderSpec, loss_differences
from fedge.pruning.masks import prunable_parameters

__all__ = [
    "MEMORY_SECTION",
    "PAPER_TABLE4",
    "StepAccountant",
    "fixed_mmap_threshold",
    "memory_markdown",
    "run_memory",
    "step_peak_bytes",
]

STEPS = ("inference", "bp", "zo_lean", "zo_fast", "zo_sparse")
#: Kept fraction of prunable weights for the ``zo_sparse`` step (NTK-BAFFLE's 90% sparsity).
SPARSE_DENSITY = 0.1
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)
LEAN_OVER_INFERENCE_TARGET = 1.15
# BAFFLE Table 4, GPU memory in MB: (BP, BAFFLE min, BAFFLE max) on CIFAR-10/100 and
# OfficeHome/ImageNet inputs; the paper's "ratio" is BAFFLE max / BP in %.
PAPER_TABLE4: dict[str, dict[str, tuple[int, int, int]]] = {
    "lenet": {"cifar": (1680, 67, 174), "officehome": (2527, 86, 201)},
    "wrn-10-2": {"cifar": (1878, 75, 196), "officehome": (3425, 94, 251)},
}


def StepAccountant(resident: Iterable[Tensor]) -> TensorAccountant:  # noqa: N802 - kept name
    """A :class:`TensorAccountant` that ignores the storages of ``resident`` tensors."""
    return TensorAccountant(resident)


def _resident_tensors(model: nn.Module, batch: tuple[Tensor, Tensor]) -> list[Tensor]:
    return [*model.parameters(), *model.buffers(), *batch]


def _make_step(
    kind: str, model: nn.Module, batch: tuple[Tensor, Tensor], k: int
) -> Callable[[], object]:
    """The client step of ``kind`` on ``batch``; the model is put in the right mode first."""
    x, y = batch
    if kind == "inference":
        model.eval()

        def inference() -> Tensor:
            with torch.no_grad():
                return model(x)

        return inference
    model.train()
    if kind == "bp":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)  # no momentum: no optimizer state
        model.zero_grad(set_to_none=True)

        def bp() -> None:
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return bp
    if kind in ("zo_lean", "zo_fast"):
        mode: Literal["lean", "fast"] = "lean" if kind == "zo_lean" else "fast"
        spec = ZerothOrderSpec(k=k, sigma=SIGMA, scheme="central", mode=mode)
        return lambda: loss_differences(model, F.cross_entropy, (x, y), spec, seed=0)
    if kind == "zo_sparse":
        masks = sparse_masks(model, SPARSE_DENSITY)
        lean = ZerothOrderSpec(k=k, sigma=SIGMA, scheme="central", mode="lean")

        def sparse() -> Tensor:
            return loss_differences(model, F.cross_entropy, (x, y), lean, seed=0, masks=masks)

        sparse.resident = list(masks.values())  # type: ignore[attr-defined]  # held by the client all along
        return sparse
    raise ValueError(f"unknown step {kind!r}; choose from {STEPS}")


def sparse_masks(model: nn.Module, density: float, seed: int = 0) -> dict[str, Tensor]:
    """Bool masks keeping ``round(density · n)`` of the prunable weights, chosen uniformly at
    random under one global count (what the client of a pruned model holds; which weights are
    kept does not change the memory of a dense-kernel forward)."""
    names = prunable_parameters(model)
    params = dict(model.named_parameters())
    sizes = [params[n].numel() for n in names]
    keep = torch.zeros(sum(sizes), dtype=torch.bool)
    g = torch.Generator().manual_seed(seed)
    keep[torch.randperm(keep.numel(), generator=g)[: round(density * keep.numel())]] = True
    return {n: m.view_as(params[n]) for n, m in zip(names, keep.split(sizes), strict=True)}


def step_peak_bytes(
    kind: str, model: nn.Module, batch: tuple[Tensor, Tensor], *, k: int = 8
) -> dict[str, int]:
    """Tensor-accounting peak of one step: ``{"peak_bytes", "resident_bytes", "step_bytes"}``.

    ``peak_bytes = resident_bytes + step_bytes``; see the module docstring for the definitions.
    """
    step = _make_step(kind, model, batch, k)
    held = list(getattr(step, "resident", []))  # e.g. the masks of a sparse model
    accountant = StepAccountant([*_resident_tensors(model, batch), *held])
    with accountant:
        result = step()
    del result
    model.zero_grad(set_to_none=True)
    resident = module_bytes(model) + sum(t.nbytes for t in [*batch, *held])
    return {
        "peak_bytes": resident + accountant.peak,
        "resident_bytes": resident,
        "step_bytes": accountant.peak,
    }


def _malloc_trim() -> None:
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def fixed_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Fix glibc's mmap and trim thresholds at ``nbytes`` (disables their dynamic adjustment).

    Process-wide and not undone; True if glibc accepted both, False elsewhere.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return mallopt(_M_MMAP_THRESHOLD, nbytes) == 1 and mallopt(_M_TRIM_THRESHOLD, nbytes) == 1


def _rss_child(name: str, batch: int, kind: str, k: int, threads: int) -> dict[str, int | None]:
    """Run in a fresh process: RSS growth of one step (see the module docstring)."""
    torch.set_num_threads(threads)
    model, data = bench_model(name, batch)
    _make_step(kind, model, (data[0][:1], data[1][:1]), k)()  # one-time costs, 1 sample
    model.zero_grad(set_to_none=True)
    step = _make_step(kind, model, data, k)
    gc.collect()
    _malloc_trim()
    start = rss_peak_reset()
    step()
    return {"rss_growth_bytes": rss_peak_since_reset(start), "rss_before_bytes": start}


def _rss(name: str, batch: int, kind: str, k: int, threads: int, repeats: int) -> dict[str, Any]:
    """Min and max RSS growth of one step over ``repeats`` fresh processes."""
    code = (
        "import json; from fedge.bench.memory import _rss_child, fixed_mmap_threshold\n"
        "fixed = fixed_mmap_threshold()\n"
        f"print(json.dumps({{**_rss_child({name!r}, {batch}, {kind!r}, {k}, {threads}), 'fixed': fixed}}))"
    )
    growth: list[int] = []
    before: list[int] = []
    fixed = True
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"RSS measurement of {kind} ({name}, batch {batch}) failed:\n{proc.stderr[-2000:]}"
            )
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        if got["rss_growth_bytes"] is None:  # the kernel does not allow the reset
            return {"min": None, "max": None, "before": None, "fixed": got["fixed"]}
        growth.append(got["rss_growth_bytes"])
        before.append(got["rss_before_bytes"])
        fixed = fixed and got["fixed"]
    return {"min": min(growth), "max": max(growth), "before": min(before), "fixed": fixed}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _measure(
    name: str, batch: int, lean_ks: Sequence[int], fast_k: int, rss_repeats: int, threads: int
) -> dict[str, Any]:
    model, data = bench_model(name, batch)
    runs = [("inference", "inference", 1), ("bp", "bp", 1), ("zo_fast", "zo_fast", fast_k)]
    runs += [(f"zo_lean_k{k}", "zo_lean", k) for k in lean_ks]
    runs += [("zo_sparse", "zo_sparse", lean_ks[0])]
    acct = {key: step_peak_bytes(kind, model, data, k=k) for key, kind, k in runs}
    rss_of = (
        {key: _rss(name, batch, kind, k, threads, rss_repeats) for key, kind, k in runs}
        if rss_repeats
        else {}
    )
    lean_key = f"zo_lean_k{lean_ks[0]}"
    row: dict[str, Any] = {
        "model": name,
        "batch": batch,
        "params": sum(p.numel() for p in model.parameters()),
        "fast_path": fast_path(model, data),
        "scheme": "central",
        "lean_k": lean_ks[0],
        "fast_k": fast_k,
        "resident_bytes": acct["inference"]["resident_bytes"],
        "inference_peak_bytes": acct["inference"]["peak_bytes"],
        "bp_peak_bytes": acct["bp"]["peak_bytes"],
        "zo_lean_peak_bytes": acct[lean_key]["peak_bytes"],
        "zo_fast_peak_bytes": acct["zo_fast"]["peak_bytes"],
        "zo_lean_peak_bytes_by_k": {str(k): acct[f"zo_lean_k{k}"]["peak_bytes"] for k in lean_ks},
    }
    by_k = list(row["zo_lean_peak_bytes_by_k"].values())
    row["zo_lean_k_spread_bytes"] = max(by_k) - min(by_k)
    row["bp_over_lean"] = row["bp_peak_bytes"] / row["zo_lean_peak_bytes"]
    row["bp_over_inference"] = row["bp_peak_bytes"] / row["inference_peak_bytes"]
    row["lean_over_inference"] = row["zo_lean_peak_bytes"] / row["inference_peak_bytes"]
    row["fast_over_lean"] = row["zo_fast_peak_bytes"] / row["zo_lean_peak_bytes"]
    row["zo_sparse_density"] = SPARSE_DENSITY
    row["zo_sparse_peak_bytes"] = acct["zo_sparse"]["peak_bytes"]  # masks included (resident)
    row["zo_sparse_mask_bytes"] = (
        acct["zo_sparse"]["resident_bytes"] - acct[lean_key]["resident_bytes"]
    )
    row["zo_sparse_over_lean"] = row["zo_sparse_peak_bytes"] / row["zo_lean_peak_bytes"]
    row["meets_lean_over_inference"] = row["lean_over_inference"] <= LEAN_OVER_INFERENCE_TARGET
    if rss_repeats:
        for key, short in (
            ("inference", "inference"),
            ("bp", "bp"),
            (lean_key, "zo_lean"),
            ("zo_fast", "zo_fast"),
            ("zo_sparse", "zo_sparse"),
        ):
            row[f"rss_{short}_peak_bytes"] = rss_of[key]["min"]
            row[f"rss_{short}_peak_bytes_max"] = rss_of[key]["max"]
        row["rss_before_step_bytes"] = rss_of["inference"]["before"]
        row["rss_mmap_threshold_fixed"] = all(v["fixed"] for v in rss_of.values())
        row["rss_zo_lean_peak_bytes_by_k"] = {
            str(k): rss_of[f"zo_lean_k{k}"]["min"] for k in lean_ks
        }
        row["rss_bp_over_lean"] = _ratio(row["rss_bp_peak_bytes"], row["rss_zo_lean_peak_bytes"])
        row["rss_lean_over_inference"] = _ratio(
            row["rss_zo_lean_peak_bytes"], row["rss_inference_peak_bytes"]
        )
    paper = PAPER_TABLE4.get(name)
    if paper is not None:
        row["paper_bp_over_baffle_max"] = {d: bp / hi for d, (bp, _, hi) in paper.items()}
        row["paper_bp_over_baffle_min"] = {d: bp / lo for d, (bp, lo, _) in paper.items()}
    return row


def run_memory(
    models: Sequence[str] = ("lenet", "wrn-10-2"),
    *,
    batches: Sequence[int] = (64, 256),
    lean_ks: Sequence[int] = (8, 2),
    fast_k: int = 8,
    rss_repeats: int = 2,
    threads: int = 1,
) -> dict[str, Any]:
    """Peak memory of each client step for each model and batch; see the module docstring.

    Args:
        models: names from :data:`fedge.bench.zo.BENCH_MODELS` (Hardswish, GroupNorm).
        batches: batch sizes.
        lean_ks: K values for the lean step (the first is the headline; the others check that
            lean memory does not depend on K).
        fast_k: K for the fast step (its memory follows the default chunk, not K, once K ≥ chunk).
        rss_repeats: fresh processes per RSS measurement (min and max reported); 0 skips RSS.
        threads: torch threads (set for this process, and used in the RSS processes).
    """
    unknown = [m for m in models if m not in BENCH_MODELS]
    if not models or unknown:
        raise ValueError(
            f"unknown model(s) {unknown or models}; choose from {sorted(BENCH_MODELS)}"
        )
    if (
        not batches
        or not lean_ks
        or min(*batches, *lean_ks, fast_k, threads) < 1
        or rss_repeats < 0
    ):
        raise ValueError(
            f"batches, lean_ks, fast_k and threads must be positive and rss_repeats >= 0, got "
            f"{list(batches)}, {list(lean_ks)}, {fast_k}, {threads}, {rss_repeats}"
        )
    torch.set_num_threads(threads)  # left set, like the engine benchmark: the docs line reports it
    rows = [_measure(m, b, lean_ks, fast_k, rss_repeats, threads) for m in models for b in batches]
    return {
        "benchmark": "client-step-memory",
        "threads": threads,
        "bp_optimizer": "plain SGD (no momentum, no optimizer state)",
        "zo_scheme": "central",
        "definition": (
            "tensor accounting: parameters + buffers + input batch + peak live bytes of storages "
            "created inside the step; rss: growth of VmHWM over VmRSS in a fresh process after a "
            "1-sample warm-up step and malloc_trim, glibc mmap threshold fixed at 128 KiB; min (and max) over "
            f"{rss_repeats} processes"
        ),
        "rss_repeats": rss_repeats,
        "target_lean_over_inference": LEAN_OVER_INFERENCE_TARGET,
        "results": rows,
    }


def _mb(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.2f}"


def memory_markdown(report: dict[str, Any], command: str) -> str:
    """The docs/benchmarks.md section for :func:`run_memory`."""
    res = report["results"]
    ks = "/".join(res[0]["zo_lean_peak_bytes_by_k"]) if res else ""
    density = res[0]["zo_sparse_density"] if res else SPARSE_DENSITY
    lines = [
        "Peak memory of one client step (MiB). Inference: one forward, no grad. BP: forward,",
        "backward, plain SGD step (no momentum, so no optimizer state). Lean/fast ZO:",
        "`loss_differences`, central scheme, lean mode / fast mode with its default chunk. Models as",
        "BAFFLE runs them (Hardswish, GroupNorm; LeNet on 1×28×28, WRN-10-2 on 3×32×32). Sparse lean",
        "ZO: the lean step on a model pruned to the stated density (NTK-BAFFLE's 90% sparsity), its",
        "bool masks counted as resident memory (their size in parentheses); the forwards run dense",
        "kernels, so sparsity saves no activation memory.",
        "",
        "*Tensor accounting* (headline): parameters + buffers + the input batch, plus the peak of",
        "live bytes of tensor storages created inside the step (activations, tensors saved for",
        "backward, gradients, perturbed weights and noise), seen by a dispatch mode; views of the",
        "weights are not new memory. *RSS*: growth of the RSS high-water mark during the step, each",
        "measurement in a fresh process (after imports, model and batch, a 1-sample warm-up step and",
        "`malloc_trim`), glibc's mmap threshold fixed at 128 KiB so that RSS follows live memory",
        "(with its default dynamic threshold the same step varied by tens of percent between",
        "processes). Target (issue): lean ZO ≤ 1.15× inference.",
        "",
        f"Command: `{command}`",
        "",
        f"| model | batch | resident | inference | BP | lean ZO (K = {ks}) | fast ZO (path) "
        f"| sparse lean ZO, d = {density} (masks) | lean/inference ≤ 1.15 | BP/lean | fast/lean |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res:
        by_k = " / ".join(_mb(v) for v in r["zo_lean_peak_bytes_by_k"].values())
        lines.append(
            f"| {r['model']} | {r['batch']} | {_mb(r['resident_bytes'])} | {_mb(r['inference_peak_bytes'])} "
            f"| {_mb(r['bp_peak_bytes'])} | {by_k} | {_mb(r['zo_fast_peak_bytes'])} ({r['fast_path']}) "
            f"| {_mb(r['zo_sparse_peak_bytes'])} ({_mb(r['zo_sparse_mask_bytes'])}) "
            f"| {r['lean_over_inference']:.3f} {'pass' if r['meets_lean_over_inference'] else 'FAIL'} "
            f"| {r['bp_over_lean']:.2f} | {r['fast_over_lean']:.2f} |"
        )
    if res and "rss_bp_peak_bytes" in res[0]:
        lines += [
            "",
            f"Peak RSS growth during the step (MiB), min (max) over {report['rss_repeats']} fresh "
            "processes; lean at the other K: min only; ratios of the minima:",
            "",
            f"| model | batch | inference | BP | lean ZO (K = {ks}) | fast ZO | sparse lean ZO | lean/inference "
            "| BP/lean | RSS before the step |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]

        def both(r: dict[str, Any], short: str) -> str:
            return f"{_mb(r[f'rss_{short}_peak_bytes'])} ({_mb(r[f'rss_{short}_peak_bytes_max'])})"

        for r in res:
            others = [
                _mb(v)
                for kk, v in r["rss_zo_lean_peak_bytes_by_k"].items()
                if kk != str(r["lean_k"])
            ]
            lean = " / ".join([both(r, "zo_lean"), *others])
            li, bl = r["rss_lean_over_inference"], r["rss_bp_over_lean"]
            lines.append(
                f"| {r['model']} | {r['batch']} | {both(r, 'inference')} | {both(r, 'bp')} | {lean} "
                f"| {both(r, 'zo_fast')} | {both(r, 'zo_sparse')} | {'n/a' if li is None else f'{li:.2f}'} "
                f"| {'n/a' if bl is None else f'{bl:.2f}'} | {_mb(r['rss_before_step_bytes'])} |"
            )
    lines += [
        "",
        "BAFFLE Table 4 (GPU memory, MB, PyTorch's static memory included; BAFFLE executes the",
        "forwards layer by layer) for comparison with BP/lean above:",
        "",
        "| model | inputs | BP | BAFFLE min~max | BP / BAFFLE max | BP / BAFFLE min |",
        "|---|---|---|---|---|---|",
    ]
    for name, by in PAPER_TABLE4.items():
        for data, (bp, lo, hi) in by.items():
            label = "CIFAR-10/100" if data == "cifar" else "OfficeHome/ImageNet"
            lines.append(f"| {name} | {label} | {bp} | {lo}~{hi} | {bp / hi:.2f} | {bp / lo:.1f} |")
    return "\n".join(lines)


#: The docs section this benchmark measures (:mod:`fedge.bench.measured`).
MEMORY_SECTION = Section("client-memory", "Client step memory", memory_markdown)
