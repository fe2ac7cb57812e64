"""The run-level ``device`` key: ``device: cpu`` is the run without the key (metrics and model
bit for bit), ``auto`` is the CPU where torch sees no GPU, the resolved device reaches every
part that makes tensors (the server's and the clients' models, the clients' data, the
estimator's draws, the engine's steps), and what cannot run on a GPU yet is refused by name.

The tests that need a GPU (``needs_cuda``, tests/accelerators.py) compare one round on CUDA with
the same round on the CPU: the portable perturbation directions bit for bit, the models within
float tolerance (stated at each test), and a client's peak memory read from the CUDA allocator.
``benchmarks/device_check.py`` runs them on a machine with a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.context import ClientData
from fedge.core.errors import ConfigError
from fedge.core.messages import Message
from fedge.estimators import estimate_gradient
from fedge.estimators.directions import make_directions
from fedge.estimators.spec import ZerothOrderSpec
from fedge.experiment import build as B
from fedge.experiment.build import build_run
from fedge.experiment.run import run_experiment
from fedge.runtime.executor import ClientTask, execute_client
from tests_helpers import metrics_without_wall

META = torch.device("meta")  # a device torch runs shapes on without a GPU: where tensors go


def _baffle(tiny, **kw):
    method = {"name": "baffle", "mode": "batch", "k": 8, "batch_size": 16, "sigma": 1e-3}
    return tiny(model={"name": "logreg"}, method=method, draws="portable", **kw)


def _unwrap(side, kind):
    """The layer of type ``kind`` in a composed side (each wrapper holds ``inner``)."""
    while not isinstance(side, kind):
        side = side.inner
    return side


def _on(module: torch.nn.Module, device: torch.device) -> bool:
    tensors = [*module.parameters(), *module.buffers()]
    return bool(tensors) and all(t.device == device for t in tensors)


# ---- device: cpu, the default ------------------------------------------------------------------


@pytest.mark.parametrize("which", ["fedavg", "baffle"])
def test_device_cpu_is_the_run_without_the_key(tmp_path: Path, tiny, which):
    """The same metrics (all but wall time) and the same final model, bit for bit."""
    make = (
        (lambda **kw: tiny(rounds=2, **kw))
        if which == "fedavg"
        else (lambda **kw: _baffle(tiny, rounds=2, **kw))
    )
    without = make()
    assert "device" not in without
    a = run_experiment(load_config(without), out=tmp_path / "a", render=False)
    b = run_experiment(load_config(make(device="cpu")), out=tmp_path / "b", render=False)
    assert metrics_without_wall(a) == metrics_without_wall(b)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: auto takes it")
def test_auto_runs_on_the_cpu_where_torch_sees_no_gpu(tiny):
    built = build_run(load_config(tiny(device="auto")))
    assert built.device == torch.device("cpu") and built.engine_config().device == built.device
    assert _on(built.method.bare.model, torch.device("cpu"))


# ---- the resolved device reaches every part ----------------------------------------------------


@pytest.fixture
def on_meta(monkeypatch):
    """Runs built as if ``device`` resolved to torch's meta device: every tensor a part makes
    on the run's device is a meta tensor, every one it leaves on the CPU is not."""
    monkeypatch.setattr(B, "resolve_device", lambda value: META)


def test_fedavg_builds_its_models_and_data_on_the_run_device(tiny, on_meta):
    from fedge.methods.local import LocalTraining

    built = build_run(load_config(tiny()))
    assert built.device == META
    engine = built.engine_config()
    assert engine.device == META and engine.step_settings({}).device == META
    assert _on(built.method.bare.model, META)  # the server's model
    assert _on(_unwrap(built.method.program, LocalTraining).model, META)  # the clients' model
    assert all(c.x.device == META and c.y.device == META for c in built.clients)
    assert built.clients[0].x is built.clients[1].x  # the training set moved once, shared
    assert built.clients[0].indices.device.type == "cpu"  # shuffled by the CPU generator
    assert _on(built.model_fn(), torch.device("cpu"))  # export, attacks: the CPU model


@pytest.mark.parametrize("mode", ["batch", "epoch"])
def test_baffle_hands_the_run_device_to_its_estimator_on_both_sides(tiny, on_meta, mode):
    from fedge.methods.baffle import BaffleBatchClient, BaffleBatchStrategy

    cfg = _baffle(tiny)
    cfg["method"]["mode"] = mode
    built = build_run(load_config(cfg))
    strategy, program = built.method.bare, built.method.program
    assert _on(strategy.model, META)
    if mode == "batch":
        assert isinstance(strategy, BaffleBatchStrategy)
        assert strategy.spec.device == META and strategy.spec.draws == "portable"
        client = _unwrap(program, BaffleBatchClient)
        assert client.spec.device == META and _on(client.local.model, META)
    else:  # the epoch mode's estimator is a closure of the local training: it draws on META
        from fedge.methods.local import LocalTraining

        local = _unwrap(program, LocalTraining)
        assert _on(local.model, META)
        cell = local.gradient_fn.__closure__
        specs = [c.cell_contents for c in cell if isinstance(c.cell_contents, ZerothOrderSpec)]
        assert [s.device for s in specs] == [META]


