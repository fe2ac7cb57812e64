"""Membership inference against a released model, scored by ROC (AUC, TPR at 1% and 0.1% FPR,
best precision): the loss threshold (Yeom et al., CSF 2018; :func:`loss_threshold_attack`),
shadow models teaching a logistic-regression attack model (Shokri et al., S&P 2017;
:func:`shadow_attack`) and offline LiRA with a global variance (Carlini et al., S&P 2022,
Sec. IV-C; :func:`lira_offline`). See docs/privacy/attacks.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "MembershipResult",
    "chance_auc_std",
    "lira_offline",
    "logit_confidence",
    "loss_threshold_attack",
    "output_features",
    "roc_auc",
    "sample_losses",
    "scores_result",
    "shadow_attack",
]


@torch.no_grad()
def sample_losses(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512
) -> torch.Tensor:
    """Per-sample cross-entropy of ``model`` (eval mode) on (x, y)."""
    was = model.training
    model.eval()
    out = torch.cat(
        [
            F.cross_entropy(model(x[i : i + batch]), y[i : i + batch], reduction="none")
            for i in range(0, len(x), batch)
        ]
    )
    model.train(was)
    return out


def roc_auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie): the Mann-Whitney form of AUC."""
    p, n = pos.double().view(-1, 1), neg.double().view(1, -1)
    return float((p > n).double().mean() + 0.5 * (p == n).double().mean())


def chance_auc_std(n_pos: int, n_neg: int) -> float:
    """Standard deviation of :func:`roc_auc` for an attack at chance (scores that do not depend on
    membership, no ties): the Mann-Whitney U null, ``sqrt((n_pos + n_neg + 1) / (12 n_pos n_neg))``.

    The sampling noise an AUC from ``n_pos`` members and ``n_neg`` non-members carries: 0.051 for
    64 and 64, so an AUC within ~0.1 of 0.5 is not evidence of leakage at that size.
    """
    if n_pos < 1 or n_neg < 1:
        raise ValueError(
            f"chance_auc_std needs at least one sample of each kind, got {n_pos} and {n_neg}"
        )
    return ((n_pos + n_neg + 1) / (12 * n_pos * n_neg)) ** 0.5


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
    precision: float  # at the threshold of best balanced accuracy (what an attacker would deploy)
    members: int
    non_members: int


def loss_threshold_attack(
    model: torch.nn.Module,
    members: tuple[torch.Tensor, torch.Tensor],
    non_members: tuple[torch.Tensor, torch.Tensor],
) -> MembershipResult:
    """Yeom et al.'s attack, every threshold at once."""
    return scores_result(-sample_losses(model, *members), -sample_losses(model, *non_members))


def scores_result(pos: torch.Tensor, neg: torch.Tensor) -> MembershipResult:
    """The metrics of membership scores (higher = "member") for members and non-members."""
    pos, neg = pos.double(), neg.double()
    scores = torch.cat([pos, neg])
    truth = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    order = scores.argsort(descending=True, stable=True)
    ranked = scores[order]
    tp = truth[order].cumsum(0)
    flagged = torch.arange(1, len(order) + 1, dtype=tp.dtype)
    # a threshold cuts between distinct scores only: keep the last position of each tie group
    cut = torch.cat([ranked[1:] != ranked[:-1], torch.tensor([True])])
    enough = flagged >= max(1, int(0.01 * len(order)))
    prec = tp / flagged
    best_precision = float(prec[cut & enough].max())
    balanced = (tp / len(pos) + 1 - (flagged - tp) / len(neg)) / 2
    at = int(torch.where(cut, balanced, torch.full_like(balanced, -1.0)).argmax())
    return MembershipResult(
        roc_auc(pos, neg),
        _tpr_at(pos, neg, 0.01),
        _tpr_at(pos, neg, 0.001),
        best_precision,
        float(prec[at]),
        pos.numel(),
        neg.numel(),
    )


Data = tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def logit_confidence(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512
) -> torch.Tensor:
    """φ = log p_y − log(1 − p_y), computed stably from the logits (Carlini et al. 2022, Sec. IV-B):
    z_y − logsumexp_{j≠y} z_j."""
    was = model.training
    model.eval()
    out = []
    for i in range(0, len(x), batch):
        z = model(x[i : i + batch]).double()
        zy = z.gather(1, y[i : i + batch].view(-1, 1)).view(-1)
        others = z.scatter(1, y[i : i + batch].view(-1, 1), float("-inf"))
        out.append(zy - others.logsumexp(1))
    model.train(was)
    return torch.cat(out)


@torch.no_grad()
def output_features(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample features of the model's output for the attack model: logit-scaled confidence
    of the label, loss, top-1 probability, entropy, and whether the prediction is right. (B, 5)"""
    was = model.training
    model.eval()
    logp = torch.log_softmax(model(x).double(), -1)
    model.train(was)
    p = logp.exp()
    loss = -logp.gather(1, y.view(-1, 1)).view(-1)
    entropy = -(p * logp).sum(-1)
    right = (logp.argmax(-1) == y).double()
    return torch.stack(
        [logit_confidence(model, x, y), loss, p.max(-1).values, entropy, right], dim=1
    )


def shadow_attack(
    model: torch.nn.Module,
    shadows: list[tuple[torch.nn.Module, Data, Data]],
    members: Data,
    non_members: Data,
) -> MembershipResult:
    """Shokri et al.'s attack: ``shadows`` are (shadow model, its training set, held-out set of
    the attacker's data); one logistic-regression attack model on :func:`output_features`."""
    import numpy as np  # noqa: PLC0415
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

    feats, labels = [], []
    for m, inside, outside in shadows:
        feats += [output_features(m, *inside), output_features(m, *outside)]
        labels += [torch.ones(len(inside[1])), torch.zeros(len(outside[1]))]
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    clf.fit(np.nan_to_num(torch.cat(feats).numpy()), torch.cat(labels).numpy())

    def score(d: Data) -> torch.Tensor:
        return torch.from_numpy(
            clf.predict_proba(np.nan_to_num(output_features(model, *d).numpy()))[:, 1]
        )

    return scores_result(score(members), score(non_members))


def lira_offline(
    model: torch.nn.Module, shadows: list[torch.nn.Module], members: Data, non_members: Data
) -> MembershipResult:
    """Offline LiRA: every candidate is OUT of every shadow model's training set (the shadows
    were trained on the attacker's own data); score Φ((φ − μ_out)/σ_out) with the per-sample
    mean μ_out over shadows and one global σ_out (Carlini et al.'s choice for few shadows)."""

    def score(d: Data) -> tuple[torch.Tensor, torch.Tensor]:
        outs = torch.stack([logit_confidence(s, *d) for s in shadows])  # (S, B)
        return logit_confidence(model, *d), outs

    phi_in, out_in = score(members)
    phi_out, out_out = score(non_members)
    mu = torch.cat([out_in.mean(0), out_out.mean(0)])
    resid = torch.cat([out_in, out_out], dim=1) - mu
    sigma = float(resid.std()) if len(shadows) > 1 else 1.0
    # Φ is monotone: ranking by z gives the same ROC and keeps the tail the CDF rounds to 1.0
    z = (torch.cat([phi_in, phi_out]) - mu) / max(sigma, 1e-12)
    return scores_result(z[: len(phi_in)], z[len(phi_in) :])
