"""layers: MaxPool2x2 against nn.MaxPool2d (values and autograd gradients), norm/act factories."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.models.layers import (
    GlobalAvgPool,
    InputTooSmallError,
    MaxPool2x2,
    fc_classifier,
    group_count,
    make_activation,
    make_norm,
    output_shape,
    pooled_classifier,
)


@pytest.mark.parametrize(
    "shape",
    [
        (2, 3, 8, 8),
        (2, 3, 7, 9),
        (1, 1, 2, 2),
        (1, 2, 3, 3),
        (4, 5, 28, 28),
        (3, 5, 6),
        (1, 1, 2, 11),
    ],
)
def test_maxpool2x2_matches_maxpool2d_values_and_gradients(shape: tuple[int, ...]) -> None:
    # Prepare: continuous random input (no ties), a random upstream gradient.
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    x_new = x.clone().requires_grad_(True)

    # Execute
    y_ref = nn.MaxPool2d(2)(x_ref)
    y_new = MaxPool2x2()(x_new)
    upstream = torch.randn(y_ref.shape, generator=g, dtype=torch.float64)
    (y_ref * upstream).sum().backward()
    (y_new * upstream).sum().backward()

    # Assert: the autograd oracle (MaxPool2d) agrees exactly, odd rows/columns cropped.
    assert y_new.shape == y_ref.shape
    assert torch.equal(y_new, y_ref)
    assert torch.equal(x_new.grad, x_ref.grad)


def test_maxpool2x2_ties_split_gradient_and_conserve_it() -> None:
    x = torch.zeros(1, 1, 2, 4, requires_grad=True)  # two windows, all entries tied
    MaxPool2x2()(x).sum().backward()
    assert x.grad is not None
    # torch.maximum splits ties equally: each of the 4 tied entries gets 1/4, so each window's
    # gradient still sums to its upstream 1 (MaxPool2d would put the whole 1 on the first entry)
    assert torch.equal(x.grad, torch.full((1, 1, 2, 4), 0.25))


def test_maxpool2x2_propagates_nan_like_maxpool2d() -> None:
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 0] = float("nan")
    assert torch.equal(MaxPool2x2()(x).isnan(), nn.MaxPool2d(2)(x).isnan())


def test_maxpool2x2_rejects_inputs_below_2x2() -> None:
    with pytest.raises(ValueError, match="at least 2x2"):
        MaxPool2x2()(torch.zeros(1, 1, 1, 5))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_maxpool2x2_composes_with_torch_func() -> None:
    x, v = torch.randn(2, 3, 6, 6), torch.randn(2, 3, 6, 6)
    _, jvp_new = torch.func.jvp(MaxPool2x2(), (x,), (v,))
    _, jvp_ref = torch.func.jvp(nn.MaxPool2d(2), (x,), (v,))
    # maximum's forward derivative is other_t + mask * (self_t - other_t): equal up to rounding
    assert torch.allclose(jvp_new, jvp_ref, rtol=0, atol=1e-6)
    assert torch.func.vmap(MaxPool2x2())(x).shape == (2, 3, 3, 3)


def test_global_avg_pool_is_mean_over_space() -> None:
    x = torch.randn(2, 3, 5, 4)
    assert torch.allclose(GlobalAvgPool()(x), nn.AdaptiveAvgPool2d(1)(x).flatten(1))


@pytest.mark.parametrize(
    ("channels", "groups"),
    [(16, 2), (32, 2), (64, 4), (128, 8), (256, 16), (6, 2), (50, 2), (1, 1), (3, 1)],
)
def test_group_count_follows_baffle_rule(channels: int, groups: int) -> None:
    # max(2, C // 16), lowered to a divisor of C when it does not divide (GroupNorm needs one)
    assert group_count(channels) == groups
    assert channels % group_count(channels) == 0


def test_make_norm() -> None:
    assert make_norm("none", 8, affine=True) is None
    bn = make_norm("batch", 8, affine=False)
    assert isinstance(bn, nn.BatchNorm2d) and bn.weight is None
    gn = make_norm("group", 64, affine=True)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 4 and gn.weight is not None
    with pytest.raises(UnknownNameError, match="layer"):
        make_norm("layer", 8, affine=True)


def test_make_activation_is_fresh_and_not_inplace() -> None:
    a, b = make_activation("relu"), make_activation("relu")
    assert a is not b and not a.inplace
    assert isinstance(make_activation("hardswish"), nn.Hardswish)
    assert isinstance(make_activation("selu"), nn.SELU)
    with pytest.raises(UnknownNameError, match="gelu"):
        make_activation("gelu")


def test_fc_classifier_is_flatten_hidden_layers_then_out() -> None:
    # Prepare: a (B, 2, 3, 4) feature map, a head with two hidden widths.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, 3, 4, generator=g)
    head = fc_classifier(24, 7, hidden=(6, 5), activation="relu")
    # Assert: stable child names (state-dict keys) and the plain composition as the oracle.
    assert [n for n, _ in head.named_children()] == ["flatten", "fc1", "fc2", "out"]
    assert list(head.state_dict()) == [
        "fc1.0.weight",
        "fc1.0.bias",
        "fc2.0.weight",
        "fc2.0.bias",
        "out.weight",
        "out.bias",
    ]
    h = x.flatten(1)
    for fc in (head.fc1[0], head.fc2[0]):
        h = torch.relu(fc(h))
    torch.testing.assert_close(head(x), head.out(h), rtol=0, atol=0)
    plain = fc_classifier(24, 7)
    assert [n for n, _ in plain.named_children()] == ["flatten", "out"]
    assert plain(x).shape == (5, 7)
    with pytest.raises(ConfigError, match="need an activation"):
        fc_classifier(24, 7, hidden=(6,))


def test_pooled_classifier_is_global_mean_then_out() -> None:
    x = torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(1))
    head = pooled_classifier(4, 2)
    assert [n for n, _ in head.named_children()] == ["pool", "out"]
    torch.testing.assert_close(head(x), head.out(x.mean(dim=(2, 3))))


def test_output_shape_and_too_small() -> None:
    conv = nn.Sequential(nn.Conv2d(1, 4, 5), MaxPool2x2())
    assert output_shape(conv, (1, 28, 28)) == (4, 12, 12)
    with pytest.raises(InputTooSmallError) as e:
        output_shape(conv, (1, 4, 4))
    assert isinstance(e.value, ConfigError)
    assert conv.training  # mode restored after the eval-mode dry run


def _maxpool2x2_before(x: torch.Tensor) -> torch.Tensor:
    """The previous MaxPool2x2 (four quarter slices), kept as the regression oracle."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    x = x[..., :h, :w]
    top = torch.maximum(x[..., 0::2, 0::2], x[..., 0::2, 1::2])
    bottom = torch.maximum(x[..., 1::2, 0::2], x[..., 1::2, 1::2])
    return torch.maximum(top, bottom)


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (2, 3, 7, 9), (64, 16, 28, 28), (3, 5, 6)])
def test_maxpool2x2_equals_previous_implementation_including_ties(shape: tuple[int, ...]) -> None:
    # Prepare: values on a coarse grid, so windows hold ties (and signed zeros) often.
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randint(-2, 3, shape, generator=g).float() * 0.5
    x_new, x_old = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    # Execute
    y_new, y_old = MaxPool2x2()(x_new), _maxpool2x2_before(x_old)
    y_new.sum().backward()
    y_old.sum().backward()
    # Assert: same values, bit for bit; each window's gradient still sums to its upstream 1.
    assert torch.equal(y_new, y_old) and torch.equal(y_new, nn.MaxPool2d(2)(x))
    assert x_new.grad is not None and x_old.grad is not None
    windows = x_new.grad[..., : shape[-2] // 2 * 2, : shape[-1] // 2 * 2]
    assert torch.equal(
        nn.functional.avg_pool2d(windows.reshape(-1, 1, *windows.shape[-2:]), 2) * 4,
        torch.ones_like(y_new).reshape(-1, 1, *y_new.shape[-2:]),
    )
