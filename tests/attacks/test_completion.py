"""The attacker's completion of a withheld classifier atop released feature layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedge.attacks.completion import complete_classifier
from fedge.core.errors import ConfigError
from fedge.core.rng import generator


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(2, 4), nn.Tanh())
        self.classifier = nn.Sequential(nn.Linear(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _data(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()  # separable by a line through the origin


def test_the_head_is_retrained_on_frozen_features_and_the_model_is_untouched() -> None:
    net = _Net()
    with (
        torch.no_grad()
    ):  # features that keep x recoverable: tanh of a scaled identity (and its negation)
        net.features[0].weight.copy_(torch.tensor([[0.5, 0], [0, 0.5], [-0.5, 0], [0, -0.5]]))
        net.features[0].bias.zero_()
        net.classifier[0].weight.fill_(7.0)  # the withheld head: never reused
        net.classifier[0].bias.fill_(7.0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x, y = _data()
    out = complete_classifier(net, (x, y), generator=generator(0, "t"), steps=400, lr=0.05)
    assert all(
        torch.equal(v, net.state_dict()[k]) for k, v in before.items()
    )  # the original is untouched
    assert all(
        torch.equal(out.state_dict()[k], v) for k, v in before.items() if k.startswith("features")
    )
    assert not (out.classifier[0].weight == 7.0).any()
    assert float((out(x).argmax(1) == y).double().mean()) > 0.97  # the attacker's own data is fit
    assert not any(p.requires_grad for p in out.parameters())
    again = complete_classifier(net, (x, y), generator=generator(0, "t"), steps=400, lr=0.05)
    assert all(
        torch.equal(a, b)
        for a, b in zip(out.state_dict().values(), again.state_dict().values(), strict=True)
    )


def test_bad_inputs_name_what_is_missing() -> None:
    x, y = _data(8)
    with pytest.raises(ConfigError, match="`features` and `classifier`.*Linear"):
        complete_classifier(nn.Linear(2, 2), (x, y), generator=generator(0))
    with pytest.raises(ConfigError, match="got 0 samples"):
        complete_classifier(_Net(), (x[:0], y[:0]), generator=generator(0))
