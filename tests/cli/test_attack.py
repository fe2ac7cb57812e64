"""``fedge attack`` on a real (tiny) run directory: files written, bad input exits 2."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedge.cli.main import app

runner = CliRunner()


def _run(tmp_path: Path, *sets: str) -> Path:
    out = tmp_path / "run"
    defaults = {
        "rounds": "1",
        "dataset.name": "digits",
        "model.name": "lenet-dlg",
        "clients.num": "2",
        "clients.per_round": "2",
    }
    given = {s.partition("=")[0] for s in sets[1::2]}  # a key given twice is refused: ours yield
    args = ["run", "quickstart", "--out", str(out)]
    for key, value in defaults.items():
        if key not in given:
            args += ["--set", f"{key}={value}"]
    args += list(sets)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_dlg_writes_json_and_image_grid(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedsgd", "--set", "method.batch_size=1")
    result = runner.invoke(
        app, ["attack", str(run), "--attack", "dlg", "--iterations", "60", "--samples", "2"]
    )
    ig = runner.invoke(
        app, ["attack", str(run), "--attack", "ig", "--iterations", "30", "--samples", "1"]
    )
    assert ig.exit_code == 0, ig.output
    assert json.loads((run / "attacks" / "ig.json").read_text())["attacks"]["ig"]["median_mse"] >= 0
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "dlg.json").read_text())
    assert data["clients_attacked"] == 2 and data["method"] == "fedsgd"
    assert data["attacks"]["dlg"]["median_mse"] < data["baseline_mean_image_mse"]
    assert (run / data["images"]["dlg"]).stat().st_size > 0


def test_dlg_shows_its_progress_in_plain_lines_when_piped(tmp_path: Path, monkeypatch) -> None:
    """stdout not a terminal: the replay, every iteration block (here: a line each, the
    interval set to 0) and each upload's end, as they happen, before the results."""
    import fedge.cli.attack as attack_cli

    monkeypatch.setattr(attack_cli, "LINE_EVERY_S", 0.0)
    run = _run(tmp_path, "--set", "method.name=fedsgd", "--set", "method.batch_size=1")
    result = runner.invoke(
        app, ["attack", str(run), "--attack", "dlg", "--iterations", "40", "--samples", "2"]
    )
    assert result.exit_code == 0, result.output
    clock = r", \d+:\d\d:\d\d"
    expected = [r"dlg: replaying round 1 of the run to observe its uploads" + clock]
    for u in (1, 2):
        expected += [rf"dlg: upload {u}/2, dlg iteration {d}/40" + clock for d in (20, 40)]
        expected.append(rf"dlg: upload {u}/2 done" + clock)
    lines = result.stdout.splitlines()
    assert len(lines) > len(expected), lines
    for pattern, line in zip(expected, lines, strict=False):
        assert re.fullmatch(pattern, line), (pattern, line)
    assert lines[len(expected)].startswith("baselines: "), lines


def test_mia_on_the_final_model(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedavg")
    result = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--samples", "50"])
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "mia.json").read_text())
    assert data["members"] == 50 and data["non_members"] == 50 and 0 <= data["auc"] <= 1


