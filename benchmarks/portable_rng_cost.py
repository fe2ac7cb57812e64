"""What portable draws (fedge.core.portable) cost against torch.randn in BAFFLE's step.

BAFFLE's LeNet (``lenet``, 26,730 parameters in 6 tensors), K = 100 directions, one thread.
Three timings, each with torch's per-(k, parameter) ``randn`` (today's
``standard_normal_chunk``) and with the portable generator (``normal_rows`` on the key
``(seed, "zo", name)``, row k = direction k):

- **server draw**: every parameter's (K, *shape) directions, one chunk call per parameter
  (what ``estimate_gradient`` does in chunks of 64 and the fast mode per layer);
- **lean draw**: one call per (k, parameter) (what the lean client does); and, portable only,
  one ``normal_many`` call per k for all parameters (what a lean client could do);
- **step**: one BAFFLE zeroth-order step, forward scheme, batch 32, lean and fast (batched)
  mode: the client's K + 1 forwards and draws (``loss_differences``) then the server's rebuild
  (``estimate_gradient``), with ``ZerothOrderSpec(draws="torch" | "portable")``;
- **bench zo step**: ``fedge bench zo``'s own step (:func:`fedge.bench.zo._zo_step`, the
  client's loss differences then the server's rebuild, and ``_epoch_step``, the epoch-level
  estimate on one device) at its defaults (batch 64, K = 100), for ``lenet`` and ``lenet5``,
  both schemes, fast and lean mode, with ``draws="torch"`` and ``draws="portable"``.

Times are process CPU seconds (a shared machine's waits do not count), the variants interleaved
round by round; the medians and the median of the per-round ratios are printed. With ``--json``
the bench zo rows are written as a record, with ``--docs`` as the ``zo-draws`` section of
docs/benchmarks.md (``--before`` adds the ratios of an earlier record, e.g. one made on the code
before a speed-up, as a column; ``--render RECORD`` writes the section from a record without
measuring). The committed records and section were made by

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/portable_rng_cost.py --bench-zo-only \
        --rounds 7 --json benchmarks/results/zo_draws/after.json
    python benchmarks/portable_rng_cost.py --render benchmarks/results/zo_draws/after.json \
        --before benchmarks/results/zo_draws/before.json --docs docs/benchmarks.md

and, for ``before.json``, ``--rounds 5 --json benchmarks/results/zo_draws/before.json`` on
``taskset -c 1`` at the same time, with ``PYTHONPATH`` on the source of the commit before lean
mode drew a direction's small parameters in one call (the record names it). """

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedge.bench.docs import command_section, machine_line, markdown_table, publish
from fedge.bench.zo import _epoch_step, _zo_step, bench_model
from fedge.core.portable import normal_many, normal_rows, stream_key
from fedge.core.rng import Draws
from fedge.estimators import estimate_gradient, loss_differences
from fedge.estimators.perturbation import standard_normal_chunk
from fedge.models import build_model

K = 100
SEED = 7

D = TypeVar("D")


