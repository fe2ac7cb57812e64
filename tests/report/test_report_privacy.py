"""The report's Privacy section: present exactly when attack results exist, with their numbers."""

from __future__ import annotations

import json

from fedge.report import render_report


def test_privacy_table_only_with_attack_results(make_run):
    path = make_run("fedsgd-a")
    md, _ = render_report(path)
    assert "## Privacy" not in md.read_text()
    (path / "attacks").mkdir()
    (path / "attacks" / "dlg.json").write_text(json.dumps({
        "masked": False, "baseline_mean_image_mse": 0.0207, "baseline_mid_gray_mse": 0.0556,
        "attacks": {"dlg": {"median_mse": 0.000309, "label_accuracy": 1.0}},
    }))
    (path / "attacks" / "mia.json").write_text(json.dumps({"auc": 0.576, "best_precision": 0.696}))
    text = render_report(path)[0].read_text()
    assert "## Privacy" in text
    assert "| reconstruction (dlg), uploads in the clear | median MSE 0.000309, labels 1.00 | mean image 0.0207, mid-gray 0.0556 |" in text
    assert "| membership (loss threshold) | AUC 0.576, best precision 0.696 | AUC 0.5 |" in text
