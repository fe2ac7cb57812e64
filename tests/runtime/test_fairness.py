"""q-FFL's per-client statistics against hand computations, and per-client evaluation."""

from __future__ import annotations

import pytest
import torch

from fedge.runtime.fairness import FAIRNESS_KEYS, client_accuracies, fairness_stats


def test_four_statistics_of_a_known_vector():
    # N = 12 clients, k = ceil(1.2) = 2: worst 10% = mean(0.0, 0.1), best 10% = mean(0.9, 1.0)
    accs = [0.5, 0.1, 0.9, 0.3, 0.0, 1.0, 0.6, 0.4, 0.2, 0.8, 0.7, 0.5]
    s = fairness_stats(accs)
    mean = sum(accs) / 12  # 6.0 / 12 = 0.5
    assert s["client_acc_mean"] == pytest.approx(0.5)
    assert s["client_acc_worst10"] == pytest.approx(0.05)
    assert s["client_acc_best10"] == pytest.approx(0.95)
    # population variance, by hand: deviations 0, ±.1 (x2), ±.2 (x2), ±.3 (x2), ±.4 (x2),
    # ±.5 (x2), 0: squares sum to 2 * (.01 + .04 + .09 + .16 + .25) = 1.10, over N = 12
    assert sum((a - mean) ** 2 for a in accs) == pytest.approx(1.10)
    assert s["client_acc_var"] == pytest.approx(1.10 / 12)
    assert tuple(s) == FAIRNESS_KEYS


def test_ten_or_fewer_clients_take_the_single_extreme_and_none_is_left_out():
    s = fairness_stats([0.25, None, 0.75, 0.5])  # N = 3 evaluated, k = 1
    assert s == pytest.approx(
        {
            "client_acc_mean": 0.5,
            "client_acc_worst10": 0.25,
            "client_acc_best10": 0.75,
            "client_acc_var": (0.0625 + 0.0625) / 3,
        }
    )
    # N = 11: k = ceil(1.1) = 2, not 1
    s = fairness_stats([0.0, 0.2] + [0.5] * 9)
    assert s["client_acc_worst10"] == pytest.approx(0.1)
    assert fairness_stats([None, None]) == {}


def test_client_accuracies_of_a_fixed_classifier():
    # a linear model that predicts class 1 iff x > 0
    model = torch.nn.Linear(1, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[-1.0], [1.0]]))
        model.bias.zero_()
    x = torch.tensor([[1.0], [-1.0], [2.0], [-3.0]])
    splits = [
        (x, torch.tensor([1, 0, 1, 0])),  # all right
        (x, torch.tensor([0, 0, 0, 0])),  # half right
        None,
        (x[:0], torch.tensor([], dtype=torch.int64)),
    ]
    assert client_accuracies(model, splits, num_classes=2, batch_size=3) == [1.0, 0.5, None, None]
