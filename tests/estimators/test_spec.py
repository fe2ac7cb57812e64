"""ZerothOrderSpec: frozen, validated when built, and the same estimate as the keyword form."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.core.errors import ConfigError, MessageError
from fedge.estimators import (
    ZerothOrderSpec,
    estimate_gradient,
    loss_differences,
    zeroth_order_gradient,
)


def _tiny() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A 4 -> 3 linear classifier and a batch of 5, all from an explicit generator."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model, (torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g))


def test_the_spec_is_frozen_and_hashable() -> None:
    spec = ZerothOrderSpec(k=8, sigma=1e-3, scheme="forward")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.k = 9  # type: ignore[misc]
    assert spec == ZerothOrderSpec(k=8, sigma=1e-3, scheme="forward")
    assert hash(spec) == hash(ZerothOrderSpec(k=8, sigma=1e-3, scheme="forward"))
    assert (spec.directions, spec.mode, spec.chunk, spec.dtype, spec.workers) == (
        "gaussian",
        "lean",
        None,
        None,
        None,
    )  # BAFFLE's i.i.d. directions, least memory, the parameters' own precision


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("k", 0, "k"),
        ("k", 2.5, "k"),
        ("sigma", 0.0, "sigma must be a finite number > 0"),
        ("sigma", float("nan"), "sigma must be a finite number > 0"),
        ("scheme", "backward", "scheme must be one of"),
        ("directions", "spiral", "directions must be one of"),
        ("mode", "turbo", "mode must be one of"),
        ("chunk", 0, "chunk"),
        ("workers", 0, "workers"),
        ("dtype", torch.float64, "dtype must be None, torch.float32"),
    ],
)
def test_an_invalid_value_is_rejected_when_the_spec_is_built(
    field: str, value: object, match: str
) -> None:
    settings: dict[str, object] = {"k": 8, "sigma": 1e-3, "scheme": "central", field: value}
    with pytest.raises(ConfigError, match=match):
        ZerothOrderSpec(**settings)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=match):  # and by replace, which builds a new one
        dataclasses.replace(ZerothOrderSpec(k=8, sigma=1e-3, scheme="central"), **{field: value})


@pytest.mark.parametrize("scheme", ["central", "forward"])
@pytest.mark.parametrize("mode", ["lean", "fast"])
def test_an_estimate_through_the_spec_equals_the_keyword_form(scheme: str, mode: str) -> None:
    model, batch = _tiny()
    kw = dict(k=6, sigma=1e-2, scheme=scheme, mode=mode, directions="orthogonal", workers=2)
    spec = ZerothOrderSpec(**kw)  # type: ignore[arg-type]
    params = dict(model.named_parameters())

    by_spec = loss_differences(model, F.cross_entropy, batch, spec, seed=3)
    by_keywords = loss_differences(model, F.cross_entropy, batch, seed=3, **kw)
    assert torch.equal(by_spec, by_keywords)

    g_spec = estimate_gradient(params, by_spec, spec, seed=3)
    g_keywords = estimate_gradient(
        params, by_keywords, seed=3, sigma=1e-2, scheme=scheme, directions="orthogonal"
    )  # K is the number of loss differences given
    one_device = zeroth_order_gradient(model, F.cross_entropy, batch, spec, seed=3)
    one_device_keywords = zeroth_order_gradient(model, F.cross_entropy, batch, seed=3, **kw)
    for name in params:
        assert torch.equal(g_spec[name], g_keywords[name]), name
        assert torch.equal(one_device[name], g_spec[name]), name
        assert torch.equal(one_device_keywords[name], g_spec[name]), name


def test_the_normalizer_is_c_of_eq_6() -> None:
    """On a loss linear in W both schemes estimate the same ĝ (Appendix D): ΔL_central = 2 ΔL_forward,
    and c = 2 / c = 1 divide it out."""
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(1, 3, generator=g))
    x = torch.randn(4, 3, generator=g)
    batch = (x, torch.zeros(4))

    def loss(out: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
        return out.mean()

    central = ZerothOrderSpec(k=5, sigma=1e-2, scheme="central")
    forward = dataclasses.replace(central, scheme="forward")
    assert (central.normalizer, forward.normalizer) == (2.0, 1.0)
    g_c = zeroth_order_gradient(lin, loss, batch, central, seed=0)
    g_f = zeroth_order_gradient(lin, loss, batch, forward, seed=0)
    torch.testing.assert_close(g_c["weight"], g_f["weight"], rtol=1e-3, atol=1e-6)


def test_a_spec_and_keywords_together_or_unknown_keywords_are_refused() -> None:
    model, batch = _tiny()
    spec = ZerothOrderSpec(k=4, sigma=1e-2, scheme="central")
    with pytest.raises(ConfigError, match=r"pass one or the other .*dataclasses.replace"):
        loss_differences(model, F.cross_entropy, batch, spec, seed=0, k=5)
    with pytest.raises(ConfigError, match=r"unknown zeroth-order setting\(s\) \['sigmaa'\]"):
        loss_differences(model, F.cross_entropy, batch, seed=0, k=4, sigmaa=1e-2, scheme="central")
    with pytest.raises(ConfigError, match="spec must be a ZerothOrderSpec, got dict"):
        loss_differences(model, F.cross_entropy, batch, {"k": 4}, seed=0)  # type: ignore[arg-type]


def test_the_server_refuses_loss_differences_of_another_k() -> None:
    model, _ = _tiny()
    spec = ZerothOrderSpec(k=4, sigma=1e-2, scheme="central")
    with pytest.raises(MessageError, match="got 5 loss differences for a spec with k=4"):
        estimate_gradient(dict(model.named_parameters()), torch.ones(5), spec, seed=0)


def test_the_device_is_none_on_the_cpu_and_kept_elsewhere():
    import torch

    from fedge.estimators.spec import ZerothOrderSpec

    base = dict(k=4, sigma=1e-3, scheme="forward")
    assert ZerothOrderSpec(**base, device=torch.device("cpu")) == ZerothOrderSpec(**base)
    assert ZerothOrderSpec(**base, device=torch.device("cpu")).device is None
    assert ZerothOrderSpec(**base, device=torch.device("meta")).device == torch.device("meta")
