"""The attacker's completion of a model whose classifier was withheld.

PPFL (seed 001, Sec. 3, "Privacy-by-design Guarantee") can keep a model's last layer inside
the clients' TEEs after training, so that a holder of the released model gets only the layers
before it; the paper credits this for its MIA precision of ~0.5 (Table 2). An adversary
holding those layers can still attack membership: it trains a classifier of its own atop the
released (frozen) feature layers on its own labelled data, and attacks the completed model.
:func:`complete_classifier` is that completion, for a zoo model (``features`` then
``classifier``): the classifier's parameters are drawn afresh from a seeded generator (never
the withheld values) and trained with Adam on the features of the attacker's data.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from fedge.core.errors import ConfigError

__all__ = ["complete_classifier"]


def complete_classifier(
    model: nn.Module,
    aux: tuple[torch.Tensor, torch.Tensor],
    *,
    generator: torch.Generator,
    steps: int = 300,
    lr: float = 0.01,
    batch: int = 64,
) -> nn.Module:
    """A copy of ``model`` with its ``classifier`` replaced by one the attacker trains on ``aux``
    (inputs, labels) atop the frozen ``features``: weights ~ N(0, 1/fan_in), biases 0, then
    ``steps`` Adam steps on mini-batches of ``batch`` drawn by ``generator``. ``model`` itself is
    left untouched; the copy's features are bit-identical to it."""
    features, classifier = getattr(model, "features", None), getattr(model, "classifier", None)
    if not isinstance(features, nn.Module) or not isinstance(classifier, nn.Module):
        raise ConfigError(
            f"completing a withheld classifier needs a zoo model with `features` and `classifier`; "
            f"{type(model).__name__} has not"
        )
    x, y = aux
    if len(y) == 0 or steps < 1 or batch < 1:
        raise ConfigError(
            f"classifier completion needs auxiliary data, steps >= 1 and batch >= 1; got {len(y)} "
            f"samples, steps={steps}, batch={batch}"
        )
    out = copy.deepcopy(model).eval()
    head = out.classifier
    assert isinstance(head, nn.Module)
    with torch.no_grad():
        f = out.features(x)  # type: ignore[operator]
        for p in out.parameters():
            p.requires_grad_(False)
        for name, p in head.named_parameters():
            if name.endswith("bias") or p.dim() < 2:
                p.zero_()
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()), generator=generator)
            p.requires_grad_(True)
    opt = torch.optim.Adam([p for p in head.parameters()], lr=lr)
    head.train()
    for _ in range(steps):
        idx = torch.randint(len(y), (min(batch, len(y)),), generator=generator)
        loss = nn.functional.cross_entropy(head(f[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return out
