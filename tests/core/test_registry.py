"""core.registry: lookups name the choices, duplicates are refused, the view is read-only."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.core.registry import Registry, validate_options


def test_register_get_and_unknown_name_lists_choices() -> None:
    reg: Registry[int] = Registry("colour")
    assert reg.register("red", 1) == 1
    reg.register("blue", 2)
    assert reg.get("blue") == 2 and reg.names() == ["blue", "red"] and len(reg) == 2
    with pytest.raises(UnknownNameError) as e:
        reg.get("green")
    assert str(e.value) == "unknown colour 'green'; expected one of: blue, red"
    assert e.value.choices == ("blue", "red")


@pytest.mark.parametrize(
    "typed,meant",
    [
        ("FedAvg", "fedavg"),
        ("Fashion_MNIST", "fashion-mnist"),
        ("NTK BAFFLE", "ntk-baffle"),  # case, _ and spaces
        ("mnits", "mnist"),
        ("fedav", "fedavg"),  # a near spelling
        ("xyz", None),
        ("fedprox", None),  # nothing near (FedProx is another method, not a misspelt FedPT)
    ],
)
def test_unknown_name_suggests_the_choice_it_most_likely_meant(typed, meant) -> None:
    reg: Registry[int] = Registry("name")
    for i, name in enumerate(("fedavg", "fashion-mnist", "ntk-baffle", "mnist", "baffle", "fedpt")):
        reg.register(name, i)
    with pytest.raises(UnknownNameError) as e:
        reg.get(typed)
    hint = f" (did you mean {meant!r}?)" if meant else ""
    assert (
        str(e.value)
        == f"unknown name {typed!r}{hint}; expected one of: baffle, fashion-mnist, fedavg, fedpt, mnist, ntk-baffle"
    )


def test_duplicates_refused_and_view_read_only() -> None:
    reg: Registry[int] = Registry("colour")
    reg.register("red", 1)
    with pytest.raises(ConfigError, match="colour 'red' is already registered"):
        reg.register("red", 2)
    assert reg.get("red") == 1
    view = reg.view()
    with pytest.raises(TypeError):
        view["blue"] = 3  # type: ignore[index]
    reg.register("blue", 3)
    assert view["blue"] == 3  # live
    reg.unregister("blue")
    assert "blue" not in view


class _Opts(BaseModel):
    alpha: float = Field(0.5, gt=0)


def test_validate_options_names_key_value_and_valid_keys() -> None:
    assert validate_options(_Opts, {"alpha": 2}, what="thing 'x'").alpha == 2.0  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="thing 'x' has no option 'beta'; valid options: alpha"):
        validate_options(_Opts, {"beta": 1}, what="thing 'x'")
    with pytest.raises(
        ConfigError, match=r"option 'alpha' of thing 'x': .*greater than 0, got -1; default 0.5"
    ):
        validate_options(_Opts, {"alpha": -1}, what="thing 'x'")


def test_every_kind_uses_the_registry() -> None:
    from fedge.data.partition import PARTITIONERS, register_partitioner
    from fedge.data.registry import DATASETS, register_dataset
    from fedge.methods import METHODS, get_method, register
    from fedge.models import register_model

    for mapping in (PARTITIONERS, DATASETS, METHODS):
        with pytest.raises(TypeError):
            mapping["x"] = None  # type: ignore[index]
    with pytest.raises(ConfigError, match="already registered"):
        register(get_method("fedavg"))
    with pytest.raises(ConfigError, match="already registered"):
        register_partitioner(PARTITIONERS["iid"])
    with pytest.raises(ConfigError, match="already registered"):
        register_dataset(DATASETS["digits"])
    with pytest.raises(ConfigError, match="already registered"):
        register_model("mlp", description="", reference="")(lambda **kw: None)
    with pytest.raises(
        UnknownNameError, match="unknown method 'no-such-method'; expected one of: baffle"
    ):
        get_method("no-such-method")
