"""Model <-> message arrays (dense and sparse), and the server's GlobalModel."""

import pytest
import torch

from fedge.core import transforms as T
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.methods.base import GlobalModel, model_message_arrays, unpack_model_arrays


def _model(seed: int = 0):
    """Weights drawn from an explicit generator (no global RNG); no weight is exactly 0."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)  # in [0.5, 1.5)
    return model


def _masks(model, density):
    g = torch.Generator().manual_seed(1)
    return {
        n: torch.rand(p.shape, generator=g) < density
        for n, p in model.named_parameters()
        if n.endswith("weight")
    }


@pytest.mark.parametrize("density", [0.05, 0.5, 0.95])
def test_sparse_round_trip_through_real_bytes(density):
    model = _model()
    masks = _masks(model, density)
    with torch.no_grad():
        for n, m in masks.items():
            model.get_parameter(n).mul_(m)
    arrays = Message(model_message_arrays(model, masks)).to_bytes()
    dense, got = unpack_model_arrays(Message.from_bytes(arrays).arrays, model.state_dict())
    for k, v in model.state_dict().items():
        assert torch.equal(dense[k], v)
    assert all(torch.equal(got[k], masks[k]) for k in masks)


@pytest.mark.parametrize("density", [0.05, 0.5, 0.95])
def test_sparse_message_size_is_kept_values_plus_mask(density):
    """Oracle: the dense message less 4 bytes per pruned float32 coordinate, plus the mask
    encoding (at most the ceil(numel/8)-byte bitmap), plus the framing of one entry per mask."""
    from fedge.pruning import encode_masks

    model = _model()
    masks = _masks(model, density)
    arrays = model_message_arrays(model, masks)
    for n, m in masks.items():
        assert arrays[n].shape == (int(m.sum()),)
        torch.testing.assert_close(arrays[n], model.get_parameter(n).detach()[m])
    encoded = encode_masks(masks)
    for n, m in masks.items():
        assert encoded[n].numel() * encoded[n].element_size() <= (m.numel() + 7) // 8
    sparse = Message(arrays).nbytes
    dense = Message(model_message_arrays(model)).nbytes
    pruned = sum(int((~m).sum()) for m in masks.values())
    expected = dense - 4 * pruned + sum(v.numel() * v.element_size() for v in encoded.values())
    assert 0 < sparse - expected <= 32 * len(masks)  # "mask/<name>" entries' framing


def test_dense_passes_through_and_bad_sparse_is_rejected():
    model = _model()
    arrays, masks = unpack_model_arrays(model_message_arrays(model), model.state_dict())
    assert masks is None
    assert arrays.keys() == model.state_dict().keys()
    for k, v in model.state_dict().items():
        assert torch.equal(arrays[k], v)
    bad = model_message_arrays(model, _masks(model, 0.5))
    bad["0.weight"] = bad["0.weight"][:-1]
    with pytest.raises(MessageError, match="kept values"):
        unpack_model_arrays(bad, model.state_dict())


def test_global_model_keeps_pruned_coordinates_zero():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    masks = _masks(model, 0.3)
    gm = GlobalModel(model, T.adam(0.1), masks=masks)
    for n, m in masks.items():
        assert torch.all(model.get_parameter(n)[~m] == 0)
        assert torch.equal(model.get_parameter(n)[m], before[n][m])
    gm.step({k: torch.ones_like(v) for k, v in gm.params().items()})
    # Oracle: Adam's first bias-corrected step with gradient 1 is lr · 1/(1 + eps) = 0.1 down.
    for n, p in model.named_parameters():
        m = masks.get(n, torch.ones_like(p, dtype=torch.bool))
        assert torch.all(p[~m] == 0)
        torch.testing.assert_close(p[m], before[n][m] - 0.1, rtol=0, atol=1e-6)


def test_register_method_checks_its_spec() -> None:
    import pytest

    from fedge.core.errors import ConfigError
    from fedge.methods import register
    from fedge.methods.fedavg import FedAvgConfig
    from fedge.methods.spec import MethodSpec

    with pytest.raises(
        ConfigError, match=r"register_method takes a MethodSpec\(name, description, config, build\)"
    ):
        register("foo")  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"with a pydantic config class and a callable build; got"
    ):
        register(MethodSpec("bad", "d", dict, lambda cfg, env: None))  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"MethodSpec 'bad2' has config FedAvgConfig whose name is 'fedavg'"
    ):
        register(MethodSpec("bad2", "d", FedAvgConfig, lambda cfg, env: None))


def test_the_global_model_on_another_device_takes_cpu_replies_and_cpu_checkpoints():
    """A model on torch's meta device (a device tensors cannot be mixed with CPU ones, as on a
    GPU): the server optimizer steps on CPU (pseudo-)gradients and buffer deltas, a masked model
    stays masked with CPU masks, and a checkpoint read onto the CPU is restored onto the model's
    device (optimizer state included)."""
    import torch.nn as nn
    from torch.utils._pytree import tree_leaves

    meta = torch.device("meta")
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).to(meta)
    mask = {"0.weight": torch.tensor([[True, False, True], [False, True, True]])}
    server = GlobalModel(model, T.adam(0.1), masks=mask)
    grads = {k: torch.ones(p.shape) for k, p in model.named_parameters()}
    server.step(grads)
    server.add_to_buffers({k: torch.ones(b.shape) for k, b in model.named_buffers()})
    assert all(p.device == meta for p in model.parameters())
    cpu = GlobalModel(nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)), T.adam(0.1), masks=mask)
    cpu.step(grads)
    server.load_state_dict(cpu.state_dict())
    leaves = [t for t in tree_leaves(server.opt_state) if isinstance(t, torch.Tensor)]
    assert leaves and all(t.device == meta for t in leaves)
    cpu.load_state_dict(cpu.state_dict())  # on the CPU the checkpoint's tensors are kept as read
    assert all(
        t.device.type == "cpu" for t in tree_leaves(cpu.opt_state) if isinstance(t, torch.Tensor)
    )
