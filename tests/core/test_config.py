import re

import pytest

from fedge.core.config import apply_overrides, check_positive_int, load_config, preset_names
from fedge.core.errors import ConfigError


def test_presets_load_and_validate():
    assert {"quickstart", "fedavg-fmnist-lenet", "fedsgd-fmnist-lenet"} <= set(preset_names())
    for name in preset_names():
        cfg = load_config(name)
        assert cfg.rounds >= 1


def test_overrides_parse_yaml_scalars_and_nest():
    raw = apply_overrides({"a": {"b": 1}}, ["a.b=2", "a.c=0.5", "d.e=true", "s=hello", "n=null"])
    assert raw == {"a": {"b": 2, "c": 0.5}, "d": {"e": True}, "s": "hello", "n": None}


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_overrides({}, ["rounds"])


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


def test_per_round_above_num_is_rejected():
    with pytest.raises(ConfigError, match="per_round"):
        load_config("quickstart", overrides=["clients.per_round=11"])


def test_fraction_per_round():
    cfg = load_config("quickstart", overrides=["clients.num=100", "clients.per_round=0.1"])
    assert cfg.clients.count() == 10
    with pytest.raises(ConfigError):
        load_config("quickstart", overrides=["clients.per_round=1.5"])


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="'seed'"):
        load_config("quickstart", overrides=["seed=abc"])


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match="quickstart"):
        load_config("quikstart")


def test_a_missing_path_without_a_yaml_suffix_is_a_missing_file_not_a_preset(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"config file '.*nope/cfg' does not exist; give a YAML file or a preset name",
    ):
        load_config(str(tmp_path / "nope" / "cfg"))


@pytest.mark.parametrize("written", ["./nope", "../nope", ".nope", "nope/"])
def test_a_missing_path_written_relative_is_a_missing_file_not_a_preset(
    written, tmp_path, monkeypatch
):
    monkeypatch.chdir(
        tmp_path
    )  # Path("./nope") is Path("nope"): the text says it is a path, and is echoed
    with pytest.raises(
        ConfigError, match=rf"config file '{re.escape(written)}' does not exist; give a YAML file"
    ):
        load_config(written)
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config("nope")


def test_switching_a_choice_section_drops_the_old_choices_keys():
    raw = {
        "method": {"name": "baffle", "k": 100},
        "model": {"name": "lenet", "activation": "hardswish"},
    }
    out = apply_overrides(raw, ["method.local_epochs=2", "method.name=fedavg", "model.name=lenet"])
    assert out["method"] == {"name": "fedavg", "local_epochs": 2}
    assert out["model"] == {"name": "lenet", "activation": "hardswish"}  # same name: kept


def test_check_positive_int_accepts_counts_and_names_the_bad_value():
    for ok in (1, 7, 2**40):
        check_positive_int("k", ok)
    for bad in (0, -3, True, 2.0, "3", None):
        with pytest.raises(ConfigError) as err:
            check_positive_int("k", bad)
        assert str(err.value) == f"k must be a positive int, got {bad!r}"


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


def test_a_key_given_twice_in_a_config_file_is_refused_with_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys silently: a second ``method:`` section would
    replace the first whole. fedge refuses it, naming the key and both lines."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "method:\n  name: fedavg\n  local_epochs: 2\nrounds: 1\nmethod:\n  name: fedsgd\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"^config file '.*c.yaml' is not valid YAML at line 5, column 1 \(key "
        r"'method' given twice, first on line 1\); fix it$",
    ):
        load_config(path)
    path.write_text("clients: {num: 3, num: 4}\n")
    with pytest.raises(ConfigError, match=r"key 'num' given twice, first on line 1"):
        load_config(path)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("_c: &c {num: 4, per_round: 4}\nclients:\n  <<: *c\n  per_round: 2\n")
    from fedge.core.config import read_yaml

    assert read_yaml(path.read_text())["clients"] == {"num": 4, "per_round": 2}


def test_invalid_yaml_is_one_line_naming_where(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: [1\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "\n" not in str(exc.value)
    assert str(exc.value).startswith(
        f"config file '{path}' is not valid YAML at line 2, column 1 ("
    )


@pytest.mark.parametrize("text", ["", "\n\n", "# rounds: 5\n"])
def test_a_config_file_without_settings_is_refused_but_an_empty_mapping_runs_defaults(
    tmp_path, text
):
    """A blank file (saved before it was written, truncated, every line commented out) would run
    every default without a word; ``{}`` says that on purpose."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(
        ConfigError,
        match=r"^config file '.*c.yaml' holds no settings \(empty, or only comments\); "
        r"write the keys to change, or '\{\}' to run every default on purpose$",
    ):
        load_config(path)
    path.write_text("{}  # every default\n")
    assert load_config(path) == load_config({})


def test_a_directory_given_as_config_is_named_so(tmp_path):
    (tmp_path / "run.yaml").mkdir()
    with pytest.raises(
        ConfigError, match=r"config file '.*run.yaml' is a directory; give a YAML file$"
    ):
        load_config(tmp_path / "run.yaml")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("rounds: 1\n")
    with pytest.raises(
        ConfigError,
        match=r"is a directory; give a YAML file \(to continue the run in it: fedge run "
        r"--resume .*run\)",
    ):
        load_config(tmp_path / "run")
