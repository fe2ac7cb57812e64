import torch
from torch.utils.flop_counter import FlopCounterMode

from fedge.core.meter import FlopCounter, Meter, TensorAccountant
from fedge.runtime.evaluate import evaluate


def test_flop_counter_matches_torch_flop_counter_mode():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)
    )
    x = torch.randn(5, 1, 8, 8)
    with FlopCounter() as lite:
        model(x).sum().backward()
    with FlopCounterMode(display=False) as full:
        model(x).sum().backward()
    assert lite.flops == full.get_total_flops() > 0


def test_tensor_accountant_peak_of_known_allocations():
    acc = TensorAccountant()
    with acc:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 B
        b = torch.empty(2000, dtype=torch.float32)  # 8000 B, both alive: 12000
        del a
        c = torch.empty(500, dtype=torch.float32)  # 8000 + 2000
        v = b.view(10, 200)  # a view adds nothing
        del b, c, v
    assert acc.peak == 12000
    assert acc.current == 0


def test_tensor_accountant_sees_saved_activations():
    lin = torch.nn.Linear(100, 100)
    x = torch.randn(64, 100)
    with TensorAccountant() as inference:
        with torch.no_grad():
            lin(torch.tanh(lin(x)))
    with TensorAccountant() as training:
        lin(torch.tanh(lin(x))).sum().backward()
    assert training.peak > inference.peak


def test_meter_reports_resident_model_plus_transient():
    meter = Meter(flops=True, memory=True)
    lin = torch.nn.Linear(10, 10)
    meter.resident = lin
    with meter.measure():
        torch.empty(250)
    assert meter.stats.tensor_peak_bytes == 1000 + 4 * (100 + 10)
    assert meter.stats.wall_s > 0


def test_evaluate_top1_top5_and_loss():
    logits = torch.tensor(
        [[5.0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9.0]]
    )

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return logits[x.long().squeeze(1)]

    x = torch.tensor([[0.0], [1.0]])
    out = evaluate(Fixed(), x, torch.tensor([1, 11]), num_classes=12)
    assert out["test_accuracy"] == 0.5 and out["test_top5"] == 1.0
    expected = float(torch.nn.functional.cross_entropy(logits, torch.tensor([1, 11])))
    assert abs(out["test_loss"] - expected) < 1e-6
    assert "test_top5" not in evaluate(Fixed(), x, torch.tensor([1, 0]), num_classes=10)


def test_effective_flops_ratio_by_hand():
    from fedge.core.meter import effective_flops_ratio

    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 5))
    masks = {"0.weight": torch.rand(20, 10) < 2, "2.weight": torch.zeros(5, 20, dtype=torch.bool)}
    masks["0.weight"][:10] = False  # half of layer 0 kept, none of layer 2
    # FLOPs: layer 0: 2*10*20 = 400 per sample, layer 2: 2*20*5 = 200 per sample
    ratio = effective_flops_ratio(model, masks, torch.zeros(3, 10))
    assert abs(ratio - (200 / 600)) < 1e-9
    assert effective_flops_ratio(model, {}, torch.zeros(3, 10)) == 1.0


def test_views_and_in_place_updates_of_resident_weights_are_not_step_memory():
    lin = torch.nn.Linear(100, 100)
    meter = Meter(flops=False, memory=True)
    with meter.measure():
        meter.resident = lin
        with torch.no_grad():
            lin.weight.t()  # a view of resident storage
            lin.weight.add_(1.0)  # an in-place update
    assert meter.stats.tensor_peak_bytes == 4 * (100 * 100 + 100)


def test_on_a_cuda_device_the_meter_reads_the_allocators_peak_per_step(monkeypatch):
    """Meter(device=cuda, memory=True): reset_peak_memory_stats when the step starts, then
    max_memory_allocated less what was allocated at the start, plus the resident model (a fake
    allocator that starts at 1000 bytes and peaks at 9000: the oracle is 8000 + the model's
    440 bytes). Off CUDA the figure is absent, and without memory nothing is read."""
    import fedge.core.device as D

    allocated = {"now": 1000, "peak": 9000}
    resets = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: resets.append(d))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: allocated["peak"])
    gpu = torch.device("cuda", 0)
    lin = torch.nn.Linear(10, 10)
    meter = Meter(flops=False, memory=True, device=gpu)
    meter.resident = lin
    with meter.measure():
        torch.empty(250)
    assert resets == [gpu]
    assert meter.stats.device_peak_bytes == 8000 + 4 * (100 + 10)
    assert meter.stats.tensor_peak_bytes == 1000 + 4 * (100 + 10)  # the accounting, as before
    assert D.device_peak(None, 0) is None
    off = Meter(flops=False, memory=False, device=gpu)
    with off.measure():
        pass
    assert off.stats.device_peak_bytes is None and resets == [gpu]
    cpu = Meter(flops=False, memory=True, device=torch.device("cpu"))
    with cpu.measure():
        torch.empty(250)
    assert cpu.stats.device_peak_bytes is None and cpu.stats.tensor_peak_bytes == 1000


def test_tensor_accountant_meters_forward_mode_ad():
    """Under torch.func.jvp, forward AD makes a zero tangent as a storage-less zero tensor (it
    crashed the accountant); the pass is metered: its peak holds at least the output and its
    tangent (5 x 4 float32 each)."""
    from torch.func import functional_call, jvp

    lin = torch.nn.Linear(8, 4)
    x = torch.randn(5, 8)
    params = dict(lin.named_parameters())
    tangents = {k: torch.randn_like(v) for k, v in params.items()}
    with TensorAccountant(resident=[x, *params.values()]) as acc:
        out, tangent = jvp(lambda p: functional_call(lin, p, (x,)), (params,), (tangents,))
    assert out.shape == tangent.shape == (5, 4)
    assert acc.peak >= 2 * 5 * 4 * 4
