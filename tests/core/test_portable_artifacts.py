"""What other parties rebuild from a seed, drawn with ``draws="portable"``: perturbation
directions, a FedPT frozen model, the NTK data-free pruning's inputs and ΔW, a secure
aggregation graph and a partition — bit-identical under every CPU capability (subprocesses) and
equal to committed known answers (sha256 of the bytes).

The NTK mask is checked apart: it also follows from float32 forwards and autograd, so it is the
same under every CPU capability of one machine but not across CPUs (an Intel Xeon and an AMD
EPYC, both AVX-512, gave different masks). No party rebuilds it: the server prunes and the mask
travels with the model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedge
from fedge.core.rng import PortableGenerator
from fedge.data.partition import partition
from fedge.estimators.directions import make_directions
from fedge.models import build_model
from fedge.privacy.secagg import MaskGraph
from fedge.pruning import gaussian_inputs, prunable_parameters, prune
from fedge.pruning.saliency import _setup

SEED = 20261205

# sha256 of each artifact's bytes, as artifacts() computes them (committed known answers)
KNOWN = {
    "directions-gaussian": "45305466553319a691942c31fdeb6929652c7292b1215af4391e463b39fac7bf",
    "directions-block": "762129f31590e9a04207d701e5369facff88d256334d37dea3d4936d7a50c5be",
    "directions-orthogonal": "e8266dad76a82276b9dd4c5f07e77000e44db5b32c5d8e36cfed60efa7a9d5a8",
    "fedpt-frozen-model": "866ae954f3bc875d7e18d758a7934a99fdd020923fbe746bc4bec5822afbfe2e",
    "ntk-inputs": "0b86da89cd24477ecf24ac26da39d65952568b8fad0c9be5a4d52c0d68f076fd",
    "ntk-delta-w": "bd351c48a1fc493df4feb355feb56f54886b1206604ba95f702d12ce1d50a18b",
    "secagg-graph": "7979a856e101e203cf769fe7bec7823d4bb677ae2ea20739a968a1a275691ff3",
    "partition-shards": "c044b46f005bee36d7e811dcc14156b1b1812d0376387615be8bc03d257dd45c",
}


def _sha(*arrays: torch.Tensor | np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        t = a.detach().contiguous() if isinstance(a, torch.Tensor) else torch.from_numpy(a)
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def _lenet() -> torch.nn.Module:
    return build_model("lenet", input_shape=(1, 8, 8), num_classes=10, seed=SEED, draws="portable")


def artifacts() -> dict[str, str]:
    """Each artifact's sha256, drawn from SEED with portable draws (``ntk-mask`` beside them,
    which is not in KNOWN: see the module docstring)."""
    out: dict[str, str] = {}
    net = _lenet()
    shapes = {n: tuple(p.shape) for n, p in net.named_parameters()}
    for kind in ("gaussian", "block", "orthogonal"):
        dirs = make_directions(kind, shapes, 12, draws="portable")
        out[f"directions-{kind}"] = _sha(
            *(dirs.draw(SEED, range(12), n, s) for n, s in shapes.items())
        )
    fedpt = build_model(
        "cnn-fedpt", input_shape=(1, 28, 28), num_classes=10, seed=SEED, draws="portable"
    )
    out["fedpt-frozen-model"] = _sha(*fedpt.state_dict().values())
    # NTK-Rand: the inputs and ΔW of the first pruning round, then the mask after 3 rounds
    gen = PortableGenerator(SEED, "prune")
    x = gaussian_inputs((1, 8, 8), 4, generator=gen)
    out["ntk-inputs"] = _sha(x)
    _, _, noise = _setup(net, None, x, 1e-6, 1, gen)
    out["ntk-delta-w"] = _sha(*(noise[0][n] for n in prunable_parameters(net)))
    masks = prune(
        net,
        density=0.1,
        rounds=3,
        score="ntk",
        generator=PortableGenerator(SEED, "prune"),
        input_shape=(1, 8, 8),
        num_inputs=4,
    )
    out["ntk-mask"] = _sha(*masks.values())
    graph = MaskGraph.harary(range(40), 6, seed=SEED, round=3, draws="portable")
    adjacency = np.array([sorted(graph.neighbors(u)) for u in range(40)], dtype=np.int64)
    out["secagg-graph"] = _sha(adjacency)
    labels = np.arange(600) % 10
    parts = partition("shards", labels, 20, seed=SEED, draws="portable")
    out["partition-shards"] = _sha(*parts)
    return out


def _portable(got: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in got.items() if k != "ntk-mask"}


def test_known_answers() -> None:
    assert _portable(artifacts()) == KNOWN


def _capabilities() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    caps = ["default"]
    caps += ["avx2"] if " avx2" in flags else []
    caps += ["avx512"] if " avx512f" in flags else []
    return caps


_PROBE = """
import json, torch, sys
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from core.test_portable_artifacts import artifacts
print(json.dumps({{"capability": torch.backends.cpu.get_cpu_capability(),
                   "artifacts": artifacts()}}))
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
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        seen[cap] = json.loads(out.strip().splitlines()[-1])
        assert seen[cap]["capability"].lower() == cap
    for cap, got in seen.items():
        assert _portable(got["artifacts"]) == KNOWN, cap
    masks = {cap: got["artifacts"]["ntk-mask"] for cap, got in seen.items()}
    assert len(set(masks.values())) == 1, masks  # one machine: the same under every kernel set
