"""``--set`` overrides: values are YAML scalars, keys nest, a bad item names itself, and a new
choice's name drops the old choice's keys."""

from __future__ import annotations

import pytest

from fedge.core.errors import ConfigError
from fedge.core.overrides import apply_overrides, check_unique_keys


def test_overrides_parse_yaml_scalars_and_nest():
    raw = apply_overrides({"a": {"b": 1}}, ["a.b=2", "a.c=0.5", "d.e=true", "s=hello", "n=null"])
    assert raw == {"a": {"b": 2, "c": 0.5}, "d": {"e": True}, "s": "hello", "n": None}


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_overrides({}, ["rounds"])


def test_switching_a_choice_section_drops_the_old_choices_keys():
    raw = {
        "method": {"name": "baffle", "k": 100},
        "model": {"name": "lenet", "activation": "hardswish"},
    }
    out = apply_overrides(raw, ["method.local_epochs=2", "method.name=fedavg", "model.name=lenet"])
    assert out["method"] == {"name": "fedavg", "local_epochs": 2}
    assert out["model"] == {"name": "lenet", "activation": "hardswish"}  # same name: kept


def test_a_key_given_twice_is_refused_naming_it():
    with pytest.raises(
        ConfigError,
        match=r"^--set rounds given twice \(--set rounds=1 and --set rounds=2\); give each key once$",
    ):
        check_unique_keys(["rounds=1", "seed=3", "rounds=2"])
    long = "method.name=" + "x" * 100_000
    with pytest.raises(ConfigError) as exc:
        check_unique_keys([long, long])
    assert len(str(exc.value)) < 400 and "(100012 characters)" in str(exc.value)
    check_unique_keys(["rounds=1", "method.rounds=2", "seed=0"])  # distinct dotted keys pass
