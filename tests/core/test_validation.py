"""Config checks: every problem is one line naming the dotted key, the bad value and the valid
keys or the closest one."""

from __future__ import annotations

import pytest

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.core.validation import check_positive_int


def test_out_of_range_names_the_key():
    with pytest.raises(ConfigError, match="'rounds'") as exc:
        load_config("quickstart", overrides=["rounds=-1"])
    assert "-1" in str(exc.value)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="no.such.key|'no'") as exc:
        load_config("quickstart", overrides=["no.such.key=1"])
    assert "rounds" in str(exc.value) and "valid keys" in str(exc.value)


def test_unknown_nested_key_suggests():
    with pytest.raises(ConfigError, match="clients.per_rond") as exc:
        load_config("quickstart", overrides=["clients.per_rond=3"])
    assert "clients.per_round" in str(exc.value)


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="'seed'"):
        load_config("quickstart", overrides=["seed=abc"])


def test_check_positive_int_accepts_counts_and_names_the_bad_value():
    for ok in (1, 7, 2**40):
        check_positive_int("k", ok)
    for bad in (0, -3, True, 2.0, "3", None):
        with pytest.raises(ConfigError) as err:
            check_positive_int("k", bad)
        assert str(err.value) == f"k must be a positive int, got {bad!r}"


def test_a_huge_value_is_not_echoed_in_full():
    huge = "A" * 100_000
    for override in (f"rounds={huge}", f"rounds.x={huge}", huge):
        with pytest.raises(ConfigError) as exc:
            load_config("quickstart", overrides=[override])
        msg = str(exc.value)
        assert len(msg) < 500 and "... (" in msg and "characters)" in msg, msg[:600]
