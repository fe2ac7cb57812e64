"""benchmarks/zo_forwards_to_accuracy.py: with --docs the tuned learning rates, the runs' curves
and the cosines are kept as the section's record, and the section (the target, forwards to it,
the verdicts) is rendered from it alone. The runs themselves (~25 CPU-minutes) are given here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_helpers import benchmark_script, check_measured_script, check_measured_script_errors

bench = benchmark_script("zo_forwards_to_accuracy")
# the round (1-based) at which each choice first reaches the target, per seed; None: never
REACHED = {
    "gaussian + adam (BAFFLE)": (5, 4, 6),
    "orthogonal + adam": (2, 1, 2),
    "block + adam": (5, None, 3),
    "gaussian + zo_adamm": (6, 6, 7),
}
TARGET = 0.5


def _curve(reached: int | None) -> list[dict]:
    return [
        {
            "round": r,
            "clients": bench.CLIENTS_PER_ROUND,
            "client_wall_s": 2.0,
            "test_accuracy": TARGET + 0.01 * (r - reached) if reached and r >= reached else 0.2,
        }
        for r in range(1, bench.ROUNDS + 1)
    ]


def _measure(out: Path) -> dict:
    return {
        "lrs": {"adam": 0.01, "zo_adamm": 0.003},
        "curves": {
            f"{label} seed {s}": _curve(r)
            for label, rounds in REACHED.items()
            for s, r in zip(bench.SEEDS, rounds, strict=True)
        },
        "cosines": {label: [0.06, 0.01] for label in bench.COSINE_KINDS},
    }


def test_docs_keeps_the_record_the_section_is_rendered_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "measure", _measure)
    argv = ["--out", str(tmp_path / "out")]
    record = check_measured_script(bench, argv, section=bench.SECTION, tmp_path=tmp_path)
    assert record["report"]["curves"] == _measure(tmp_path)["curves"]
    text = bench.markdown(record["report"], record["command"])
    per_round = bench.CLIENTS_PER_ROUND * bench.FORWARDS_PER_CLIENT_ROUND
    assert f"Target: test accuracy **{TARGET:.3f}**" in text
    # the oracle: forwards to the target = rounds to it x clients x (K + 1)
    assert f"| orthogonal + adam | {2 * per_round:,}, {per_round:,}, {2 * per_round:,} |" in text
    assert f"| block + adam | {5 * per_round:,}, —, {3 * per_round:,} |" in text
    assert (
        "- orthogonal + adam: fewer forwards than Gaussian on every seed; 3x target not met."
        in text
    )
    assert "Tuned server learning rates (validation split): adam 0.01, zo_adamm 0.003." in text
    assert (tmp_path / "out" / "table.md").read_text() == bench.table(record["report"]) + "\n"


def test_table_only_without_a_record_is_one_line_with_the_fix(tmp_path: Path, capsys) -> None:
    check_measured_script_errors(bench, [], tmp_path=tmp_path, capsys=capsys)
