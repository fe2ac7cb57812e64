"""Masks: the prunable set, density, applying masks, and wire encodings (round trip, sizes)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.models import build_model
from fedge.pruning import (
    apply_masks_,
    check_masks,
    decode_masks,
    dense_masks,
    density,
    encode_masks,
    mask_bytes,
    prunable_parameters,
)


@pytest.mark.parametrize(
    ("name", "shape"), [("lenet", (1, 8, 8)), ("resnet20", (3, 32, 32)), ("mlp", (1, 8, 8))]
)
def test_prunable_are_exactly_conv_and_linear_weights(name: str, shape: tuple[int, ...]) -> None:
    net = build_model(name, input_shape=shape, num_classes=10, seed=0)
    expected = [
        f"{mod_name}.weight"
        for mod_name, mod in net.named_modules()
        if isinstance(mod, (nn.Linear, nn.Conv2d))
    ]
    names = prunable_parameters(net)
    assert names == expected
    assert all(n.endswith(".weight") for n in names)
    # biases and norm parameters are left out (resnet20 has BatchNorm weights; lenet biases)
    others = [n for n, _ in net.named_parameters() if n not in names]
    assert others and all(n.endswith(".bias") or ".norm" in n or "bn" in n for n in others)


def test_prunable_of_a_bare_layer_and_of_a_model_without_any() -> None:
    assert prunable_parameters(nn.Linear(3, 2)) == ["weight"]
    with pytest.raises(ConfigError, match="no prunable weight"):
        dense_masks(nn.BatchNorm1d(3))


def test_density_and_apply_masks() -> None:
    net = build_model("mlp", input_shape=(1, 2, 2), num_classes=3, hidden=(5,), seed=0)
    assert density(None, net) == 1.0
    masks = dense_masks(net)
    w = "features.fc1.linear.weight"  # (5, 4): 20 of the 20 + 15 prunable weights
    masks[w] = torch.zeros(5, 4, dtype=torch.bool)
    masks[w][0, :2] = True
    assert density(masks, net) == pytest.approx((2 + 15) / 35)
    assert density({w: masks[w]}, net) == density(masks, net)  # absent names count as kept

    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    assert apply_masks_(net, masks) is net
    after = dict(net.named_parameters())
    assert torch.equal(after[w], before[w] * masks[w])
    for n in before:
        if n != w:
            assert torch.equal(after[n], before[n])  # biases and other weights untouched


def test_check_masks_names_the_problem() -> None:
    net = build_model("mlp", input_shape=(1, 2, 2), num_classes=3, hidden=(5,), seed=0)
    with pytest.raises(ConfigError, match="not a prunable weight"):
        check_masks(net, {"classifier.out.bias": torch.ones(3, dtype=torch.bool)})
    with pytest.raises(ConfigError, match="torch.bool"):
        check_masks(net, {"classifier.out.weight": torch.ones(3, 5)})
    with pytest.raises(ConfigError, match="shape"):
        check_masks(net, {"classifier.out.weight": torch.ones(5, 3, dtype=torch.bool)})


def _mask(n: int, kept: list[int]) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[kept] = True
    return m


def test_mask_bytes_hand_computed() -> None:
    # n = 100: bitmap 13 bytes; index 4 * min(kept, pruned)
    sparse = _mask(100, [1, 50, 99])  # 3 kept -> 12 bytes of indices < 13
    half = _mask(100, list(range(0, 100, 2)))  # 50 kept -> 200 bytes > 13
    dense = ~_mask(100, [7, 8])  # 2 pruned -> 8 bytes
    assert mask_bytes({"a": sparse}) == mask_bytes({"a": sparse})
    b = mask_bytes({"a": sparse, "b": half, "c": dense})
    assert (b.bitmap, b.index, b.encoded) == (39, 12 + 200 + 8, 12 + 13 + 8)
    assert b.smaller == "bitmap"
    b = mask_bytes({"a": sparse, "c": dense})
    assert (b.bitmap, b.index, b.smaller) == (26, 20, "index")


def _payload(arrays: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in arrays.values())


def test_encode_picks_the_smaller_per_tensor_and_round_trips() -> None:
    g = torch.Generator().manual_seed(0)
    masks = {
        "all": torch.ones(3, 5, 7, dtype=torch.bool),
        "none": torch.zeros(13, dtype=torch.bool),
        "half": torch.rand(6, 11, generator=g) < 0.5,
        "sparse": torch.rand(40, 50, generator=g) < 0.01,
        "dense": torch.rand(40, 50, generator=g) > 0.01,
        "one": torch.ones(1, dtype=torch.bool),
        "conv": torch.rand(16, 1, 5, 5, generator=g) < 0.2,
    }
    arrays = encode_masks(masks)
    assert arrays["half"].dtype == torch.uint8 and arrays["conv"].dtype == torch.uint8
    assert arrays["all:pruned"].numel() == 0 and arrays["none:kept"].numel() == 0
    assert arrays["sparse:kept"].dtype == torch.int32 and "dense:pruned" in arrays
    assert _payload(arrays) == mask_bytes(masks).encoded
    for name, arr in arrays.items():  # each is the smaller of its two encodings
        base = name.split(":")[0]
        n, kept = masks[base].numel(), int(masks[base].sum())
        assert _payload({name: arr}) == min(math.ceil(n / 8), 4 * min(kept, n - kept))

    shapes = {n: m.shape for n, m in masks.items()}
    back = decode_masks(arrays, shapes)
    assert set(back) == set(masks)
    for n in masks:
        assert back[n].dtype == torch.bool and torch.equal(back[n], masks[n])

    # ... and through a real Message on the wire
    wire = Message.from_bytes(Message(arrays=arrays).to_bytes())
    for n, m in decode_masks(wire.arrays, shapes).items():
        assert torch.equal(m, masks[n])


def test_decode_rejects_malformed_arrays() -> None:
    shapes = {"w": (4, 5)}
    good = encode_masks({"w": torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) < 0.5})
    with pytest.raises(MessageError, match="missing"):
        decode_masks({}, shapes)
    with pytest.raises(MessageError, match="unexpected"):
        decode_masks({**good, "v": good["w"]}, shapes)
    with pytest.raises(MessageError, match="twice"):
        decode_masks({**good, "w:kept": torch.tensor([0], dtype=torch.int32)}, shapes)
    with pytest.raises(MessageError, match="bytes"):
        decode_masks({"w": torch.zeros(2, dtype=torch.uint8)}, shapes)
    for bad in ([3, 3], [5, 2], [20], [-1]):
        with pytest.raises(MessageError, match="strictly increasing"):
            decode_masks({"w:kept": torch.tensor(bad, dtype=torch.int32)}, shapes)
    with pytest.raises(MessageError, match="int32"):
        decode_masks({"w:pruned": torch.tensor([1], dtype=torch.int64)}, shapes)


def test_rescale_restores_layer_output_variance():
    import torch

    from fedge.pruning import apply_masks_, rescale_

    torch.manual_seed(0)
    lin = torch.nn.Linear(4000, 50, bias=False).requires_grad_(False)
    x = torch.randn(64, 4000)
    dense_var = float(lin(x).var())
    masks = {"weight": torch.rand(50, 4000) < 0.1}
    apply_masks_(lin, masks)
    assert float(lin(x).var()) < 0.2 * dense_var
    rescale_(lin, masks)
    assert abs(float(lin(x).var()) / dense_var - 1) < 0.15
    assert torch.all(lin.weight[~masks["weight"]] == 0)
