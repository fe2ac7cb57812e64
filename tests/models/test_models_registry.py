"""Registry edge validation, listing, and seeded initialisation against torch's default init."""

from __future__ import annotations

import math

import pytest
import torch

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.models import (
    build_model,
    list_models,
    model_info,
    model_names,
    portable_reset_parameters,
    reset_parameters,
)
from fedge.models.registry import _REGISTRY


def test_unknown_model_lists_models() -> None:
    with pytest.raises(UnknownNameError) as e:
        build_model("lenet7", input_shape=(1, 28, 28), num_classes=10)
    assert e.value.choices == tuple(model_names())
    assert "lenet5" in str(e.value) and "wrn-10-2" in str(e.value)
    with pytest.raises(UnknownNameError):
        model_info("nope")


@pytest.mark.parametrize(
    ("name", "kwargs", "needles"),
    [
        ("lenet", {"foo": 1}, ["'foo'", "channels", "norm_affine"]),
        ("resnet20", {"dropout": 0.1}, ["'dropout'", "norm_affine"]),
        ("mlp", {"norm": "batch"}, ["norm='batch'", "none"]),
        ("logreg", {"activation": "relu"}, ["takes no activation"]),
        ("lenet", {"activation": "gelu"}, ["activation='gelu'", "hardswish, relu, selu"]),
        ("lenet", {"norm": "layer"}, ["norm='layer'", "batch, group, none"]),
        ("vgg9", {"dropout": "yes"}, ["'dropout'", "bool"]),
        ("wrn-10-2", {"dropout": 1.5}, ["'dropout'", "[0, 1)"]),
        ("lenet", {"channels": (16,)}, ["'channels'", "2 widths"]),
        ("lenet", {"channels": (16, 0)}, ["'channels'", "positive ints"]),
        ("lenet5", {"padding": -1}, ["'padding'", ">= 0"]),
        ("lenet", {"seed": -1}, ["seed"]),
        ("lenet", {"num_classes": 0}, ["num_classes"]),
        ("lenet", {"input_shape": (28, 28)}, ["input_shape", "(1, 28, 28)"]),
    ],
)
def test_bad_options_raise_config_error_naming_them(
    name: str, kwargs: dict[str, object], needles: list[str]
) -> None:
    args: dict[str, object] = {"input_shape": (1, 28, 28), "num_classes": 10, **kwargs}
    with pytest.raises(ConfigError) as e:
        build_model(name, **args)  # type: ignore[arg-type]
    for needle in needles:
        assert needle in str(e.value)


@pytest.mark.parametrize(
    ("name", "shape", "minimum"),
    [
        ("lenet5", (1, 8, 8), 16),
        ("lenet-ppfl", (1, 12, 12), 16),
        ("alexnet-ppfl", (1, 8, 8), 16),
        ("vgg19", (3, 28, 28), 32),
        ("lenet", (1, 1, 1), 2),
        ("lenet5", (1, 15, 40), 16),
    ],
)
def test_too_small_input_names_the_minimum(
    name: str, shape: tuple[int, int, int], minimum: int
) -> None:
    with pytest.raises(ConfigError, match=f"at least {minimum}x{minimum}"):
        build_model(name, input_shape=shape, num_classes=10)
    build_model(name, input_shape=(shape[0], minimum, minimum), num_classes=10)  # and it fits


def test_lenet5_padding_lowers_minimum() -> None:
    with pytest.raises(ConfigError, match="at least 12x12"):
        build_model("lenet5", input_shape=(1, 8, 8), num_classes=10, padding=2)


def test_model_info_and_list_models() -> None:
    info = model_info("lenet")
    assert info.defaults == {
        "activation": "hardswish",
        "norm": "group",
        "channels": (16, 64),
        "norm_affine": False,
    }
    assert model_info("wrn-10-2").defaults["norm"] == "batch"
    assert model_info("logreg").activations == ()
    rows = list_models((1, 8, 8), 10)
    assert [r["name"] for r in rows] == model_names()
    assert set(rows[0]) == {"name", "params", "description", "defaults", "error"}
    by = {r["name"]: r for r in rows}
    assert by["lenet"]["params"] == 26_730 and by["lenet"]["error"] is None
    assert by["lenet5"]["params"] is None and "at least 16x16" in by["lenet5"]["error"]


def test_option_lists_are_accepted_as_tuples() -> None:
    net = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[16, 8])
    assert net.spec.options["hidden"] == (16, 8)


