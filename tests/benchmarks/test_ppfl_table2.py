"""benchmarks/ppfl_table2.py: the PPFL Table 2 analogue's table builder on a tiny config."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fedge.core.errors import ConfigError

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ppfl_table2.py"
TINY = [
    "dataset=digits",
    "resize=16",
    "dra_clients=2",
    "iterations=20",
    "clients=2",
    "per_client=8",
    "rounds=4",
    "local_epochs=1",
    "shadows=1",
    "test=120",
    "pia_clients=8",
]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ppfl_table2", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ppfl_table2"] = mod
    spec.loader.exec_module(mod)
    return mod


bench = _load()


@pytest.fixture(scope="module")
def tiny() -> tuple[dict[str, Any], dict[str, int], dict[str, dict[str, Any]]]:
    s = bench.parse_settings(bench.SETTINGS, TINY)
    return s, bench.model_info(s), bench.table2(s)


def test_settings_parse_and_bad_values_name_the_fix() -> None:
    s = bench.parse_settings(bench.SETTINGS, ["rounds=8", "lr=0.1", "model=alexnet-ppfl"])
    assert (s["rounds"], s["lr"], s["model"]) == (8, 0.1, "alexnet-ppfl")
    with pytest.raises(ConfigError, match="unknown setting 'round'"):
        bench.parse_settings(bench.SETTINGS, ["round=8"])
    with pytest.raises(ConfigError, match="rounds='x' is not a number"):
        bench.parse_settings(bench.SETTINGS, ["rounds=x"])
    with pytest.raises(
        ConfigError, match=r"rounds=10 does not split evenly over PPFL's 4 stages.*rounds=8"
    ):
        bench.methods({**s, "rounds": 10}, 4)


def test_bad_settings_exit_2_and_write_no_docs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "benchmarks.md"
    assert bench.main(["--docs", str(docs), "--set", *TINY, "rounds=6"]) == 2
    assert "rounds=6 does not split evenly" in capsys.readouterr().err and not docs.exists()


def test_model_info_is_the_zoo_models(tiny: Any) -> None:
    from fedge.models.registry import build_model, count_parameters

    s, info, _ = tiny
    # conv1 + conv2 + conv3 + FC(128 -> 10) at a 1x1 pooled map; 3 conv stages + the classifier stage
    assert info["parameters"] == (9 * 128 + 128) + 2 * (9 * 128 * 128 + 128) + (128 * 10 + 10)
    model = build_model("alexnet-ppfl", input_shape=(1, 16, 16), num_classes=10, seed=0)
    assert info == {"stages": 4, "parameters": count_parameters(model)}


def test_table_cells_come_from_the_attacks(tiny: Any) -> None:
    s, info, r = tiny
    f, p = r["fedavg"], r["ppfl"]
    # DRA: fedavg's plaintext delta (every parameter as float32) vs PPFL's sealed stage-1 upload
    assert not f["dra"]["sealed"] and p["dra"]["sealed"]
    assert f["dra"]["upload_bytes"] >= 4 * info["parameters"] > p["dra"]["upload_bytes"]
    assert f["dra"]["clients_attacked"] == p["dra"]["clients_attacked"] == s["dra_clients"]
    for d in (f["dra"], p["dra"]):
        assert 0 <= d["median_mse"] <= 1 and 0 < d["mean_image"] < d["mid_gray"] + 0.2
    # MIA: every training sample a member, accuracies of the released models
    for m in (f["mia"], p["mia"]):
        assert m["members"] == s["clients"] * s["per_client"] and m["shadows"] == 1
        assert (
            {"loss", "shadow", "lira"} <= set(m)
            and 0 <= m["loss"]["auc"] <= 1
            and 0.5 <= m["loss"]["precision"] <= 1
        )
        assert 0 <= m["test_accuracy"] <= 1 and 0 <= m["train_accuracy"] <= 1
    # the last layer withheld: a classifier completed on the attacker's test samples (all but the non-members)
    for w in (f["mia_withheld"], p["mia_withheld"]):
        assert w["aux"] == s["test"] - s["clients"] * s["per_client"] and 0 <= w["loss"]["auc"] <= 1
        assert 0 <= w["train_accuracy"] <= 1 and 0 <= w["test_accuracy"] <= 1
    # PIA: measured on fedavg's uploads; PPFL's are all ciphertext and the cell says why
    assert f["pia"]["uploads"] == s["pia_clients"] and 0 <= f["pia"]["auc"] <= 1
    assert p["pia"]["uploads"] == s["pia_clients"] and "ciphertext" in p["pia"]["skipped"]
    c = bench.cells(f)
    gap = f["mia"]["train_accuracy"] - f["mia"]["test_accuracy"]
    assert c["gap"] == f"{f['mia']['train_accuracy']:.2f} / {gap:.2f}"
    assert c["mia_precision"].split(" / ")[0] == f"{f['mia']['loss']['precision']:.2f}"
    assert bench.cells(p)["upload"].endswith("(sealed)") and bench.cells(p)["pia"].startswith(
        "not measurable"
    )


def test_rendered_section_round_trips_through_json(tiny: Any, tmp_path: Path) -> None:
    s, info, r = tiny
    saved = tmp_path / "t2.json"
    saved.write_text(
        json.dumps({"settings": s, "seconds": 1.0, "model": info, "results": r}, default=str)
    )
    docs = tmp_path / "benchmarks.md"
    assert bench.main(["--from-json", str(saved), "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert "<!-- bench:ppfl-table2 -->" in text and "<!-- /bench:ppfl-table2 -->" in text
    assert "| end-to-end FL (fedavg) |" in text and "| PPFL (layer-wise, in enclaves) |" in text
    assert f"{info['parameters']:,} parameters" in text and "resized to 16x16" in text
    assert (
        text.count("| end-to-end FL (fedavg) |") == 3
    )  # the table, the withheld-layer table, the paper's
    assert (
        "--set dataset=digits" in text and "rounds=4" in text
    )  # the exact command, with its overrides


def test_cells_are_recorded_and_the_section_renders_from_the_records_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, docs = tmp_path / "records", tmp_path / "benchmarks.md"
    argv = ["--records", str(records), "--set", *TINY]
    assert bench.main([*argv, "--docs", str(docs)]) == 0
    first = docs.read_text()
    assert f"Rendered from the committed run records under `{records.as_posix()}/`" in first
    assert sorted(p.name for p in records.glob("*.json")) == sorted(
        [
            *(
                f"{m}-{a}.json"
                for m in ("fedavg", "ppfl")
                for a in ("dra", "mia", "mia_withheld", "pia")
            ),
            "model-alexnet-ppfl-digits-16.json",  # its size and stages: rendering needs no data
        ]
    )
    rec = json.loads((records / "ppfl-dra.json").read_text())
    assert rec["settings"]["rounds"] == 4 and rec["machine"]["cpu"] and rec["result"]["sealed"]
    # nothing is measured again: the records alone render the same section
    for fn in ("dra", "mia", "mia_withheld", "pia", "_model_info"):
        monkeypatch.setattr(bench, fn, lambda *a: pytest.fail("measured a recorded cell"))
    again = tmp_path / "again.md"
    assert bench.main([*argv, "--table-only", "--docs", str(again)]) == 0
    assert again.read_text() == first
    # a record of other settings is refused by name; a missing cell is listed as awaiting
    with pytest.raises(ConfigError, match="made with other settings"):
        bench.main(["--records", str(records), "--table-only", "--set", *TINY[:-1]])
    (records / "ppfl-pia.json").unlink()
    assert bench.main([*argv, "--table-only"]) == 1
