"""The run config's models: client counts and fractions, failure options and bools refused as
numbers, validated in every section."""

from __future__ import annotations

import pytest

from fedge.core.config import load_config
from fedge.core.errors import ConfigError


def test_per_round_above_num_is_rejected():
    with pytest.raises(ConfigError, match="per_round"):
        load_config("quickstart", overrides=["clients.per_round=11"])


def test_fraction_per_round():
    cfg = load_config("quickstart", overrides=["clients.num=100", "clients.per_round=0.1"])
    assert cfg.clients.count() == 10
    with pytest.raises(ConfigError):
        load_config("quickstart", overrides=["clients.per_round=1.5"])


def test_client_failure_options_name_the_bad_value_and_the_fix():
    base = {"clients": {"num": 10, "per_round": 4}}
    with pytest.raises(
        ConfigError, match=r"clients.dropout=0.2 loses clients' replies.*set clients.min_replies"
    ):
        load_config({**base, "clients": {**base["clients"], "dropout": 0.2}})
    with pytest.raises(
        ConfigError, match=r"clients.min_replies=5 exceeds the 4 clients sampled per round"
    ):
        load_config({**base, "clients": {**base["clients"], "min_replies": 5}})
    with pytest.raises(ConfigError, match="dropout"):
        load_config({**base, "clients": {**base["clients"], "dropout": 1.0, "min_replies": 1}})
    cfg = load_config({**base, "clients": {**base["clients"], "dropout": 0.2, "min_replies": 2}})
    assert (cfg.clients.dropout, cfg.clients.min_replies) == (0.2, 2)


@pytest.mark.parametrize(
    "key", ["rounds", "clients.num", "seed", "method.local_epochs", "method.client_optimizer.lr"]
)
def test_a_bool_is_not_a_number(key):
    """rounds=True would otherwise pass as 1: refused in every section (numeric strings, which
    PyYAML makes of 1e-3, are still read as numbers)."""
    from fedge.experiment.build import method_config

    with pytest.raises(
        ConfigError, match=rf"config key '{key}': expected a number, got True \(a bool\)$"
    ):
        method_config(load_config("quickstart", overrides={key: True}))
    assert (
        method_config(
            load_config("quickstart", overrides=["method.client_optimizer.lr=1e-3"])
        ).client_optimizer.lr
        == 0.001
    )


def test_threads_above_the_available_cores_warn_naming_them(monkeypatch):
    import warnings

    import fedge.core.config as config_mod

    monkeypatch.setattr(config_mod, "available_cores", lambda: 4)
    with pytest.warns(UserWarning, match=r"threads=10000 is more than the 4 cores .* at most 4"):
        load_config("quickstart", overrides=["threads=10000"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config("quickstart", overrides=["threads=4"]).threads == 4
        assert load_config("quickstart", overrides=["threads=null"]).threads is None


def test_rounds_are_bounded_with_the_reason():
    assert load_config("quickstart", overrides=["rounds=10000000"]).rounds == 10**7
    with pytest.raises(ConfigError) as exc:
        load_config("quickstart", overrides=["rounds=10000001"])
    msg = str(exc.value)
    assert msg.startswith("config key 'rounds': rounds must be at most 10,000,000, got 10000001")
    assert "12 days" in msg and msg.count("10000001") == 1
    with pytest.raises(ConfigError, match="'rounds'"):
        load_config("quickstart", overrides=["rounds=1.0e+23"])
