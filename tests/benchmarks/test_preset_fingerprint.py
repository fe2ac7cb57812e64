"""benchmarks/preset_fingerprint.py: the comparison against hand-made fingerprints (exact, and
within a relative tolerance), the note when a file was written on another machine, and one
real case written and checked again."""

from __future__ import annotations

import json

import pytest

from tests_helpers import benchmark_script

fp = benchmark_script("preset_fingerprint")

BEFORE = {
    "a": [{"round": 1, "test_loss": 2.0, "test_accuracy": 0.152, "name": "x", "done": False}],
    "b": [{"round": 1, "test_loss": 1.0}, {"round": 2, "test_loss": 0.5}],
}


def _after(**changes: object) -> dict:
    after = json.loads(json.dumps(BEFORE))
    after["a"][0].update(changes)
    return after


def test_equal_fingerprints_have_no_differences() -> None:
    assert fp.compare(BEFORE, _after()) == ([], 0)


def test_a_last_bit_difference_fails_exactly_and_passes_within_its_tolerance() -> None:
    after = _after(test_loss=2.0 * (1 + 1e-7))
    diffs, close = fp.compare(BEFORE, after)
    assert close == 0 and diffs == [f"a round 1: test_loss 2.0 -> {2.0 * (1 + 1e-7)!r}"]
    assert fp.compare(BEFORE, after, rtol=1e-6) == ([], 1)
    assert fp.compare(BEFORE, after, rtol=1e-8)[0] == diffs


def test_one_image_of_500_is_beyond_a_roundoff_tolerance() -> None:
    diffs, close = fp.compare(BEFORE, _after(test_accuracy=0.15), rtol=1e-4)
    assert diffs == ["a round 1: test_accuracy 0.152 -> 0.15"] and close == 0


def test_non_numbers_and_missing_parts_are_never_within_a_tolerance() -> None:
    assert fp.compare(BEFORE, _after(name="y"), rtol=0.5)[0] == ["a round 1: name 'x' -> 'y'"]
    assert fp.compare(BEFORE, _after(done=True), rtol=0.5)[0] == ["a round 1: done False -> True"]
    assert fp.compare(BEFORE, _after(test_loss="2.0"), rtol=0.5)[0] == [
        "a round 1: test_loss 2.0 -> '2.0'"
    ]
    extra = _after(new_key=1.0)
    assert fp.compare(BEFORE, extra, rtol=0.5)[0] == ["a round 1: new_key '<absent>' -> 1.0"]
    shorter = {"a": BEFORE["a"], "b": BEFORE["b"][:1]}
    assert fp.compare(BEFORE, shorter)[0] == ["b: 2 rounds before, 1 after"]
    assert fp.compare(BEFORE, {"a": BEFORE["a"]})[0] == ["b: only before"]


def test_within_is_relative_to_the_larger_magnitude() -> None:
    assert fp.within(100.0, 101.0, 0.01) and not fp.within(100.0, 101.0, 0.009)
    assert fp.within(0.0, 0.0, 0.0) and not fp.within(0.0, 1e-30, 0.5)
    assert fp.within(3, 3.0, 0.0)  # an int and an equal float


def test_a_file_from_another_machine_is_named_in_a_note() -> None:
    here = fp.machine()
    assert fp.machine_note({k: here[k] for k in fp.ARITHMETIC}) is None
    other = {**{k: here[k] for k in fp.ARITHMETIC}, "cpu": "Some Other CPU"}
    note = fp.machine_note(other)
    assert note is not None
    assert "written on cpu Some Other CPU" in note and f"checked on cpu {here['cpu']}" in note
    assert "--write a baseline on this machine" in note
    assert "does not say which machine" in fp.machine_note(None)


def test_written_then_checked_on_this_machine_is_identical(tmp_path, capsys) -> None:
    path = tmp_path / "fp.json"
    assert fp.main(["--write", str(path), "--only", "quickstart"]) == 0
    written = json.loads(path.read_text())
    assert written["machine"] == {k: fp.machine()[k] for k in fp.ARITHMETIC}
    assert list(written["metrics"]) == ["quickstart"]
    capsys.readouterr()
    assert fp.main(["--check", str(path), "--only", "quickstart"]) == 0
    assert capsys.readouterr().out.strip() == "1 cases: identical"

    line = written["metrics"]["quickstart"][-1]
    line["test_loss"] *= 1 + 1e-9
    written["machine"]["cpu"] = "Some Other CPU"
    path.write_text(json.dumps(written))
    assert fp.main(["--check", str(path), "--only", "quickstart"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("written on cpu Some Other CPU") and "test_loss" in out
    assert fp.main(["--check", str(path), "--only", "quickstart", "--rtol", "1e-6"]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "1 cases: identical (1 more within --rtol 1e-06)"
    )


def test_write_with_only_replaces_those_cases_and_keeps_the_rest(tmp_path, capsys) -> None:
    path = tmp_path / "fp.json"
    here = {k: fp.machine()[k] for k in fp.ARITHMETIC}
    other = {"preset": "fedavg-fmnist-lenet", "overrides": {"rounds": 1}}
    old = {"draws": "portable", "machine": here, "cases": {"x": other}, "metrics": {"x": [{}]}}
    path.write_text(json.dumps(old))
    assert fp.main(["--write", str(path), "--only", "quickstart"]) == 0
    written = json.loads(path.read_text())
    assert sorted(written["metrics"]) == ["quickstart", "x"] and written["cases"]["x"] == other
    assert written["metrics"]["x"] == [{}] and written["metrics"]["quickstart"]
    assert "(2 in all)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"draws": "torch"}, "holds draws='torch' fingerprints"),
        ({"machine": {"cpu": "Some Other CPU"}}, "its other cases would keep that machine's"),
    ],
)
def test_write_with_only_refuses_a_file_it_would_mix(tmp_path, capsys, change, message) -> None:
    """Before running anything: the file's other cases come from other draws or another CPU."""
    path = tmp_path / "fp.json"
    here = {k: fp.machine()[k] for k in fp.ARITHMETIC}
    text = json.dumps({"draws": "portable", "machine": here, "cases": {}, "metrics": {}, **change})
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        fp.main(["--write", str(path), "--only", "quickstart"])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert path.read_text() == text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--check", "nowhere.json"], "cannot read a fingerprint file there"),
        (["--check", "x.json", "--rtol", "-1"], "--rtol -1.0: give a relative tolerance"),
        (["--write", "x.json", "--rtol", "1e-5"], "--rtol goes with --check"),
    ],
)
def test_bad_arguments_are_one_message_and_run_nothing(argv, message, tmp_path, capsys) -> None:
    argv = [str(tmp_path / a) if a.endswith(".json") else a for a in argv]
    if "--rtol" in argv and "--check" in argv:
        (tmp_path / "x.json").write_text('{"metrics": {}}')
    with pytest.raises(SystemExit) as exc:
        fp.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists() or "--check" in argv


def test_every_preset_has_a_shrunk_case() -> None:
    from fedge.core.presets import preset_names

    assert set(fp.SHRINK) == set(preset_names())