# --- initialisation -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lenet", "lenet5", "wrn-10-2", "resnet20", "mlp", "vgg9"])
def test_seeded_init_equals_torch_default_init(name: str) -> None:
    # Oracle: torch's own constructors, drawing from the global generator seeded with s.
    s, shape = 7, (3, 32, 32)
    net = build_model(name, input_shape=shape, num_classes=10, seed=s)
    torch.manual_seed(s)
    info = model_info(name)
    features, classifier = _REGISTRY[name].builder(
        input_shape=shape,
        num_classes=10,
        activation=info.default_activation,
        norm=info.default_norm,
        **info.options,
    )
    ref = torch.nn.Sequential(features, classifier).state_dict()  # keys "0.conv1..." / "1.out..."
    got = net.state_dict()  # keys "features.conv1..." / "classifier.out..."
    assert [k.split(".", 1)[1] for k in got] == [k.split(".", 1)[1] for k in ref]
    assert all(torch.equal(a, b) for a, b in zip(got.values(), ref.values()))


def test_seed_does_not_touch_global_rng() -> None:
    before = torch.get_rng_state()
    build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0)
    assert torch.equal(before, torch.get_rng_state())


def test_seed_none_draws_from_global_rng() -> None:
    torch.manual_seed(11)
    a = build_model("lenet", input_shape=(1, 28, 28), num_classes=10)
    b = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=11)
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))


def test_reset_parameters_regenerates_frozen_weights() -> None:
    # FedPT: a client rebuilds the initial weights from the seed after training changed them
    net = build_model("resnet20", input_shape=(3, 32, 32), num_classes=10, seed=3)
    init = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    net(torch.randn(4, 3, 32, 32))  # moves BatchNorm running stats
    reset_parameters(net, torch.Generator().manual_seed(3))
    assert all(torch.equal(init[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("name", ["lenet", "wrn-10-2", "resnet20", "mlp", "cnn-fedpt"])
def test_portable_init_follows_torch_default_distributions(name: str) -> None:
    # Oracle: torch's documented default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for Conv/Linear
    # weight and bias, ones/zeros for norms (the torch-drawn model's exact values there), and
    # each parameter the portable symmetric_uniform of its own key.
    from fedge.core import portable

    shape = (1, 28, 28) if name == "cnn-fedpt" else (3, 32, 32)
    net = build_model(name, input_shape=shape, num_classes=10, seed=5, draws="portable")
    ref = build_model(name, input_shape=shape, num_classes=10, seed=5)
    layers = (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
    scaled, ref_scaled = [], []
    for mod_name, m in net.named_modules():
        if isinstance(m, layers):
            fan_in = m.weight[0].numel()
            for attr in ("weight", "bias"):
                p = getattr(m, attr)
                if p is None:
                    continue
                bound = 1 / math.sqrt(fan_in)
                key = portable.stream_key(5, "init", f"{mod_name}.{attr}")
                assert torch.equal(p, portable.symmetric_uniform(key, p.shape, bound))
                assert float(p.detach().abs().max()) < bound * (1 + 1e-6)
                scaled.append(p.detach().flatten() / bound)
                ref_p = ref.get_parameter(f"{mod_name}.{attr}")
                ref_scaled.append(ref_p.detach().flatten() / bound)
                assert not torch.equal(p, ref_p)
    got, want = net.state_dict(), ref.state_dict()
    norm_keys = [
        k
        for k in got
        if not any(k.startswith(f"{n}.") for n, m in net.named_modules() if isinstance(m, layers))
    ]
    assert all(torch.equal(got[k], want[k]) for k in norm_keys)
    # Same law as torch's draws: U(-1, 1) after scaling; deciles agree with torch's and the law's.
    u, v = torch.cat(scaled).double(), torch.cat(ref_scaled).double()
    q = torch.linspace(0.1, 0.9, 9, dtype=torch.float64)
    tol = 4 / math.sqrt(u.numel()) + 1e-3
    assert torch.allclose(torch.quantile(u, q), 2 * q - 1, atol=2 * tol)
    assert torch.allclose(torch.quantile(u, q), torch.quantile(v, q), atol=3 * tol)


def test_portable_init_is_seeded_named_and_global_rng_free() -> None:
    before = torch.get_rng_state()
    kw = dict(input_shape=(1, 28, 28), num_classes=10, draws="portable")
    a = build_model("cnn-fedpt", seed=3, **kw)
    assert torch.equal(before, torch.get_rng_state())
    b = build_model("cnn-fedpt", seed=3, **kw)
    c = build_model("cnn-fedpt", seed=4, **kw)
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(
        a.state_dict()["classifier.fc1.0.weight"], c.state_dict()["classifier.fc1.0.weight"]
    )
    # FedPT: a client rebuilds the frozen weights from the seed after training changed them
    with torch.no_grad():
        for p in a.parameters():
            p.add_(1.0)
    portable_reset_parameters(a, 3)
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(ConfigError, match="needs a seed"):
        build_model("lenet", **kw)
    with pytest.raises(ConfigError, match="draws must be one of"):
        build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0, draws="numpy")


def test_reset_parameters_refuses_unknown_parametrised_modules() -> None:
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s = torch.nn.Parameter(torch.ones(1))

    with pytest.raises(TypeError, match="Scale"):
        reset_parameters(torch.nn.Sequential(torch.nn.Linear(2, 2), Scale()), None)
    with pytest.raises(TypeError, match="Scale"):
        portable_reset_parameters(torch.nn.Sequential(torch.nn.Linear(2, 2), Scale()), 0)


# --- options configs and tabular inputs ---------------------------------------------------------


def test_each_model_carries_an_options_config() -> None:
    from fedge.models.registry import ModelOptions

    for name in model_names():
        config = _REGISTRY[name].config
        assert issubclass(config, ModelOptions)
        assert {k: f.default for k, f in config.model_fields.items()} == model_info(name).options
    with pytest.raises(
        ConfigError, match="option 'hidden' of model 'mlp': expected a sequence of positive ints"
    ):
        build_model("mlp", input_shape=(4,), num_classes=2, hidden=[8, True])


@pytest.mark.parametrize("name", ["mlp", "logreg"])
def test_flat_models_take_tabular_features(name: str) -> None:
    net = build_model(name, input_shape=(5,), num_classes=3, seed=0)
    x = torch.randn(7, 5)
    assert net(x).shape == (7, 3)
    # oracle: logreg is one affine map of the raw features
    if name == "logreg":
        out = net.classifier.out
        assert torch.allclose(net(x), x @ out.weight.T + out.bias)


def test_image_models_refuse_tabular_features_naming_the_fix() -> None:
    with pytest.raises(
        ConfigError, match=r"takes images .* got tabular input_shape \(5,\); .*logreg, mlp"
    ):
        build_model("lenet", input_shape=(5,), num_classes=3)


def test_register_model_from_defaults_builds_a_typed_config() -> None:
    from torch import nn

    from fedge.models.registry import register_model

    @register_model(
        "test-tiny", description="d", reference="r", options={"width": 4}, flat_inputs=True
    )
    def _build(*, input_shape, num_classes, activation, norm, width):  # type: ignore[no-untyped-def]
        return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], width)), nn.Sequential(
            nn.Linear(width, num_classes)
        )

    try:
        assert build_model("test-tiny", input_shape=(3,), num_classes=2, width=6).spec.options == {
            "width": 6
        }
        with pytest.raises(ConfigError, match="option 'width' of model 'test-tiny'"):
            build_model("test-tiny", input_shape=(3,), num_classes=2, width=True)
    finally:
        _REGISTRY.unregister("test-tiny")


