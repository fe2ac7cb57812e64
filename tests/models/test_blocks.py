"""model_blocks and resolve_freeze against hand-counted architectures."""

import pytest
from torch import nn

from fedge.core.errors import ConfigError
from fedge.models import build_model
from fedge.models.blocks import freeze_, model_blocks, resolve_freeze


def _cnn():
    return build_model("cnn-fedpt", input_shape=(1, 28, 28), num_classes=10, seed=0)


def test_cnn_blocks_hand_counted():
    # conv1 1*32*9+32, conv2 32*64*9+64, fc1 64*12*12*128+128, out 128*10+10
    blocks = model_blocks(_cnn())
    assert [(b.name, b.params, b.kind, b.freezable) for b in blocks] == [
        ("features.conv1", 320, "conv", 320),
        ("features.conv2", 18496, "conv", 18496),
        ("classifier.fc1", 1179776, "linear", 1179776),
        ("classifier.out", 1290, "linear", 1290),
    ]
    assert sum(b.params for b in blocks) == sum(p.numel() for p in _cnn().parameters())


def test_norm_parameters_are_counted_but_never_freezable():
    net = build_model("lenet5", input_shape=(1, 28, 28), num_classes=10, norm="batch", seed=0)
    conv1 = model_blocks(net)[0]
    assert conv1.name == "features.conv1" and conv1.kind == "conv+norm"
    assert conv1.params == 6 * 25 + 6 + 2 * 6 and conv1.freezable == 6 * 25 + 6
    frozen = resolve_freeze(net, ["features.*"])
    assert "features.conv1.conv.weight" in frozen
    assert not any(".norm." in n for n in frozen)


def test_patterns_match_full_names_and_dotted_suffixes():
    net = _cnn()
    assert resolve_freeze(net, ["fc1"]) == ["classifier.fc1.0.weight", "classifier.fc1.0.bias"]
    assert resolve_freeze(net, "classifier.fc1") == [
        "classifier.fc1.0.weight",
        "classifier.fc1.0.bias",
    ]
    assert resolve_freeze(net, ["features.*"]) == [
        "features.conv1.conv.weight",
        "features.conv1.conv.bias",
        "features.conv2.conv.weight",
        "features.conv2.conv.bias",
    ]
    assert resolve_freeze(net, ["classifier.out.weight"]) == ["classifier.out.weight"]
    assert resolve_freeze(net, []) == []


def test_largest_rules_rank_by_freezable_parameters():
    net = _cnn()
    assert resolve_freeze(net, "largest") == resolve_freeze(net, ["classifier.fc1"])
    assert resolve_freeze(net, "largest:2") == resolve_freeze(
        net, ["features.conv2", "classifier.fc1"]
    )


def test_errors_name_the_pattern_and_list_the_blocks():
    net = _cnn()
    with pytest.raises(
        ConfigError, match=r"'fc9' matches no module.*classifier\.fc1 \(linear, 1,179,776 params"
    ):
        resolve_freeze(net, ["fc9"])
    with pytest.raises(ConfigError, match="nothing would be trained"):
        resolve_freeze(net, ["*"])
    with pytest.raises(ConfigError, match="largest:N"):
        resolve_freeze(net, "largest:x")
    with pytest.raises(ConfigError, match="only 4 freezable blocks"):
        resolve_freeze(net, "largest:5")
    bn = build_model("lenet5", input_shape=(1, 28, 28), num_classes=10, norm="batch", seed=0)
    with pytest.raises(ConfigError, match="always trained"):
        resolve_freeze(bn, ["norm"])


def test_plain_module_blocks_are_root_children():
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert [(b.name, b.params) for b in model_blocks(m)] == [("0", 16), ("2", 10)]
    assert resolve_freeze(m, "largest") == ["0.weight", "0.bias"]
    assert all(p.requires_grad for p in m.parameters())  # resolve_freeze only names tensors


def test_freeze_turns_off_exactly_the_resolved_parameters():
    model = _cnn()
    frozen = resolve_freeze(model, ["classifier.fc1"])
    assert freeze_(model, frozen) is model
    assert (
        [n for n, p in model.named_parameters() if not p.requires_grad]
        == frozen
        == ["classifier.fc1.0.weight", "classifier.fc1.0.bias"]
    )
