"""FedPT's partition search (principles 1-4) on tiny budgets."""

import json

import pytest
from typer.testing import CliRunner

from fedge.cli.main import app
from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.fedpt_search import fedpt_search

FC1, FC2, OUT = (
    "features.fc1",
    "features.fc2",
    "classifier.out",
)  # mlp blocks: 13,000 / 40,200 / 2,010 params


def _cfg(tiny, **kw):
    return load_config(tiny(rounds=1, **kw))


def test_generous_tolerance_keeps_adding_blocks_largest_first(tmp_path, tiny):
    res = fedpt_search(_cfg(tiny), budget_rounds=1, tolerance=0.99, out=tmp_path)
    # principle 1 then 2: fc2 (largest), then fc2+fc1; adding out would freeze everything: skipped
    assert [t["freeze"] for t in res["trials"]] == [[FC2], [FC2, FC1]]
    assert all(t["accepted"] for t in res["trials"])
    assert res["chosen"]["freeze"] == [FC2, FC1]
    assert res["chosen"]["trainable_fraction"] == pytest.approx(2010 / 55210)
    for t in [
        res["baseline"],
        *res["trials"],
    ]:  # figures are those of the trial's own run directory
        summary = json.loads((tmp_path / t["run_dir"].split("/")[-1] / "summary.json").read_text())
        assert t["accuracy"] == summary["final_test_accuracy"]
    assert res["trials"][0]["bytes_up"] < 0.3 * res["baseline"]["bytes_up"]  # 27% trainable
    assert json.loads((tmp_path / "search.json").read_text()) == res


def test_rejected_blocks_are_replaced_by_the_next_smaller_one(tmp_path, tiny):
    res = fedpt_search(_cfg(tiny, seed=3), budget_rounds=1, tolerance=0.0, out=tmp_path)
    base, accepted, order = res["baseline"]["accuracy"], [], [FC2, FC1, OUT]
    for t in res["trials"]:  # whatever the accuracies, the walk follows principles 2 and 3
        nxt = next(b for b in order if b not in accepted and b not in t["freeze"][:-1])
        assert t["freeze"] == [*accepted, nxt]
        assert t["accepted"] == (t["accuracy"] >= base - 0.0)
        if t["accepted"]:
            accepted = t["freeze"]
        order = order[order.index(nxt) + 1 :]
    assert res["chosen"]["freeze"] == accepted


def test_search_resumes_and_refuses_a_different_budget(tmp_path, tiny):
    first = fedpt_search(_cfg(tiny), budget_rounds=1, tolerance=0.5, out=tmp_path, max_trials=1)
    again = fedpt_search(_cfg(tiny), budget_rounds=1, tolerance=0.5, out=tmp_path, max_trials=1)
    assert again == first  # complete trials are read, not rerun
    with pytest.raises(ConfigError, match="different configuration"):
        fedpt_search(_cfg(tiny), budget_rounds=2, tolerance=0.5, out=tmp_path, max_trials=1)


def test_bad_input(tmp_path, tiny):
    with pytest.raises(ConfigError, match="method.name fedavg or fedpt"):
        fedpt_search(
            _cfg(tiny, **{"method.name": "fedsgd"}), budget_rounds=1, tolerance=0.02, out=tmp_path
        )
    with pytest.raises(ConfigError, match="--tolerance"):
        fedpt_search(_cfg(tiny), budget_rounds=1, tolerance=1.5, out=tmp_path)


def test_cli_prints_trials_and_choice(tmp_path, tiny):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny(rounds=1)))
    r = CliRunner().invoke(
        app,
        [
            "fedpt-search",
            str(cfg),
            "--budget-rounds",
            "1",
            "--tolerance",
            "0.9",
            "--max-trials",
            "1",
            "--out",
            str(tmp_path / "s"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "chosen: --set method.freeze=[features.fc2]" in " ".join(
        r.output.split()
    )  # rich wraps lines
    bad = CliRunner().invoke(
        app, ["fedpt-search", str(cfg), "--budget-rounds", "0", "--out", str(tmp_path / "t")]
    )
    assert bad.exit_code == 2 and "--budget-rounds" in bad.output
    blocks = CliRunner().invoke(
        app, ["models", "--input-shape", "1,28,28", "--blocks", "cnn-fedpt"]
    )
    assert (
        blocks.exit_code == 0 and "classifier.fc1" in blocks.output and "1,179,776" in blocks.output
    )
