"""compare_runs: table content, bytes-to-target, plots, warnings and errors."""

from __future__ import annotations

import pytest
from rich.console import Console

from fedge.core.errors import ConfigError
from fedge.report import ComparisonWarning, NotARunDirError, compare_runs


@pytest.fixture
def two_runs(make_run):
    a = make_run("fedavg", accuracies=(0.2, 0.4, 0.6, 0.7))
    b = make_run(
        "baffle", method="baffle", accuracies=(0.1, 0.3, 0.55), complete=False, peak_bytes=2_000_000
    )
    return a, b


def test_table_lists_both_runs_numbers(two_runs):
    cmp = compare_runs(list(two_runs), target_accuracy=0.5)
    table = cmp.table_markdown()
    header, _, row_a, row_b = table.splitlines()
    assert "bytes to 50.00%" in header and "peak memory" in header
    assert row_a.startswith("| fedavg | fedavg | cnn | cifar10 | 4 | 70.00% | 70.00% |")
    assert row_b.startswith("| baffle | baffle | cnn | cifar10 | 3 of 3 (incomplete) | 55.00% |")
    # run a reaches 50% at round 3: 3 * (1 MB + 0.25 MB); b at round 3 too
    assert "| 3.75 MB |" in row_a and "| 3.75 MB |" in row_b
    assert "| 4.00 MB | 1.00 MB |" in row_a  # total bytes down / up
    assert "2.00 MB" in row_b and row_a.endswith("| — |")  # peak memory only for b


def test_target_not_reached(two_runs):
    rows = compare_runs(list(two_runs), target_accuracy=0.65).rows()
    col = compare_runs(list(two_runs), target_accuracy=0.65).columns().index("bytes to 65.00%")
    assert [r[col] for r in rows] == ["5.00 MB", "not reached"]


def test_rich_table_has_a_row_per_run(two_runs):
    table = compare_runs(list(two_runs)).table_rich()
    assert table.row_count == 2
    console = Console(width=250, record=True)
    console.print(table)
    out = console.export_text()
    assert "fedavg" in out and "baffle" in out and "70.00%" in out


def test_out_dir_gets_overlaid_plots_and_markdown(two_runs, tmp_path):
    cmp = compare_runs(list(two_runs), tmp_path / "cmp")
    names = sorted(p.name for p in cmp.plots)
    assert names == [
        "accuracy.png",
        "accuracy_vs_bytes.png",
        "accuracy_vs_flops.png",
        "peak_memory.png",
    ]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in cmp.plots)
    assert cmp.table_markdown() in (tmp_path / "cmp" / "comparison.md").read_text()


def test_no_out_dir_writes_nothing(two_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    assert compare_runs(list(two_runs)).plots == []
    assert sorted(tmp_path.iterdir()) == before


def test_different_datasets_warn_but_compare(make_run):
    a, b = make_run("a"), make_run("b", dataset="femnist")
    with pytest.warns(ComparisonWarning, match="cifar10, femnist"):
        cmp = compare_runs([a, b])
    assert len(cmp.rows()) == 2


def test_same_directory_names_get_distinct_labels(make_run):
    a, b = make_run("x/run"), make_run("y/run")
    assert [r.label for r in compare_runs([a, b]).runs] == ["x/run", "y/run"]


def test_bad_inputs_are_clear_errors(make_run, tmp_path):
    with pytest.raises(ConfigError, match="no run directories"):
        compare_runs([])
    with pytest.raises(ConfigError, match="got 80.*pass 0.8"):
        compare_runs([make_run()], target_accuracy=80)
    with pytest.raises(NotARunDirError, match="missing"):
        compare_runs([tmp_path / "missing"])


def test_privacy_columns_appear_only_with_attack_results(two_runs):
    import json

    a, b = two_runs
    assert not any("AUC" in c for c in compare_runs([a, b]).columns())
    (a / "attacks").mkdir()
    (a / "attacks" / "dlg.json").write_text(
        json.dumps(
            {
                "baseline_mean_image_mse": 0.078,
                "attacks": {"dlg": {"median_mse": 0.00026}, "other": {"median_mse": 0.3}},
            }
        )
    )
    (a / "attacks" / "mia.json").write_text(json.dumps({"auc": 0.55, "precision": 0.52}))
    (a / "attacks" / "mia-shadow.json").write_text(
        json.dumps({"lira": {"auc": 0.61, "precision": 0.57}})
    )
    (b / "attacks").mkdir()
    (b / "attacks" / "pia.json").write_text(json.dumps({"auc": 0.5, "masked": True}))
    cmp = compare_runs([a, b])
    cols = cmp.columns()
    assert cols[-4:] == ["DRA MSE (mean img)", "MIA AUC", "MIA precision", "PIA AUC"]
    row_a, row_b = cmp.rows()
    assert row_a[-4:] == [
        "0.00026 (0.078) dlg",
        "0.610 lira",
        "0.570",
        "—",
    ]  # the strongest MIA, the best DRA
    assert row_b[-4:] == ["—", "—", "—", "0.500 masked"]


def test_simulated_time_is_a_column_and_a_plot_when_a_run_has_it(make_run, tmp_path):
    a, b = make_run("a", sim_time_s=30.0), make_run("b")
    cmp = compare_runs([a, b], tmp_path / "cmp")
    col = cmp.columns().index("simulated time")
    assert [r[col] for r in cmp.rows()] == ["2 min 30 s", "—"]  # 5 rounds of 30 s; none
    assert "accuracy_vs_time.png" in [p.name for p in cmp.plots]
    assert "simulated time" not in compare_runs([b]).columns()
