"""The run-directory schema: a run written by the engine holds the files and keys the schema
names, every reader reads it back through those names, and no module spells a file name of its
own."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

from fedge.bench.figures import read_run_logs
from fedge.core import rundir_schema as schema
from fedge.experiment.rundir import RunDir
from fedge.report.runlog import load_run

SRC = Path(__file__).resolve().parents[2] / "src" / "fedge"

FILES = {
    schema.CLAIM,
    schema.APPLIED_CONFIG,
    schema.CONFIG,
    schema.CONFIG_CHANGES,
    schema.PARTITION,
    schema.METRICS,
    schema.SESSIONS,
    schema.CHECKPOINT,
    schema.MODEL,
    schema.SUMMARY,
    schema.PLOTS,
    schema.REPORT_MD,
    schema.REPORT_HTML,
}

# Path joins with a literal file name still allowed (module, name): none now, every module joins
# the schema's names; an entry here must be a known, temporary exception.
NOT_YET_THROUGH_THE_SCHEMA: set[tuple[str, str]] = set()


def test_a_run_written_by_the_engine_is_read_back_through_the_schemas_names(tmp_path):
    import fedge

    out = tmp_path / "run"
    fedge.run(
        "quickstart",
        overrides={"rounds": 3, "eval_every": 2, "clients.num": 4, "clients.per_round": 2},
        out=out,
    )
    written = {p.name for p in out.iterdir()}
    # every file of a complete run (no --resume edits, no report rendered yet) and nothing else
    assert written == FILES - {
        schema.CONFIG_CHANGES,
        schema.PLOTS,
        schema.REPORT_MD,
        schema.REPORT_HTML,
    }

    summary = json.loads((out / schema.SUMMARY).read_text())
    lines = [json.loads(x) for x in (out / schema.METRICS).read_text().splitlines()]
    assert summary.keys() >= schema.SUMMARY_KEYS and summary[schema.STATUS] == schema.COMPLETE
    assert [x[schema.ROUND] for x in lines] == [1, 2, 3]
    for line in lines:
        assert line.keys() >= schema.ROUND_KEYS, schema.ROUND_KEYS - line.keys()
    assert lines[0][schema.TEST_ACCURACY] is None  # not evaluated: the key is there, null
    assert (
        summary[schema.TOTAL_BYTES_UP]
        == lines[-1][schema.CUM_BYTES_UP]
        == sum(x[schema.BYTES_UP] for x in lines)
    )

    # the readers: the writer's own, the report's, the benchmarks'
    assert RunDir(out).is_complete()
    run = load_run(out)
    assert run.complete and run.rounds_done == summary[schema.ROUNDS] == 3
    assert run.final_accuracy == summary[schema.FINAL_TEST_ACCURACY]
    assert run.total_bytes_down == summary[schema.TOTAL_BYTES_DOWN]
    assert run.total_client_flops == summary[schema.TOTAL_CLIENT_FLOPS]
    assert run.model_params == summary[schema.MODEL_PARAMS] > 0
    assert run.partition is not None and run.config["rounds"] == 3
    assert read_run_logs(out) == (summary, lines)


def _joined_file_names(tree: ast.AST) -> set[str]:
    """The literal strings naming a schema file that a module joins onto a path (``p / "x"``)."""
    return {
        node.right.value
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and isinstance(node.right, ast.Constant)
        and node.right.value in FILES
    }


def test_no_module_but_the_schema_spells_a_run_directory_file_name():
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "core/rundir_schema.py":
            continue
        for name in _joined_file_names(ast.parse(path.read_text(encoding="utf-8"))):
            found.add((rel, name))
    assert found - NOT_YET_THROUGH_THE_SCHEMA == set(), (
        "join the schema's names (fedge.core.rundir_schema), not literals"
    )


def test_the_file_names_are_distinct_and_plain():
    names = [v for k, v in vars(schema).items() if k.isupper() and isinstance(v, str)]
    files = [n for n in names if n in FILES]
    assert len(files) == len(set(files)) == len(FILES)
    assert all("/" not in n for n in files)


def _strict(text: str):
    """JSON as any strict parser reads it: the bare NaN/Infinity tokens are an error."""

    def refuse(token: str):
        raise ValueError(f"not strict JSON: bare {token}")

    return json.loads(text, parse_constant=refuse)


def test_an_infinite_epsilon_is_written_as_strict_json_and_read_back(tmp_path, tiny):
    import warnings

    import fedge

    out = tmp_path / "run"
    privacy = {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-privacy warning: tests/privacy/dp
        fedge.run(tiny(rounds=2, privacy=privacy), out=out)
    summary = _strict((out / schema.SUMMARY).read_text())
    lines = [_strict(x) for x in (out / schema.METRICS).read_text().splitlines()]
    assert summary["epsilon"] == lines[-1]["epsilon"] == "inf"
    for name in (schema.APPLIED_CONFIG, schema.PARTITION):
        _strict((out / name).read_text())

    run = load_run(out)  # every reader turns it back into the float
    assert run.summary is not None and run.summary["epsilon"] == math.inf
    assert run.metrics[-1]["epsilon"] == math.inf
    assert read_run_logs(out)[0]["epsilon"] == math.inf
    assert RunDir(out).is_complete()


def test_dumps_and_loads_round_trip_every_non_finite_float():
    obj = {"a": [math.inf, -math.inf, 1.5], "b": {"c": math.nan}, "d": "x", "e": None}
    text = schema.dumps(obj)
    assert _strict(text) == {"a": ["inf", "-inf", 1.5], "b": {"c": "nan"}, "d": "x", "e": None}
    back = schema.loads(text)
    assert back["a"] == [math.inf, -math.inf, 1.5] and math.isnan(back["b"]["c"])
    assert schema.loads('{"old": Infinity}') == {"old": math.inf}  # files written before
