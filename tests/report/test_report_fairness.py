"""The fairness section of ``fedge report`` and the fairness columns of ``fedge compare``, from
a run directory whose metrics carry per-client accuracies, and through the CLI on a real run."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from fedge.cli.main import app
from fedge.report import compare_runs, render_report
from fedge.report.runlog import load_run
from fedge.runtime.fairness import fairness_stats

# 10 clients, k = ceil(0.1 * 10) = 1: worst 10% = 0.1, best 10% = 0.9; mean 0.53;
# variance = mean of squares - mean^2 = 3.31 / 10 - 0.53^2 = 0.0501 (client 3 holds none out)
PER_CLIENT = [0.5, 0.1, 0.9, None, 0.6, 0.4, 0.8, 0.3, 0.7, 0.5, 0.5]


def _with_fairness(run, per_client=PER_CLIENT):
    """Give the last metrics line of a fake run the per-client figures the engine logs."""
    path = run / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[-1].update({**fairness_stats(per_client), "client_accuracy": per_client})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_hand_computed_statistics_of_the_fixture():
    s = fairness_stats(PER_CLIENT)
    assert round(s["client_acc_mean"], 12) == 0.53
    assert (s["client_acc_worst10"], s["client_acc_best10"]) == (0.1, 0.9)
    assert round(s["client_acc_var"], 12) == 0.0501


def test_report_shows_the_fairness_table_and_the_histogram(make_run):
    run = _with_fairness(make_run("fair"))
    md, html = render_report(run)
    text = md.read_text()
    section = text[text.index("## Fairness across devices") :]
    section = section[: section.index("\n## ", 1)]
    assert "| clients evaluated | 10 of 11 |" in section
    assert "| mean client accuracy | 53.00% |" in section
    assert "| worst 10% (mean of the lowest 1) | 10.00% |" in section
    assert "| best 10% (mean of the highest 1) | 90.00% |" in section
    assert "| variance of client accuracy | 0.0501 |" in section
    assert "plots/client_accuracy.png" in section
    assert (run / "plots" / "client_accuracy.png").stat().st_size > 0
    assert "Fairness across devices" in html.read_text()


def test_report_without_local_tests_has_no_fairness_section(make_run):
    md, _ = render_report(make_run("plain"))
    assert "Fairness" not in md.read_text()
    assert not (md.parent / "plots" / "client_accuracy.png").exists()
    assert load_run(md.parent).fairness is None


def test_compare_has_the_fairness_columns(make_run):
    fair, plain = _with_fairness(make_run("fair")), make_run("plain")
    cmp = compare_runs([fair, plain])
    cols = cmp.columns()
    assert cols[-4:] == ["client acc mean", "worst 10%", "best 10%", "client acc var"]
    rows = {r[0]: r for r in cmp.rows()}
    assert rows["fair"][-4:] == ["53.00%", "10.00%", "90.00%", "0.0501"]
    assert rows["plain"][-4:] == ["—"] * 4
    assert "client acc mean" not in compare_runs([plain]).columns()


def test_cli_report_and_compare_on_a_run_with_local_tests(tmp_path, tiny):
    runner = CliRunner()
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        yaml.safe_dump(
            tiny(rounds=2, **{"dataset": {"name": "digits"}, "partition.local_test": 0.2})
        )
    )
    run = tmp_path / "run"
    res = runner.invoke(app, ["run", str(cfg), "--out", str(run), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", str(run)])
    assert res.exit_code == 0, res.output
    text = (run / "report.md").read_text()
    assert "## Fairness across devices" in text and "plots/client_accuracy.png" in text
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    res = runner.invoke(app, ["compare", str(run), "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    table = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "| client acc mean | worst 10% | best 10% | client acc var |" in table
    assert f"{100 * last['client_acc_worst10']:.2f}%" in table
