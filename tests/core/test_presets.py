"""Presets and config files: a name or a path resolves to one YAML file, read strictly (a key
given twice, invalid YAML, an empty file and a directory are each one line naming the file)."""

from __future__ import annotations

import re

import pytest

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.core.presets import preset_names


def test_presets_load_and_validate():
    assert {"quickstart", "fedavg-fmnist-lenet", "fedsgd-fmnist-lenet"} <= set(preset_names())
    for name in preset_names():
        cfg = load_config(name)
        assert cfg.rounds >= 1


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
    from fedge.core.presets import read_yaml

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


def _flat(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_activity_preset_is_the_frontier_rows_recorded_config():
    """``baffle-activity-fmnist-mlp`` runs seed 0 of the zeroth-order frontier's activity
    perturbation row as its record holds it: the same resolved config but the FLOP counter
    (which the benchmark's runs switch off) and the keys added since, at their neutral values."""
    import json
    from pathlib import Path

    from fedge.bench.variants import with_neutral_additions
    from fedge.experiment.build import resolved_config

    record = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "zo_frontier"
    recorded = json.loads(
        (record / "BAFFLE_activity_perturbation_K=100" / "seed-0.json").read_text()
    )["config"]
    preset = resolved_config(load_config("baffle-activity-fmnist-mlp"))
    # keys added since the record, at the value that changes nothing (the records' own rule)
    a, b = _flat(with_neutral_additions(recorded, preset)), _flat(preset)
    differ = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k, "-") != b.get(k, "-")}
    assert differ == {"measure.flops": (False, True)}
    assert "sigma_scale" not in recorded["method"]  # one of them, filled in
