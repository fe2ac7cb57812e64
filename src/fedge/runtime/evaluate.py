"""Test-set evaluation: top-1 (and top-5 when there are more than 10 classes) and mean loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["evaluate"]


def evaluate(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1000,
    num_classes: int,
) -> dict[str, float]:
    """Mean cross-entropy and accuracy of ``model`` on (x, y), in eval mode, without grad, each
    batch moved to the device of the model's parameters (a model on a GPU is evaluated there).

    Returns ``test_accuracy``, ``test_loss`` and, for more than 10 classes, ``test_top5``.
    """
    first = next(model.parameters(), None)
    device = x.device if first is None else first.device
    was_training = model.training
    model.eval()
    correct = correct5 = 0
    loss_sum = 0.0
    top5 = num_classes > 10
    with torch.inference_mode():
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            logits = model(xb)
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
            if top5:
                correct5 += int((logits.topk(5, dim=1).indices == yb[:, None]).any(1).sum())
    model.train(was_training)
    n = max(1, len(y))
    out = {"test_accuracy": correct / n, "test_loss": loss_sum / n}
    if top5:
        out["test_top5"] = correct5 / n
    return out