def portable_chunk(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
    """The portable counterpart of ``standard_normal_chunk``: ``(len(ks), *shape)``."""
    return normal_rows(stream_key(seed, "zo", name), ks, shape)


def _cpu(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def measure(rounds: int) -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)
    model = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=1)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    x, y = (
        torch.randn(32, 1, 28, 28, generator=torch.Generator().manual_seed(0)),
        torch.arange(32) % 10,
    )
    draws: dict[str, Callable[..., Tensor]] = {
        "torch": standard_normal_chunk,
        "portable": portable_chunk,
    }

    def server(draw: Callable[..., Tensor]) -> None:
        for name, shape in shapes.items():
            draw(SEED, range(K), name, shape)

    def lean(draw: Callable[..., Tensor]) -> None:
        for k in range(K):
            for name, shape in shapes.items():
                draw(SEED, [k], name, shape)

    def step(draw: Callable[..., Tensor], mode: str) -> None:
        name = "portable" if draw is portable_chunk else "torch"
        d = loss_differences(
            model,
            F.cross_entropy,
            (x, y),
            k=K,
            mode=mode,
            workers=1,
            sigma=1e-4,
            seed=SEED,
            scheme="forward",
            draws=name,
        )
        estimate_gradient(
            dict(model.named_parameters()), d, sigma=1e-4, seed=SEED, scheme="forward", draws=name
        )

    keys = {name: stream_key(SEED, "zo", name) for name in shapes}
    strides = {name: -(-math.prod(shape) // 8) * 8 for name, shape in shapes.items()}

    def lean_many(draw: Callable[..., Tensor]) -> None:
        if draw is standard_normal_chunk:  # torch has no batched counterpart: as lean
            return lean(draw)
        for k in range(K):
            normal_many([(keys[n], s, k * strides[n]) for n, s in shapes.items()])
        return None

    tasks: dict[str, Callable[[Callable[..., Tensor]], None]] = {
        "server draw": server,
        "lean draw": lean,
        "lean draw, one call per k": lean_many,
        "step (lean)": lambda draw: step(draw, "lean"),
        "step (fast)": lambda draw: step(draw, "fast"),
    }
    return _interleaved(tasks, draws, rounds)


def _interleaved(
    tasks: Mapping[str, Callable[[D], object]], draws: Mapping[str, D], rounds: int
) -> dict[str, dict[str, float]]:
    """Each task under each draw, warmed up once, then ``rounds`` interleaved rounds."""
    for task in tasks.values():  # warm up
        for draw in draws.values():
            task(draw)
    times: dict[str, dict[str, list[float]]] = {t: {d: [] for d in draws} for t in tasks}
    for _ in range(rounds):
        for t, task in tasks.items():
            for d, draw in draws.items():
                times[t][d].append(_cpu(lambda: task(draw)))  # noqa: B023
    out: dict[str, dict[str, float]] = {}
    for t in tasks:
        a, b = times[t]["torch"], times[t]["portable"]
        out[t] = {
            "torch_s": statistics.median(a),
            "portable_s": statistics.median(b),
            "ratio": statistics.median(q / p for p, q in zip(a, b)),
        }
    return out


def _bench_zo_task(
    model: torch.nn.Module, batch: tuple[Tensor, Tensor], scheme: str, mode: str
) -> Callable[[Draws], object]:
    """``fedge bench zo``'s step in ``mode`` (fast, lean, or epoch: ``_epoch_step``), given the
    draws."""
    if mode == "epoch":
        return lambda d: _epoch_step(model, batch, k=K, scheme=scheme, seed=SEED, draws=d)
    return lambda d: _zo_step(model, batch, k=K, scheme=scheme, mode=mode, seed=SEED, draws=d)


def measure_bench_zo(
    rounds: int, models: Sequence[str] = ("lenet", "lenet5")
) -> dict[str, dict[str, float]]:
    """``fedge bench zo``'s steps (batch 64, K = 100) with torch and portable directions."""
    torch.set_num_threads(1)
    tasks: dict[str, Callable[[Draws], object]] = {}
    for name in models:
        model, data = bench_model(name, 64)
        for scheme in ("central", "forward"):
            for mode in ("fast", "lean"):
                tasks[f"bench zo {name} {scheme} {mode}"] = _bench_zo_task(
                    model, data, scheme, mode
                )
            tasks[f"bench zo {name} {scheme} epoch"] = _bench_zo_task(model, data, scheme, "epoch")
    draws: dict[str, Draws] = {"torch": "torch", "portable": "portable"}
    return _interleaved(tasks, draws, rounds)


def record(results: dict[str, dict[str, float]], rounds: int, command: str) -> dict[str, Any]:
    """The bench zo rows of ``results`` as a JSON-able record: what ran, where and the times."""
    rows = []
    for task, r in results.items():
        if task.startswith("bench zo "):
            model, scheme, path = task.removeprefix("bench zo ").split()
            rows.append({"model": model, "scheme": scheme, "path": path, **r})
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    return {
        "benchmark": "zo-draws",
        "machine": machine_line(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "command": command,
        "commit": commit,
        "k": K,
        "batch": 64,
        "rounds": rounds,
        "timing": "process CPU seconds, torch and portable interleaved round by round; medians, "
        "and the median of the per-round portable/torch ratios",
        "rows": rows,
    }


def markdown(rec: dict[str, Any], before: dict[str, Any] | None) -> str:
    """The docs section of a record, a JSON object (and the ratios of an earlier one, when
    given)."""
    old = {(r["model"], r["scheme"], r["path"]): r["ratio"] for r in (before or {}).get("rows", [])}
    head = ["model", "scheme", "path", "torch ms", "portable ms", "portable/torch"]
    if before:
        head.append("before")
    body = []
    for r in rec["rows"]:
        row = [r["model"], r["scheme"], r["path"], f"{r['torch_s'] * 1e3:.1f}"]
        row += [f"{r['portable_s'] * 1e3:.1f}", f"{r['ratio']:.3f}"]
        if before:
            was = old.get((r["model"], r["scheme"], r["path"]))
            row.append("" if was is None else f"{was:.3f}")
        body.append(row)
    worst = max(r["ratio"] for r in rec["rows"])
    intro = [
        "What portable seeded draws (`draws: portable`, fedge.core.portable) cost in one "
        "zeroth-order step against torch's generator (`draws: torch`): `fedge bench zo`'s step",
        f"(BAFFLE's LeNet and LeNet-5, Hardswish and GroupNorm, batch {rec['batch']}, K = {rec['k']},"
        " σ = 1e-4; *fast* and *lean*: the client's `loss_differences` then the server's",
        "`estimate_gradient`; *epoch*: `zeroth_order_gradient`, both on one device) with each",
        f"generator, interleaved round by round for {rec['rounds']} rounds in one process, one "
        f"torch thread on CPU(s) {rec['cpu_affinity']} (`taskset`). {rec['timing'].capitalize()}.",
        "LeNet's fast mode runs the lean loop at this batch (*lean-large-batch*), LeNet-5's the "
        "batched pass.",
        "",
        *([f"Load: {rec['load']}.", ""] if rec.get("load") else []),
        f"Largest portable/torch ratio: **{worst:.3f}** (target ≤ 1.10)."
        + (
            " *before*: the ratio measured the same way on the code before lean mode drew a "
            "direction's small parameters in one call (`benchmarks/results/zo_draws/before.json`)."
            if before
            else ""
        ),
    ]
    return command_section(intro, str(rec["command"]), markdown_table(head, body, left=3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--bench-zo-only", action="store_true", help="only fedge bench zo's steps")
    parser.add_argument("--models", nargs="+", default=["lenet", "lenet5"])
    parser.add_argument("--json", help="write the bench zo rows as a record here")
    parser.add_argument("--before", help="an earlier record whose ratios to show alongside")
    parser.add_argument("--docs", help="write the zo-draws section of this Markdown file")
    parser.add_argument("--render", help="measure nothing: write --docs from this record")
    args = parser.parse_args()
    title = "Portable draws: zeroth-order step time against torch's generator"
    if args.render:
        rec = json.loads(Path(args.render).read_text())
        before = json.loads(Path(args.before).read_text()) if args.before else None
        publish(markdown(rec, before), args.docs, "zo-draws", title, machine=str(rec["machine"]))
        return
    elements = 26_730 * K
    results = {} if args.bench_zo_only else measure(args.rounds)
    results |= measure_bench_zo(args.rounds, args.models)
    for task, r in results.items():
        t, p = r["torch_s"], r["portable_s"]
        line = f"{task:32s} torch {t * 1e3:8.2f} ms   portable {p * 1e3:8.2f} ms"
        line += f"   portable/torch {r['ratio']:.3f}"
        if "draw" in task:
            line += f"   ({t / elements * 1e9:.2f} vs {p / elements * 1e9:.2f} ns/value)"
        print(line)
    cpus = sorted(os.sched_getaffinity(0))
    pin = f"taskset -c {','.join(map(str, cpus))} " if len(cpus) < (os.cpu_count() or 1) else ""
    command = f"OMP_NUM_THREADS=1 {pin}python benchmarks/portable_rng_cost.py " + " ".join(
        sys.argv[1:]
    )
    rec = record(results, args.rounds, command)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rec, indent=1) + "\n")
    if args.docs:
        before = json.loads(Path(args.before).read_text()) if args.before else None
        publish(markdown(rec, before), args.docs, "zo-draws", title, machine=str(rec["machine"]))


if __name__ == "__main__":
    main()
