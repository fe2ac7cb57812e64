"""The device check: on a machine with a CUDA GPU, in under five minutes, run fedge's tests that
need CUDA (marked ``needs_cuda``) and compare one round of FedAvg and one of BAFFLE on the GPU with
the same round on the CPU; print a short Markdown report and exit 1 if a check fails.

    python benchmarks/device_check.py             # the report on stdout
    python benchmarks/device_check.py --out DIR   # also DIR/device_check.md and DIR/device_check.json

Where torch sees no CUDA device it says so and exits 2: there is nothing to check. What it
compares, on a synthetic 28x28 task (no data files needed) with BAFFLE's LeNet-5, seed 0:

- FedAvg (10 clients, one local epoch of SGD) and batch-level BAFFLE (its defaults: secure
  aggregation, EMA; ``draws: portable``; K = 50 on one batch of 64, σ = 1e-3, the server
  stepping by SGD, whose step is continuous in ĝ where Adam's first is its sign), one round
  each with ``device: cpu`` and ``device: cuda``: the initial models are equal, and the two
  models after the round differ by at most 5% of the largest step the round took (float32 sums
  in another order; TF32 is off);
- BAFFLE's perturbation directions for every parameter of the model, drawn on the GPU and on the
  CPU from the round's seed: bit for bit equal (portable draws);
- a client's peak memory on the GPU (``client_peak_bytes``, from the CUDA allocator) beside its
  tensor accounting, and the wall time of each round.

The steps and the device machine (torch with CUDA in its image, fedge's other dependencies
carried as wheels): docs/guide/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import fedge
from fedge.core.config import load_config
from fedge.estimators.directions import make_directions
from fedge.experiment.build import BuiltRun, build_run

REPO = Path(__file__).resolve().parents[1]
#: the models after one round may differ by this share of the round's largest step
STEP_SHARE = 0.05
TEST_TIMEOUT_S = 180

BASE: dict[str, Any] = {
    "seed": 0,
    "rounds": 1,
    "clients": {"num": 10, "per_round": 10},
    "dataset": {"name": "synthetic", "num_train": 2000, "num_test": 500, "shape": [1, 28, 28]},
    "partition": {"name": "iid"},
    "model": {"name": "lenet"},
    "draws": "portable",
}
CASES: dict[str, dict[str, Any]] = {
    "fedavg": {
        "name": "fedavg",
        "local_epochs": 1,
        "batch_size": 32,
        "client_optimizer": {"lr": 0.05},
    },
    "baffle": {
        "name": "baffle",
        "mode": "batch",
        "k": 50,
        "sigma": 1e-3,
        "batch_size": 64,
        "delta_loss_on": "batch",
        # Adam's first step is lr·sign(ĝ): a coordinate of ĝ near 0 flips on float roundoff
        "server_optimizer": {"name": "sgd", "lr": 0.1},
    },
}


def environment() -> dict[str, Any]:
    return {
        "fedge": fedge.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
    }


def _text(out: bytes | str | None) -> str:
    """A subprocess's captured output as text: ``TimeoutExpired`` keeps it as bytes even with
    ``text=True`` (and None where nothing was captured)."""
    if out is None:
        return ""
    return out.decode(errors="replace") if isinstance(out, bytes) else out


def run_cuda_tests() -> dict[str, Any]:
    """pytest on every test file that marks a test ``needs_cuda``, those tests only, with
    FEDGE_REQUIRE_CUDA=1 (a skip would be a failure)."""
    files = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("test_*.py")
        if "mark.needs_cuda" in p.read_text()
    )
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider"]
    cmd += ["-q", "-rfEs", "-m", "needs_cuda", *files]
    env = {**os.environ, "FEDGE_REQUIRE_CUDA": "1"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S
        )
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = f"{_text(exc.stdout)}{_text(exc.stderr)}\ntimed out after {TEST_TIMEOUT_S} s"
        rc = 124
    lines = [line for line in out.splitlines() if line.strip()]
    return {
        "files": files,
        "rc": rc,
        "summary": lines[-1] if lines else "(no output)",
        "seconds": round(time.perf_counter() - t0, 1),
        "output": out[-4000:],
        "ok": rc == 0,
    }


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _server_model(built: BuiltRun) -> torch.nn.Module:
    """The model of the method's own (bare) strategy: the server's model of FedAvg and BAFFLE."""
    model = getattr(built.method.bare, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"method {built.config.method.name!r}: its strategy "
            f"({type(built.method.bare).__name__}) has no .model to compare; give CASES methods "
            "whose strategy holds the server's model (fedavg, baffle)"
        )
    return model


def one_round(method: dict[str, Any], device: str) -> dict[str, Any]:
    """Build and run one round on ``device``: the initial and final weights (on the CPU), the
    round's metrics line, the wall time, and the built run. Memory is measured on the GPU only
    (the CPU's tensor accounting of every op would dominate the CPU round's time)."""
    memory = {"memory": device != "cpu"}
    built = build_run(load_config({**BASE, "method": method, "device": device, "measure": memory}))
    model = _server_model(built)
    before = _state(model)
    lines: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    built.simulation(on_round=lambda line, sim: lines.append(line)).run()
    if device != "cpu":
        torch.cuda.synchronize()
    return {
        "before": before,
        "after": _state(model),
        "line": lines[0],
        "seconds": time.perf_counter() - t0,
        "built": built,
    }


def compare(name: str) -> dict[str, Any]:
    method = CASES[name]
    cpu, gpu = one_round(method, "cpu"), one_round(method, "cuda")
    same_start = all(torch.equal(cpu["before"][k], gpu["before"][k]) for k in cpu["before"])
    step = max(float((cpu["after"][k] - cpu["before"][k]).abs().max()) for k in cpu["after"])
    diff = max(float((gpu["after"][k] - cpu["after"][k]).abs().max()) for k in cpu["after"])
    out: dict[str, Any] = {
        "same_initial_model": same_start,
        "largest_step": step,
        "largest_difference": diff,
        "difference_share_of_step": diff / step if step else None,
        "cpu_s": round(cpu["seconds"], 2),
        "cuda_s": round(gpu["seconds"], 2),
        "cpu_test_accuracy": cpu["line"]["test_accuracy"],
        "cuda_test_accuracy": gpu["line"]["test_accuracy"],
        "cuda_client_peak_bytes": gpu["line"].get("client_peak_bytes"),
        "cuda_client_tensor_peak_bytes": gpu["line"].get("client_tensor_peak_bytes"),
        "cpu_client_peak_bytes": cpu["line"].get("client_peak_bytes"),
    }
    ok = same_start and step > 0 and diff <= STEP_SHARE * step
    if name == "baffle":
        out["directions_bit_identical"] = directions_equal(gpu["built"])
        ok = ok and out["directions_bit_identical"]
    out["ok"] = ok
    return out


def directions_equal(built: Any) -> bool:
    """Every parameter's K directions for round 1's seed, on the GPU and the CPU: equal bits."""
    strategy = built.method.bare
    spec, seed = strategy.spec, strategy.round_seed(1)
    shapes = {n: tuple(p.shape) for n, p in strategy.params().items()}
    on_gpu = make_directions(spec.directions, shapes, spec.k, draws=spec.draws, device=spec.device)
    on_cpu = make_directions(spec.directions, shapes, spec.k, draws=spec.draws)
    for name, shape in shapes.items():
        z = on_gpu.draw(seed, range(spec.k), name, shape)
        if z.device.type != "cuda" or not torch.equal(
            z.cpu(), on_cpu.draw(seed, range(spec.k), name, shape)
        ):
            return False
    return True


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def report(env: dict[str, Any], tests: dict[str, Any], cases: dict[str, Any]) -> str:
    lines = [
        "# fedge device check",
        "",
        f"fedge {env['fedge']}, Python {env['python']}, torch {env['torch']} (CUDA {env['cuda']}), "
        f"{env['gpus']} x {env['gpu']}",
        "",
        f"**needs_cuda tests** ({', '.join(tests['files'])}): {tests['summary']} "
        f"({tests['seconds']} s) — {'ok' if tests['ok'] else 'FAILED'}",
        "",
        "**One round, CPU vs CUDA** (the models may differ by at most "
        f"{STEP_SHARE:.0%} of the round's largest step):",
        "",
        "| method | same start | largest step | largest difference | share | accuracy cpu / cuda "
        "| CPU s | CUDA s | client peak MiB (CUDA / tensors) | directions bit-identical | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in cases.items():
        share = c["difference_share_of_step"]
        lines.append(
            f"| {name} | {c['same_initial_model']} | {c['largest_step']:.3g} | "
            f"{c['largest_difference']:.3g} | {'-' if share is None else f'{share:.2%}'} | "
            f"{c['cpu_test_accuracy']:.3f} / {c['cuda_test_accuracy']:.3f} | {c['cpu_s']} | "
            f"{c['cuda_s']} | {_mib(c['cuda_client_peak_bytes'])} / "
            f"{_mib(c['cuda_client_tensor_peak_bytes'])} | "
            f"{c.get('directions_bit_identical', '-')} | {'ok' if c['ok'] else 'FAILED'} |"
        )
    if not tests["ok"]:
        lines += ["", "```", tests["output"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write device_check.md and .json here")
    parser.add_argument("--skip-tests", action="store_true", help="only the CPU/CUDA comparison")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            f"torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda or 'none'}): "
            "nothing to check here; run this on a machine with an NVIDIA GPU (docs/guide/gpu.md)"
        )
        return 2
    env = environment()
    tests = (
        {
            "files": [],
            "rc": 0,
            "summary": "skipped (--skip-tests)",
            "seconds": 0,
            "output": "",
            "ok": True,
        }
        if args.skip_tests
        else run_cuda_tests()
    )
    cases = {name: compare(name) for name in CASES}
    text = report(env, tests, cases)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "device_check.md").write_text(text)
        record = {"environment": env, "tests": tests, "cases": cases}
        (args.out / "device_check.json").write_text(json.dumps(record, indent=2, default=str))
    return 0 if tests["ok"] and all(c["ok"] for c in cases.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