@pytest.mark.parametrize(
    "builder, message",
    [
        (
            lambda *, input_shape, num_classes: None,
            r"its builder cannot be called \(.*activation.*\); a builder takes",
        ),
        (
            lambda **kw: None,
            r"its builder returned NoneType; a builder takes .* returns \(features, classifier\)",
        ),
        (
            lambda **kw: (torch.nn.Flatten(), torch.nn.Linear(3, 7)),
            r"outputs shape \(7,\) for num_classes=2; its classifier must end in 2 outputs",
        ),
        (
            lambda **kw: (torch.nn.Flatten(), torch.nn.Linear(3, 2, dtype=torch.float64)),
            r"has torch.float64 parameters; fedge trains float32",
        ),
    ],
)
def test_a_registered_builder_that_breaks_the_contract_is_a_config_error(builder, message) -> None:
    from fedge.models.registry import register_model

    register_model("test-bad", description="d", reference="r", flat_inputs=True)(builder)
    try:
        with pytest.raises(ConfigError, match=message):
            build_model("test-bad", input_shape=(3,), num_classes=2)
    finally:
        _REGISTRY.unregister("test-bad")
    with pytest.raises(
        ConfigError, match=r"register_model\('test-bad'\) decorates a builder function; got 5"
    ):
        register_model("test-bad", description="d", reference="r")(5)  # type: ignore[arg-type]
