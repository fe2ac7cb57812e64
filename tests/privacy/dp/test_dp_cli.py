"""``fedge privacy epsilon``: the Table 5 row by command; bad input exits 2 with the fix."""

import json

import pytest
from typer.testing import CliRunner

from fedge.cli.main import app

runner = CliRunner()

TABLE5 = [
    "privacy",
    "epsilon",
    "--mechanism",
    "tree",
    "--noise-multiplier",
    "1.13,2.33,4.03,6.21,8.83",
    "--rounds",
    "1600",
    "--clients-per-round",
    "100",
    "--population",
    "342477",
    "--delta",
    "1e-6",
]


def test_table5_row_by_command():
    res = runner.invoke(app, [*TABLE5, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert [round(r["epsilon"], 2) for r in report["rows"]] == [18.71, 7.83, 4.19, 2.60, 1.77]
    assert report["sampling"] == "shuffle"
    table = runner.invoke(app, TABLE5)
    assert table.exit_code == 0 and "18.71" in table.output and "1.77" in table.output


def test_gaussian_with_target():
    res = runner.invoke(
        app,
        [
            "privacy",
            "epsilon",
            "--mechanism",
            "gaussian",
            "--sampling",
            "poisson",
            "--noise-multiplier",
            "1.0",
            "--rounds",
            "100",
            "--clients-per-round",
            "10",
            "--population",
            "1000",
            "--target-epsilon",
            "2",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)["rows"][0]
    assert row["epsilon"] > 0 and row["max_rounds"] >= 1


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["--noise-multiplier", "-1"],
            "error: --noise-multiplier must be a finite number >= 0, got -1.0; e.g. --noise-multiplier 1.0",
        ),
        (["--noise-multiplier", "abc"], "expected numbers"),
        (
            ["--delta", "1"],
            "error: --delta must be in (0, 1), got 1.0",
        ),  # the command's flags, not config keys
        (["--mechanism", "tree", "--sampling", "fixed"], "set --sampling shuffle"),
        (["--mechanism", "none"], "--mechanism none has no ε"),
        (["--mechanism", "laplace"], "mechanism"),
        (["--clients-per-round", "20", "--population", "10"], "population=10"),
        (["--rounds", "-3"], "--rounds"),
    ],
)
def test_bad_input_exits_2(args, needle):
    res = runner.invoke(app, ["privacy", "epsilon", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output
