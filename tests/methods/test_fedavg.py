"""FedAvg/FedSGD against hand-computed two-client examples (Prepare / Execute / Assert)."""

import pytest
import torch

from fedge.core import transforms as T
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.methods.fedavg import DeltaAveraging


def _model():
    m = torch.nn.Linear(2, 1)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[1.0, 2.0]]))
        m.bias.fill_(0.5)
    return m


def _reply(dw, db, n, loss=1.0):
    return Message(
        {"weight": torch.tensor([dw]), "bias": torch.tensor([db])},
        {"num_samples": n},
        {"train_loss": loss},
    )


def test_fedavg_two_clients_weighted_by_samples():
    strat = DeltaAveraging(_model(), T.sgd(1.0), replies_are_gradients=False)
    msgs = strat.configure_round(1, [0, 1])
    assert msgs[0] is msgs[1]  # one broadcast
    assert torch.equal(msgs[0].arrays["weight"], torch.tensor([[1.0, 2.0]]))
    out = strat.aggregate_round(
        1, {0: _reply([1.0, 0.0], 1.0, 1, loss=2.0), 1: _reply([0.0, 3.0], -1.0, 3, loss=1.0)}
    )
    # Δ = 1/4 Δ0 + 3/4 Δ1 = [0.25, 2.25], bias 0.25 - 0.75 = -0.5
    assert torch.allclose(strat.model.weight, torch.tensor([[1.25, 4.25]]))
    assert torch.allclose(strat.model.bias, torch.tensor([0.0]))
    assert out["train_loss"] == pytest.approx(0.25 * 2.0 + 0.75 * 1.0)


def test_uniform_weighting_and_server_lr():
    strat = DeltaAveraging(_model(), T.sgd(0.5), replies_are_gradients=False, weighting="uniform")
    strat.aggregate_round(1, {0: _reply([2.0, 0.0], 0.0, 1), 1: _reply([0.0, 2.0], 0.0, 99)})
    assert torch.allclose(strat.model.weight, torch.tensor([[1.5, 2.5]]))


def test_fedsgd_gradient_descent_step():
    strat = DeltaAveraging(_model(), T.sgd(0.1), replies_are_gradients=True)
    strat.aggregate_round(1, {0: _reply([1.0, 1.0], 1.0, 1), 1: _reply([3.0, 3.0], 3.0, 1)})
    # mean gradient 2 -> w - 0.2
    assert torch.allclose(strat.model.weight, torch.tensor([[0.8, 1.8]]))
    assert torch.allclose(strat.model.bias, torch.tensor([0.3]))


def test_bad_replies_are_rejected_with_client_named():
    strat = DeltaAveraging(_model(), T.sgd(1.0), replies_are_gradients=False)
    with pytest.raises(MessageError, match="client 7"):
        strat.aggregate_round(1, {7: Message({"weight": torch.zeros(1, 2)}, {"num_samples": 1})})
    with pytest.raises(MessageError, match="shape"):
        strat.aggregate_round(
            1, {7: Message({"weight": torch.zeros(2), "bias": torch.zeros(1)}, {"num_samples": 1})}
        )
    with pytest.raises(MessageError, match="num_samples"):
        strat.aggregate_round(1, {7: _reply([0.0, 0.0], 0.0, 0)})


def test_state_dict_round_trip_restores_model_and_optimizer():
    a = DeltaAveraging(_model(), T.adam(0.1), replies_are_gradients=True)
    a.aggregate_round(1, {0: _reply([1.0, -1.0], 0.5, 1)})
    b = DeltaAveraging(_model(), T.adam(0.1), replies_are_gradients=True)
    b.load_state_dict(a.state_dict())
    for s in (a, b):
        s.aggregate_round(2, {0: _reply([0.3, 0.2], 0.1, 1)})
    assert torch.equal(a.model.weight, b.model.weight) and torch.equal(a.model.bias, b.model.bias)
