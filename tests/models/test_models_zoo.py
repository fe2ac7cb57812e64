"""Every registered model: shapes, parameter counts, layout, options, functional_call use."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedge.models import (
    MaxPool2x2,
    Network,
    build_model,
    count_parameters,
    list_models,
    model_info,
    model_names,
)

# Exact parameter counts (hand-computed in each module's docstring) for (1,28,28) and (3,32,32),
# 10 classes, default options. None: the architecture cannot take that input.
PARAMS: dict[str, tuple[int | None, int]] = {
    "lenet": (26_730, 27_530),
    "lenet5": (44_426, 62_006),
    "lenet-ppfl": (431_080, 657_080),
    "cnn-fedpt": (1_199_882, 1_626_442),
    "alexnet-ppfl": (297_738, 303_882),
    "vgg9": (2_573_450, 3_491_530),
    "vgg19": (None, 20_040_522),
    "wrn-10-2": (302_506, 302_794),
    "resnet20": (269_434, 269_722),
    "mlp": (199_210, 656_810),
    "logreg": (7_850, 30_730),
    "lenet-dlg": (13_426, 15_826),
}
# What the papers state, and how close we must be.
PAPER = {"lenet": (2.7e4, 0.15), "wrn-10-2": (3.0e5, 0.05), "resnet20": (0.27e6, 0.01)}
SMALL = [n for n in PARAMS if n != "vgg19"]  # cheap enough to build many times


def test_registry_holds_exactly_the_documented_models() -> None:
    assert model_names() == sorted(PARAMS)


@pytest.mark.parametrize("shape_index", [0, 1])
def test_param_counts_of_list_models(shape_index: int) -> None:
    shape = [(1, 28, 28), (3, 32, 32)][shape_index]
    rows = {r["name"]: r for r in list_models(shape, 10)}
    for name, counts in PARAMS.items():
        assert rows[name]["params"] == counts[shape_index], name
        assert (rows[name]["error"] is None) == (counts[shape_index] is not None)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_param_counts_match_the_papers(name: str) -> None:
    target, tol = PAPER[name]
    shape = (1, 28, 28) if name == "lenet" else (3, 32, 32)  # BAFFLE's LeNet is its MNIST model
    n = count_parameters(build_model(name, input_shape=shape, num_classes=10, seed=0))
    assert abs(n - target) <= tol * target, n


@pytest.mark.parametrize("name", model_names())
def test_builds_for_documented_shapes_and_outputs_logits(name: str) -> None:
    for shape in model_info(name).input_shapes:
        net = build_model(name, input_shape=shape, num_classes=7, seed=0)
        x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(1))
        y = net(x)
        assert y.shape == (3, 7)
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", SMALL)
def test_layout_features_then_classifier(name: str) -> None:
    shape = model_info(name).input_shapes[0]
    net = build_model(name, input_shape=shape, num_classes=10, seed=0).eval()
    assert isinstance(net, Network)
    assert [n for n, _ in net.named_children()] == ["features", "classifier"]
    assert isinstance(net.classifier[-1], nn.Linear)
    assert list(net.classifier.named_children())[-1][0] == "out"
    x = torch.randn(2, *shape)
    # running the blocks one by one is the model: what layer-wise training and splitting rely on
    h = x
    for _, block in net.blocks():
        h = block(h)
    assert torch.equal(h, net(x))
    k = len(net.features) // 2
    assert torch.equal(net.features[k:](net.features[:k](x)), net.features(x))


@pytest.mark.parametrize("name", SMALL)
def test_seeded_init_is_deterministic(name: str) -> None:
    shape = model_info(name).input_shapes[0]
    a = build_model(name, input_shape=shape, num_classes=10, seed=123).state_dict()
    b = build_model(name, input_shape=shape, num_classes=10, seed=123).state_dict()
    c = build_model(name, input_shape=shape, num_classes=10, seed=124).state_dict()
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("name", SMALL)
def test_spec_rebuilds_the_same_model(name: str) -> None:
    net = build_model(name, input_shape=(3, 32, 32), num_classes=4, seed=5)
    again = build_model(**net.spec.kwargs(), seed=5)
    assert repr(again) == repr(net)
    pairs = zip(net.state_dict().values(), again.state_dict().values())
    assert all(torch.equal(u, v) for u, v in pairs)


@pytest.mark.parametrize("name", SMALL)
def test_functional_call_friendly(name: str) -> None:
    # no in-place activations anywhere, and functional_call with perturbed parameters is the
    # forward of the perturbed model (what zeroth-order estimators evaluate)
    shape = model_info(name).input_shapes[0]
    net = build_model(name, input_shape=shape, num_classes=10, seed=0).eval()
    assert not any(getattr(m, "inplace", False) for m in net.modules())
    params = {k: p.detach() + 1e-3 for k, p in net.named_parameters()}
    x = torch.randn(2, *shape)
    y = torch.func.functional_call(net, params, (x,))
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.copy_(params[k])
    assert torch.allclose(y, net(x), rtol=0, atol=1e-6)


def _types(net: nn.Module) -> set[type]:
    return {type(m) for m in net.modules()}


@pytest.mark.parametrize("name", [n for n in SMALL if len(model_info(n).norms) == 3])
def test_norm_option_changes_modules(name: str) -> None:
    shape = model_info(name).input_shapes[0]
    built = {
        norm: _types(build_model(name, input_shape=shape, num_classes=10, norm=norm))
        for norm in ("none", "batch", "group")
    }
    assert nn.BatchNorm2d in built["batch"] and nn.GroupNorm not in built["batch"]
    assert nn.GroupNorm in built["group"] and nn.BatchNorm2d not in built["group"]
    assert not {nn.BatchNorm2d, nn.GroupNorm} & built["none"]


@pytest.mark.parametrize("name", [n for n in SMALL if model_info(n).activations])
def test_activation_option_changes_modules(name: str) -> None:
    shape = model_info(name).input_shapes[0]
    kinds = {"relu": nn.ReLU, "hardswish": nn.Hardswish, "selu": nn.SELU}
    for act, cls in kinds.items():
        types = _types(build_model(name, input_shape=shape, num_classes=10, activation=act))
        assert cls in types
        assert not (set(kinds.values()) - {cls}) & types


def test_lenet_is_baffles_lenet() -> None:
    net = build_model("lenet", input_shape=(1, 28, 28), num_classes=10)
    n1, n2 = net.features.conv1.norm, net.features.conv2.norm
    # GroupNorm, groups max(2, C/16), no affine parameters; Hardswish (BAFFLE Sec. 3.3)
    assert isinstance(n1, nn.GroupNorm) and isinstance(n2, nn.GroupNorm)
    assert (n1.num_channels, n1.num_groups, n2.num_channels, n2.num_groups) == (16, 2, 64, 4)
    assert not n1.affine and not n2.affine
    assert isinstance(net.features.conv1.act, nn.Hardswish)
    assert net.features.conv1.conv.kernel_size == (5, 5)
    wide = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, channels=(32, 128))
    assert (wide.features.conv1.norm.num_groups, wide.features.conv2.norm.num_groups) == (2, 8)


def _n(name: str, shape: tuple[int, int, int] = (3, 32, 32), **options: object) -> int:
    return count_parameters(build_model(name, input_shape=shape, num_classes=10, **options))


def test_model_specific_options() -> None:
    def dropouts(**options: object) -> int:
        net = build_model("vgg9", input_shape=(3, 32, 32), num_classes=10, **options)
        return sum(isinstance(m, nn.Dropout) for m in net.modules())

    assert (dropouts(), dropouts(dropout=False)) == (2, 0)  # D0.05 and D0.1
    # affine norms: scale and shift for the pre and mid norms of the 3 units, and the post norm
    assert _n("wrn-10-2", norm_affine=True) == 302_794 + 2 * (16 + 32 + 32 + 64 + 64 + 128 + 128)
    assert _n("lenet5", (1, 28, 28), padding=2) == 61_706  # LeCun's 32x32-padded MNIST
    assert _n("mlp", (1, 8, 8), hidden=[32]) == 64 * 32 + 32 + 32 * 10 + 10


def test_batchnorm_models_train_and_eval() -> None:
    net = build_model("resnet20", input_shape=(3, 32, 32), num_classes=10, seed=0)
    x = torch.randn(4, 3, 32, 32)
    loss = net(x).logsumexp(1).mean()
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())
    assert net.eval()(x).shape == (4, 10)


def test_models_deepcopy_and_pickle() -> None:
    # FedAvg clones the global model; checkpoints pickle it
    import copy
    import pickle

    net = build_model("lenet", input_shape=(1, 8, 8), num_classes=10, seed=0)
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert clone.spec == net.spec
        x = torch.randn(2, 1, 8, 8)
        assert torch.equal(clone(x), net(x))


def _swap_fast_pools(module: nn.Module) -> int:
    """Replace every MaxPool2x2 by the oracle nn.MaxPool2d(2), in place; how many were swapped."""
    swapped = 0
    for name, child in module.named_children():
        if isinstance(child, MaxPool2x2):
            setattr(module, name, nn.MaxPool2d(2))
            swapped += 1
        else:
            swapped += _swap_fast_pools(child)
    return swapped


@pytest.mark.parametrize("name", model_names())
def test_fast_layers_give_torchs_outputs_and_keep_state_dict_keys(name: str) -> None:
    # Prepare: the model as built, and the same weights with torch's own pooling layer.
    shape = model_info(name).input_shapes[-1]
    fast = build_model(name, input_shape=shape, num_classes=10, seed=0).eval()
    oracle = build_model(name, input_shape=shape, num_classes=10, seed=0).eval()
    swapped = _swap_fast_pools(oracle)
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(1))
    # Execute
    with torch.no_grad():
        got, want = fast(x), oracle(x)
    # Assert: bit-identical logits, and checkpoints load unchanged (same keys and tensors).
    assert torch.equal(got, want), (name, swapped)
    assert list(fast.state_dict()) == list(oracle.state_dict())
    uses_pool = name in {"lenet", "lenet5", "lenet-ppfl", "vgg9", "vgg19", "cnn-fedpt"}
    assert (swapped > 0) == uses_pool
