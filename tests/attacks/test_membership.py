"""The loss-threshold membership attack against hand-computed ROC values and a real overfit model."""

from __future__ import annotations

import torch

from fedge.attacks.membership import loss_threshold_attack, roc_auc


def test_auc_by_hand() -> None:
    assert roc_auc(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 2.0])) == 1.0
    assert roc_auc(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])) == 0.0
    # pairs (pos, neg): (1,0)>, (1,2)<, (3,0)>, (3,2)> -> 3/4; one tie counts 1/2
    assert roc_auc(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 2.0])) == 0.75
    assert roc_auc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5


def test_memorized_members_are_found_and_an_untrained_model_gives_chance() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 20, generator=g)
    y = torch.randint(0, 2, (80,), generator=g)  # random labels: only memorization can fit them
    members, non = (x[:40], y[:40]), (x[40:], y[40:])
    model = torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    fresh = loss_threshold_attack(model, members, non)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(members[0]), members[1]).backward()
        opt.step()
    trained = loss_threshold_attack(model, members, non)
    assert trained.auc > 0.9 and trained.best_precision > 0.9
    assert 0.25 < fresh.auc < 0.75  # no training, no signal (40 vs 40 samples)
