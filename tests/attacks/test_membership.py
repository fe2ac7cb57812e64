"""The loss-threshold membership attack against hand-computed ROC values and a real overfit model."""

from __future__ import annotations

import pytest
import torch

from fedge.attacks.membership import chance_auc_std, loss_threshold_attack, roc_auc


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


def _memorizer(x: torch.Tensor, y: torch.Tensor, seed: int, steps: int = 300) -> torch.nn.Module:
    torch.manual_seed(seed)  # test-only: the model's init; the attack code itself draws nothing
    model = torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _random_labels(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 20, generator=g), torch.randint(0, 2, (n,), generator=g)


def test_precision_and_tpr_by_hand() -> None:
    from fedge.attacks.membership import scores_result

    # ranked: 4(m) 3(n) 2(m) 1(n): cuts give precision 1, 1/2, 2/3, 1/2; balanced acc. .75, .5, .75, .5
    r = scores_result(torch.tensor([4.0, 2.0]), torch.tensor([3.0, 1.0]))
    assert r.best_precision == 1.0 and r.precision == 1.0 and r.auc == 0.75
    assert r.tpr_at_1pct_fpr == 0.5  # no false positive allowed: only 4 is above the top non-member
    tied = scores_result(
        torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0])
    )  # one tie group: one cut
    assert tied.best_precision == 0.5 and tied.auc == 0.5


def test_logit_confidence_is_log_odds_of_the_label() -> None:
    from fedge.attacks.membership import logit_confidence

    model = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3))
    x, y = torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([0])
    p = torch.softmax(x.double(), -1)[0, 0]
    torch.testing.assert_close(
        logit_confidence(model, x, y), (torch.log(p) - torch.log1p(-p)).double().view(1)
    )


def test_shadow_models_and_lira_find_memorized_members_and_not_in_a_fresh_model() -> None:
    from fedge.attacks.membership import lira_offline, shadow_attack

    members, non = _random_labels(40, 0), _random_labels(40, 1)
    target = _memorizer(*members, seed=0)
    shadows = []
    for i in range(3):  # the attacker's own data, disjoint from the target's
        inside, outside = _random_labels(40, 10 + i), _random_labels(40, 20 + i)
        shadows.append((_memorizer(*inside, seed=1 + i), inside, outside))
    s = shadow_attack(target, shadows, members, non)
    lira = lira_offline(target, [m for m, _, _ in shadows], members, non)
    assert s.auc > 0.9 and s.precision > 0.8
    assert (
        lira.auc > 0.8 and lira.tpr_at_1pct_fpr > 0.2
    )  # 3 shadows, global variance: offline LiRA is weaker
    fresh = _memorizer(*members, seed=0, steps=0)
    assert 0.25 < shadow_attack(fresh, shadows, members, non).auc < 0.75
    assert 0.25 < lira_offline(fresh, [m for m, _, _ in shadows], members, non).auc < 0.75


def test_chance_auc_std_matches_the_spread_of_chance_aucs():
    """Against simulation: AUCs of scores drawn independently of membership."""
    g = torch.Generator().manual_seed(0)
    for n_pos, n_neg in ((64, 64), (12, 12), (10, 40)):
        aucs = torch.tensor(
            [
                roc_auc(torch.rand(n_pos, generator=g), torch.rand(n_neg, generator=g))
                for _ in range(4000)
            ]
        )
        assert abs(float(aucs.mean()) - 0.5) < 0.005
        assert float(aucs.std()) == pytest.approx(chance_auc_std(n_pos, n_neg), rel=0.05)
    assert chance_auc_std(64, 64) == pytest.approx(0.0512, abs=1e-4)
    with pytest.raises(ValueError, match="at least one sample of each kind, got 0 and 5"):
        chance_auc_std(0, 5)
