"""Membership inference against a released model: the loss-threshold attack (Yeom, Giacomelli,
Fredrikson, Jha 2018, "Privacy Risk in Machine Learning", Sec. 3.2 adversary).

The adversary holds the final model and a candidate sample; it says "member" when the
model's loss on it is below a threshold τ. Sweeping τ gives the ROC curve; its AUC (0.5 =
chance), the TPR at low FPR and the best precision are reported, as PPFL Table 2 reports MIA
precision. The score of a sample is its negated loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["MembershipResult", "loss_threshold_attack", "roc_auc", "sample_losses"]


@torch.no_grad()
def sample_losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> torch.Tensor:
    """Per-sample cross-entropy of ``model`` (eval mode) on (x, y)."""
    was = model.training
    model.eval()
    out = torch.cat([F.cross_entropy(model(x[i : i + batch]), y[i : i + batch], reduction="none")
                     for i in range(0, len(x), batch)])  # fmt: skip
    model.train(was)
    return out


def roc_auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie): the Mann-Whitney form of AUC."""
    p, n = pos.double().view(-1, 1), neg.double().view(1, -1)
    return float((p > n).double().mean() + 0.5 * (p == n).double().mean())


def _tpr_at(pos: torch.Tensor, neg: torch.Tensor, fpr: float) -> float:
    """TPR at the threshold that flags at most ``fpr`` of the negatives."""
    k = int(fpr * neg.numel())
    thr = neg.sort(descending=True).values[k] if k < neg.numel() else -float("inf")
    return float((pos > thr).double().mean())


@dataclass
class MembershipResult:
    auc: float
    tpr_at_1pct_fpr: float
    tpr_at_01pct_fpr: float
    best_precision: float  # max over thresholds flagging at least 1% of candidates
    members: int
    non_members: int


def loss_threshold_attack(
    model: torch.nn.Module, members: tuple[torch.Tensor, torch.Tensor], non_members: tuple[torch.Tensor, torch.Tensor]
) -> MembershipResult:
    """Yeom et al.'s attack, every threshold at once."""
    pos, neg = -sample_losses(model, *members), -sample_losses(model, *non_members)
    scores = torch.cat([pos, neg])
    truth = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    order = scores.argsort(descending=True)
    tp = truth[order].cumsum(0)
    flagged = torch.arange(1, len(order) + 1, dtype=tp.dtype)
    start = max(0, int(0.01 * len(order)) - 1)
    precision = float((tp / flagged)[start:].max())
    return MembershipResult(roc_auc(pos, neg), _tpr_at(pos, neg, 0.01), _tpr_at(pos, neg, 0.001), precision,
                            pos.numel(), neg.numel())  # fmt: skip