def test_a_client_step_runs_on_the_engine_device_with_its_data_there():
    seen = {}

    class Probe:
        def run(self, message: Message, ctx) -> Message:
            seen.update(x=ctx.data.x.device, y=ctx.data.y.device, idx=ctx.data.indices.device)
            seen["meter"] = ctx.meter.device
            return Message({"n": torch.tensor([ctx.data.num_samples])})

    data = ClientData(torch.zeros(6, 2), torch.zeros(6, dtype=torch.int64), torch.arange(3))
    task = ClientTask(0, 1, 0, Message().to_bytes(), None, None, {})
    kw = dict(seed=0, measure_flops=False, measure_memory=False, parties={})
    result = execute_client(Probe(), data, task, device=META, **kw)
    assert seen == {"x": META, "y": META, "idx": torch.device("cpu"), "meter": META}
    assert Message.from_bytes(result.reply).arrays["n"].tolist() == [3]
    execute_client(Probe(), data, task, **kw)  # no device: the data stays where it is
    assert seen["x"] == torch.device("cpu") and seen["meter"] is None
    assert data.to(torch.device("cpu")) is data


@pytest.mark.parametrize("draws", ["portable", "torch"])
@pytest.mark.parametrize("kind", ["gaussian", "orthogonal", "block"])
def test_directions_are_drawn_on_the_device_and_are_the_cpu_draws_there(draws, kind):
    shapes = {"fc.weight": (3, 4), "fc.bias": (3,)}
    cpu = make_directions(kind, shapes, 6, draws=draws)
    same = make_directions(kind, shapes, 6, draws=draws, device=torch.device("cpu"))
    meta = make_directions(kind, shapes, 6, draws=draws, device=META)
    for name, shape in shapes.items():
        z = cpu.draw(7, range(6), name, shape)
        assert z.device.type == "cpu" and torch.equal(same.draw(7, range(6), name, shape), z)
        on = meta.draw(7, range(6), name, shape)
        assert on.device == META and on.shape == z.shape and on.dtype == z.dtype


def test_the_server_rebuilds_the_estimate_on_the_spec_device():
    shapes = {"fc.weight": torch.Size([3, 4]), "fc.bias": torch.Size([3])}
    diffs = torch.linspace(-1, 1, 6)
    spec = ZerothOrderSpec(k=6, sigma=1e-3, scheme="forward", draws="portable")
    cpu = estimate_gradient(shapes, diffs, spec, seed=3)
    same = estimate_gradient(
        shapes, diffs, ZerothOrderSpec(**{**spec.__dict__, "device": torch.device("cpu")}), seed=3
    )
    assert all(torch.equal(cpu[n], same[n]) for n in shapes)
    meta = estimate_gradient(
        shapes, diffs, ZerothOrderSpec(**{**spec.__dict__, "device": META}), seed=3
    )
    assert all(meta[n].device == META and meta[n].shape == shapes[n] for n in shapes)
    with pytest.raises(ConfigError, match="device must be a torch.device"):
        ZerothOrderSpec(k=6, sigma=1e-3, scheme="forward", device="cuda")  # type: ignore[arg-type]


# ---- what does not run on a GPU yet is refused -------------------------------------------------


def test_a_method_not_yet_placed_on_the_device_is_refused_by_name(tiny, on_meta):
    cfg = tiny(method={"name": "fedprox", "mu": 0.01})
    with pytest.raises(ConfigError, match=r"method 'fedprox' runs on the CPU only.*set device=cpu"):
        build_run(load_config(cfg))


def test_workers_on_a_gpu_are_refused(tiny, on_meta):
    with pytest.raises(ConfigError, match=r"clients.workers=2: forked worker processes"):
        build_run(load_config(tiny(**{"clients.workers": 2})))


def test_flower_runtimes_on_a_gpu_are_refused(tiny, on_meta):
    pytest.importorskip("flwr")
    built = build_run(load_config(tiny()))
    with pytest.raises(ConfigError, match=r"engine runtime only.*flower-sim"):
        built.simulation(runtime="flower-sim")


# ---- on a GPU -----------------------------------------------------------------------------------

