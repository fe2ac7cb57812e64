"""Model <-> message arrays (dense and sparse), and the server's GlobalModel."""

import pytest
import torch

from fedge.core import transforms as T
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.methods.base import GlobalModel, model_message_arrays, unpack_model_arrays


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _masks(model, density):
    g = torch.Generator().manual_seed(1)
    return {n: torch.rand(p.shape, generator=g) < density for n, p in model.named_parameters() if n.endswith("weight")}


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


def test_sparse_model_is_smaller_than_dense_at_low_density():
    model = _model()
    masks = _masks(model, 0.1)
    sparse = Message(model_message_arrays(model, masks)).nbytes
    dense = Message(model_message_arrays(model)).nbytes
    assert sparse < 0.3 * dense


def test_dense_passes_through_and_bad_sparse_is_rejected():
    model = _model()
    arrays, masks = unpack_model_arrays(model_message_arrays(model), model.state_dict())
    assert masks is None
    bad = model_message_arrays(model, _masks(model, 0.5))
    bad["0.weight"] = bad["0.weight"][:-1]
    with pytest.raises(MessageError, match="kept values"):
        unpack_model_arrays(bad, model.state_dict())


def test_global_model_keeps_pruned_coordinates_zero():
    model = _model()
    masks = _masks(model, 0.3)
    gm = GlobalModel(model, T.adam(0.1), masks=masks)
    for n, m in masks.items():
        assert torch.all(model.get_parameter(n)[~m] == 0)
    gm.step({k: torch.ones_like(v) for k, v in gm.params().items()})
    for n, m in masks.items():
        assert torch.all(model.get_parameter(n)[~m] == 0)
        assert torch.all(model.get_parameter(n)[m] != 0)
