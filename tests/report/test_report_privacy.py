"""The report's Privacy section: present exactly when attack results exist, with their numbers."""

from __future__ import annotations

import json

from fedge.report import render_report


def test_privacy_table_only_with_attack_results(make_run):
    path = make_run("fedsgd-a")
    md, _ = render_report(path)
    assert "## Privacy" not in md.read_text()
    (path / "attacks").mkdir()
    (path / "attacks" / "dlg.json").write_text(
        json.dumps(
            {
                "masked": False,
                "baseline_mean_image_mse": 0.0207,
                "baseline_mid_gray_mse": 0.0556,
                "attacks": {"dlg": {"median_mse": 0.000309, "label_accuracy": 1.0}},
            }
        )
    )
    (path / "attacks" / "mia.json").write_text(json.dumps({"auc": 0.576, "best_precision": 0.696}))
    text = render_report(path)[0].read_text()
    assert "## Privacy" in text
    assert (
        "| reconstruction (dlg), uploads in the clear | median MSE 0.000309, labels 1.00 | mean image 0.0207, mid-gray 0.0556 |"
        in text
    )
    assert "| membership (loss threshold) | AUC 0.576, best precision 0.696 | AUC 0.5 |" in text
    mia = {
        "auc": 0.6,
        "tpr_at_1pct_fpr": 0.05,
        "tpr_at_01pct_fpr": 0.01,
        "precision": 0.58,
        "best_precision": 0.9,
    }
    (path / "attacks" / "mia-shadow.json").write_text(
        json.dumps({"shadows": 4, "loss": mia, "shadow": mia, "lira": mia})
    )
    (path / "attacks" / "pia.json").write_text(
        json.dumps({"auc": 0.93, "uploads": 40, "property_class": 0, "masked": False})
    )
    text = render_report(path)[0].read_text()
    cell = "AUC 0.600, TPR@1%FPR 0.050, TPR@0.1%FPR 0.010, precision 0.580, best precision 0.900 | AUC 0.5 |"
    assert f"| membership (offline LiRA, 4 shadows) | {cell}" in text
    assert f"| membership (shadow models, 4 shadows) | {cell}" in text
    assert (
        "| property (class 0 in the batch), uploads in the clear | AUC 0.930 on 40 uploads | AUC 0.5 |"
        in text
    )


def test_privacy_table_shows_per_round_membership_and_eppfl_inversion(make_run):
    path = make_run("eppfl-a")
    (path / "attacks").mkdir()
    (path / "attacks" / "dlg.json").write_text(
        json.dumps(
            {
                "method": "eppfl",
                "baseline_mean_image_mse": 0.08,
                "baseline_mid_gray_mse": 0.19,
                "attacks": {"eppfl-inversion": {"median_mse": 1e-7}},
            }
        )
    )
    mia = {
        "auc": 0.7,
        "tpr_at_1pct_fpr": 0.1,
        "tpr_at_01pct_fpr": 0.0,
        "precision": 0.6,
        "best_precision": 0.8,
    }
    (path / "attacks" / "mia-rounds.json").write_text(
        json.dumps({"rounds": {"1": {"loss": mia}, "5": {"loss": mia}}})
    )
    text = render_report(path)[0].read_text()
    assert (
        "| reconstruction (eppfl-inversion), activations at the edge server | median MSE 1e-07 | mean image 0.08, mid-gray 0.19 |"
        in text
    )
    cell = "AUC 0.700, TPR@1%FPR 0.100, TPR@0.1%FPR 0.000, precision 0.600, best precision 0.800 | AUC 0.5 |"
    assert f"| membership (loss threshold), global model after round 1 | {cell}" in text
    assert f"| membership (loss threshold), global model after round 5 | {cell}" in text