#: FedAvg on the tiny MLP, one round on CUDA vs the CPU: |W_cuda − W_cpu| <= ATOL + RTOL·|W_cpu|
#: coordinate-wise (float32 sums in another order; no TF32 on linear layers by default), while
#: the round moved the weights by far more (checked), so a GPU run that did not train would fail.
FEDAVG_RTOL, FEDAVG_ATOL = 1e-3, 1e-4
#: BAFFLE: each ΔL is a difference of two float32 losses σ apart, so its roundoff is relative to
#: ΔL, not to W; the models may differ by at most this share of the largest step the round took.
#: The server steps by SGD here: Adam's first step is lr·sign(ĝ), which a coordinate of ĝ near 0
#: flips on float roundoff (a difference of 2·lr that says nothing about the device).
BAFFLE_STEP_SHARE = 0.02
SGD_SERVER = {"method.server_optimizer": {"name": "sgd", "lr": 0.1}}


def _one_round(cfg: dict) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """(initial weights, weights after one round, the round's metrics line) on the CPU."""
    built = build_run(load_config(cfg))
    strategy = built.method.bare
    before = {k: v.detach().to("cpu", copy=True) for k, v in strategy.model.state_dict().items()}
    lines: list[dict] = []
    built.simulation(on_round=lambda line, sim: lines.append(line)).run()
    after = {k: v.detach().to("cpu", copy=True) for k, v in strategy.model.state_dict().items()}
    return before, after, lines[0]


DP = {"privacy.mechanism": "gaussian", "privacy.clip": 1.0, "privacy.noise_multiplier": 0.5}


@pytest.mark.needs_cuda
@pytest.mark.parametrize("extra", [{}, DP], ids=["plain", "dp"])
def test_fedavg_one_round_on_cuda_matches_the_cpu(tiny, extra):
    """DP's clipping and noise act on the uploads, CPU tensors on both runs (the same noise)."""
    before, cpu, _ = _one_round(tiny(rounds=1, **extra))
    b_cuda, cuda, line = _one_round(tiny(rounds=1, device="cuda", **extra))
    assert all(torch.equal(before[k], b_cuda[k]) for k in before)  # the same initial model
    step = max(float((cpu[k] - before[k]).abs().max()) for k in cpu)
    assert step > 100 * FEDAVG_ATOL
    for k in cpu:
        torch.testing.assert_close(cuda[k], cpu[k], rtol=FEDAVG_RTOL, atol=FEDAVG_ATOL)
    assert 0 <= line["test_accuracy"] <= 1


@pytest.mark.needs_cuda
def test_baffle_perturbations_on_cuda_are_the_cpu_ones_bit_for_bit(tiny):
    """Portable draws: every parameter's K directions made on the GPU equal the CPU's."""
    built = build_run(load_config(_baffle(tiny)))
    shapes = {n: tuple(p.shape) for n, p in built.method.bare.model.named_parameters()}
    gpu = torch.device("cuda", torch.cuda.current_device())
    for kind in ("gaussian", "orthogonal", "block"):
        on_cpu = make_directions(kind, shapes, 8, draws="portable")
        on_gpu = make_directions(kind, shapes, 8, draws="portable", device=gpu)
        for seed in (0, 2**61 + 12345):
            for name, shape in shapes.items():
                z_gpu = on_gpu.draw(seed, range(8), name, shape)
                assert z_gpu.device == gpu
                assert torch.equal(z_gpu.cpu(), on_cpu.draw(seed, range(8), name, shape))


@pytest.mark.needs_cuda
def test_baffle_one_round_on_cuda_matches_the_cpu(tiny):
    """BAFFLE's batch mode with its defaults (secure aggregation of the K loss differences and
    the EMA of the global model composed onto it), portable draws."""
    assert load_config(_baffle(tiny)).draws == "portable"
    before, cpu, _ = _one_round(_baffle(tiny, rounds=1, **SGD_SERVER))
    _, cuda, _ = _one_round(_baffle(tiny, rounds=1, device="cuda", **SGD_SERVER))
    step = max(float((cpu[k] - before[k]).abs().max()) for k in cpu)
    assert step > 0
    for k in cpu:
        assert float((cuda[k] - cpu[k]).abs().max()) <= BAFFLE_STEP_SHARE * step, k


@pytest.mark.needs_cuda
def test_client_peak_memory_on_cuda_comes_from_the_cuda_allocator(tiny):
    """A client step that holds a known 8 MiB on the GPU: its peak is at least that, and the
    round's client_peak_bytes is the CUDA figure (the tensor accounting logged beside it)."""
    from fedge.core.meter import Meter, module_bytes

    gpu = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Linear(64, 64).to(gpu)
    meter = Meter(flops=False, memory=True, device=gpu)
    meter.resident = model
    with meter.measure():
        x = torch.empty(2 * 1024 * 1024, device=gpu)  # 8 MiB
        del x
    peak = meter.stats.device_peak_bytes
    assert peak is not None and 8 * 2**20 + module_bytes(model) <= peak < 9 * 2**20
    _, _, line = _one_round(tiny(rounds=1, device="cuda", **{"measure.memory": True}))
    assert line["client_peak_bytes"] > 0 and line["client_tensor_peak_bytes"] > 0