def test_mia_reads_the_trained_clients_from_the_run_and_replays_only_an_older_run(
    tmp_path: Path, monkeypatch
) -> None:
    """Prepare: 4 clients, 1 a round, 2 rounds (oracle: the engine's sampler). Assert: the
    summary records each sampled client's first round; the attack uses that record (no
    re-run); a summary without it (an older run) is re-run and gives the same members."""
    import fedge.attacks.membership_run as membership_run
    from fedge.runtime.engine import sample_clients

    run = _run(
        tmp_path,
        "--set",
        "method.name=fedavg",
        "--set",
        "rounds=2",
        "--set",
        "clients.num=4",
        "--set",
        "clients.per_round=1",
    )
    summary = json.loads((run / "summary.json").read_text())
    picked = {r: sample_clients(0, r, 4, 1)[0] for r in (1, 2)}
    assert summary["first_aggregated"] == {
        str(c): min(r for r in picked if picked[r] == c) for c in set(picked.values())
    }
    real_replay = membership_run.replay

    def no_replay(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("re-ran the run although its summary records the clients")

    monkeypatch.setattr(membership_run, "replay", no_replay)
    first = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--samples", "4"])
    assert first.exit_code == 0, first.output
    recorded = json.loads((run / "attacks" / "mia.json").read_text())
    del summary["first_aggregated"]
    (run / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(membership_run, "replay", real_replay)
    again = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--samples", "4"])
    assert again.exit_code == 0, again.output
    assert json.loads((run / "attacks" / "mia.json").read_text())["auc"] == recorded["auc"]


def test_attacks_that_rerun_a_run_with_os_random_noise_warn(tmp_path: Path) -> None:
    """A run whose DP noise came from the OS CSPRNG cannot be re-run exactly: dlg (which
    re-runs round 1) says its figures describe a re-run; a seeded run gets no such warning."""
    dp = (
        "--set",
        "method.name=fedsgd",
        "--set",
        "method.batch_size=1",
        "--set",
        "privacy.mechanism=gaussian",
        "--set",
        "privacy.noise_multiplier=1.0",
    )
    secure = _run(tmp_path / "a", *dp, "--set", "privacy.secure_noise=true")
    seeded = _run(tmp_path / "b", *dp)
    warned = runner.invoke(
        app, ["attack", str(secure), "--attack", "dlg", "--iterations", "5", "--samples", "1"]
    )
    assert warned.exit_code == 0, warned.output
    assert "OS CSPRNG (privacy.secure_noise: true)" in warned.output
    quiet = runner.invoke(
        app, ["attack", str(seeded), "--attack", "dlg", "--iterations", "5", "--samples", "1"]
    )
    assert quiet.exit_code == 0 and "OS CSPRNG" not in quiet.output


def test_an_attacks_warnings_are_one_line(tmp_path: Path) -> None:
    """DLG on FedAvg deltas of several momentum steps warns that it attacks an approximation:
    one ``warning:`` line, as every command's warnings (not the source file and code line)."""
    run = _run(tmp_path, "--set", "method.name=fedavg")
    res = runner.invoke(
        app, ["attack", str(run), "--attack", "dlg", "--iterations", "1", "--samples", "1"]
    )
    assert res.exit_code == 0, res.output
    warned = [line for line in res.stderr.splitlines() if "deltas of" in line]
    assert len(warned) == 1 and warned[0].startswith(
        "warning: UserWarning: the attacked fedavg uploads are deltas of"
    )
    assert "attack.py" not in res.stderr and "reconstruction_attack(" not in res.stderr


def test_bad_attack_name_and_missing_run_exit_2(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["attack", str(tmp_path), "--attack", "zzz"])
    assert bad.exit_code == 2 and "zzz" in bad.output
    missing = runner.invoke(app, ["attack", str(tmp_path / "nope"), "--attack", "dlg"])
    assert (
        missing.exit_code == 2
        and "nope' does not exist; give the directory of a fedge run" in missing.output
    )


def test_mia_shadow_writes_loss_shadow_and_lira(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedavg", "--set", "dataset.limit_train=60")
    result = runner.invoke(
        app, ["attack", str(run), "--attack", "mia-shadow", "--samples", "30", "--shadows", "2"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "mia-shadow.json").read_text())
    assert data["shadows"] == 2 and data["shadow_train_size"] == 60
    for key in ("loss", "shadow", "lira"):
        assert data[key]["members"] == 30 and 0 <= data[key]["precision"] <= 1
    assert "lira: membership AUC" in result.output


def test_pia_cuts_local_sets_to_the_batch_and_scores_every_upload(tmp_path: Path) -> None:
    # torch draws: the partition whose batches hold class 3 in some uploads, not all
    run = _run(
        tmp_path,
        "--set",
        "method.name=fedsgd",
        "--set",
        "method.batch_size=8",
        "--set",
        "draws=torch",
    )
    result = runner.invoke(
        app, ["attack", str(run), "--attack", "pia", "--samples", "6", "--property-class", "3"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "pia.json").read_text())
    assert data["uploads"] == 6 and data["rounds_observed"] == 3 and data["property_class"] == 3
    assert (
        data["classifiers"] == 3 and not data["masked"]
    )  # one per round: each broadcasts another model


def test_pia_without_negatives_says_how_to_get_them(tmp_path: Path) -> None:
    run = _run(
        tmp_path, "--set", "method.name=fedsgd", "--set", "method.batch_size=64"
    )  # 64 digits: every class
    result = runner.invoke(app, ["attack", str(run), "--attack", "pia", "--samples", "2"])
    assert result.exit_code == 2 and "method.batch_size" in result.output
    assert not (run / "attacks" / "pia.json").exists()


def test_mia_rounds_last_round_is_the_saved_final_model(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        "--set",
        "method.name=fedavg",
        "--set",
        "rounds=3",
        "--set",
        "dataset.limit_train=60",
    )
    final = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--samples", "40"])
    assert final.exit_code == 0, final.output
    per = runner.invoke(
        app, ["attack", str(run), "--attack", "mia", "--samples", "40", "--rounds", "1,3"]
    )
    assert per.exit_code == 0, per.output
    saved = json.loads((run / "attacks" / "mia.json").read_text())
    data = json.loads((run / "attacks" / "mia-rounds.json").read_text())
    assert sorted(data["rounds"]) == ["1", "3"] and "round 1 (test accuracy" in per.output
    # the re-run's round-3 model is the run's saved final model: the same attack gives the same numbers
    assert data["rounds"]["3"]["loss"]["auc"] == saved["auc"]
    assert data["rounds"]["3"]["loss"]["precision"] == saved["precision"]
    assert (
        data["rounds"]["1"]["loss"]["auc"] != saved["auc"]
    )  # an earlier model, not the final one again
    every = runner.invoke(
        app, ["attack", str(run), "--attack", "mia", "--samples", "40", "--all-rounds"]
    )
    assert every.exit_code == 0, every.output
    assert sorted(json.loads((run / "attacks" / "mia-rounds.json").read_text())["rounds"]) == [
        "1",
        "2",
        "3",
    ]


def test_mia_rounds_outside_the_run_exit_2(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedavg")
    bad = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--rounds", "0,4"])
    assert bad.exit_code == 2 and "[0, 4]" in bad.output and "1..1" in bad.output
    junk = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--rounds", "a,b"])
    assert junk.exit_code == 2 and "'a,b'" in junk.output
    wrong = runner.invoke(app, ["attack", str(run), "--attack", "dlg", "--rounds", "1"])
    assert wrong.exit_code == 2 and "--rounds" in wrong.output
    assert not (run / "attacks" / "mia-rounds.json").exists()
    # the example is made of the run's own rounds, never the rejected input
    same = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--rounds", "1,5,10"])
    assert same.exit_code == 2 and same.stderr.endswith(
        "expected round numbers in 1..1, e.g. --rounds 1\n"
    )
    assert "1,5,10" not in same.stderr.split("expected")[1]
    assert junk.stderr.endswith("expected rounds of the run (1..1), e.g. --rounds 1\n"), junk.stderr


def test_dlg_on_an_eppfl_run_inverts_the_activations_at_the_edge_server(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        "--set",
        "method.name=eppfl",
        "--set",
        "method.batch_size=1",
        "--set",
        "method.local_epochs=1",
        "--set",
        "model.name=lenet",
        "--set",
        "dataset.limit_train=2",
    )
    result = runner.invoke(
        app, ["attack", str(run), "--attack", "dlg", "--iterations", "300", "--samples", "2"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "dlg.json").read_text())
    assert data["method"] == "eppfl" and data["epsilon"] is None and data["clients_attacked"] == 2
    assert data["attacks"]["eppfl-inversion"]["median_mse"] < data["baseline_mean_image_mse"] / 100
    assert (run / data["images"]["eppfl-inversion"]).stat().st_size > 0
    assert "eppfl-inversion: median MSE" in result.output


def test_pia_on_an_eppfl_run_attacks_the_released_activations_at_the_edge_server(
    tmp_path: Path,
) -> None:
    run = _run(
        tmp_path,
        "--set",
        "method.name=eppfl",
        "--set",
        "method.batch_size=2",
        "--set",
        "method.local_epochs=1",
        "--set",
        "model.name=lenet",
        "--set",
        "clients.num=8",
        "--set",
        "clients.per_round=2",
    )
    result = runner.invoke(
        app, ["attack", str(run), "--attack", "pia", "--samples", "6", "--property-class", "3"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "pia.json").read_text())
    assert (
        data["method"] == "eppfl" and data["uploads"] == 6 and data["rounds_observed"] == 1
    )  # 6 devices, round 1
    assert (
        0 < data["with_property"] < 6
        and 0.0 <= data["auc"] <= 1.0
        and "edge server" in data["note"]
    )
    assert "property inference AUC" in result.output


def test_mia_on_a_ppfl_run_that_kept_its_classifier_attacks_the_attackers_completion(
    tmp_path: Path,
) -> None:
    """The REE holds the conv layers only (PPFL's keep_last_in_tee, the default): the attack
    completes them with a classifier trained on the attacker's own data, the same figures as
    completing and attacking by hand; shadow attacks on it are refused by name."""
    import torch
    import yaml

    from fedge.attacks.completion import complete_classifier
    from fedge.attacks.membership import loss_threshold_attack
    from fedge.attacks.membership_run import _mia_split
    from fedge.core.config import load_config
    from fedge.core.rng import generator
    from fedge.experiment.build import build_run
    from fedge.experiment.export import load_trained_model
    from tests.conftest import tiny_config

    cfg = tiny_config(
        **{
            "rounds": 3,
            "clients.num": 2,
            "clients.per_round": 2,
            "dataset.limit_train": 64,
            "dataset.limit_test": 80,
            "dataset.shape": [1, 16, 16],
            "model": {"name": "lenet-ppfl"},
            "method": {"name": "ppfl", "rounds_per_stage": 1, "batch_size": 8, "lr": 0.05},
        }
    )
    (tmp_path / "ppfl.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    assert (
        runner.invoke(app, ["run", str(tmp_path / "ppfl.yaml"), "--out", str(run), "-q"]).exit_code
        == 0
    )
    result = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--samples", "20"])
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "mia.json").read_text())
    assert "completed with a classifier the attacker trains" in data["attack"]
    assert (
        "kept its last layer in the enclaves: attacking the released layers completed"
        in result.output
    )
    assert data["completed"]["withheld"] and all(
        k.startswith("classifier.") for k in data["completed"]["withheld"]
    )
    built = build_run(load_config(cfg))
    members, non, rest, _ = _mia_split(built, 20, 0)
    ds = built.dataset
    done = complete_classifier(
        load_trained_model(run, withheld_ok=True).model,
        (ds.x_test[rest], ds.y_test[rest]),
        generator=generator(0, "attack", "head"),
    )
    by_hand = loss_threshold_attack(done, members, non)
    assert data["auc"] == by_hand.auc and data["completed"]["aux_samples"] == len(rest) == 60
    with torch.no_grad():
        assert data["completed"]["accuracy"]["members"] == float(
            (done(members[0]).argmax(-1) == members[1]).double().mean()
        )
    shadow = runner.invoke(
        app, ["attack", str(run), "--attack", "mia-shadow", "--shadows", "1", "--samples", "20"]
    )
    assert shadow.exit_code == 2 and "kept its last layer in the enclaves" in shadow.output


def test_a_read_only_run_is_one_line_before_the_attack_works(tmp_path: Path, monkeypatch) -> None:
    import fedge.cli.attack as attack_mod
    import fedge.experiment.storage as storage_mod

    run = _run(tmp_path, "--set", "method.name=fedavg")

    def read_only(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    def never(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("attacked a run whose results cannot be written")

    monkeypatch.setattr(storage_mod, "write_file", read_only)
    monkeypatch.setattr(attack_mod, "_mia", never)
    res = runner.invoke(app, ["attack", str(run), "--attack", "mia"])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [
        f"error: cannot write into '{run / 'attacks'}' (errno 30: Read-only file system); results "
        "go to RUN_DIR/attacks/: make the run directory writable (and free space), or copy the run "
        "to a writable place and attack the copy"
    ]
    assert not (run / "attacks" / "mia.json").exists()


@pytest.mark.parametrize("attack", ["mia", "dlg"])
def test_ctrl_c_during_an_attack_is_one_line_and_exit_130(
    tmp_path: Path, monkeypatch, attack
) -> None:
    import fedge.cli.attack as attack_mod

    run = _run(tmp_path, "--set", "method.name=fedavg")

    def interrupted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(attack_mod, "_mia", interrupted)
    monkeypatch.setattr(attack_mod, "_dlg", interrupted)
    res = runner.invoke(app, ["attack", str(run), "--attack", attack])
    assert res.exit_code == 130, res.output
    assert res.stderr == (
        "interrupted; the attack wrote no result (it writes them when it ends): run the command again\n"
    )
    assert not (run / "attacks" / f"{attack}.json").exists()
