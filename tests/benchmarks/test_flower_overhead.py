"""benchmarks/flower_overhead.py at a tiny size (2 clients, 1 timed round): each of its two
sections is kept as a record with --docs and rendered from it alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedge.bench.engine import _SeedBroadcast, _Trivial
from fedge.core.context import ClientData
from fedge.runtime.engine import EngineConfig, Simulation
from fedge.runtime.flower import FlowerExecutor, flower_simulation
from tests_helpers import benchmark_script, check_measured_script, check_measured_script_errors

bench = benchmark_script("flower_overhead")


@pytest.mark.parametrize(
    ("section", "runtimes"), [("flower", "engine,flower-sim"), ("flower-ray", "engine")]
)
def test_docs_keeps_the_record_the_section_is_rendered_from(
    tmp_path: Path, section: str, runtimes: str
) -> None:
    argv = ["--clients", "2", "--rounds", "1", "--runtimes", runtimes, "--section", section]
    record = check_measured_script(
        bench, argv, section=bench.SECTIONS[section], tmp_path=tmp_path, measuring="_measure"
    )
    results = record["report"]
    assert [r["runtime"] for r in results] == runtimes.split(",")
    assert all(r["clients_per_round"] == 2 and r["rounds_timed"] == 1 for r in results)
    assert ("--section flower-ray" in record["command"]) == (section == "flower-ray")


@pytest.mark.parametrize("section", ["flower", "flower-ray"])
def test_table_only_without_a_record_is_one_line_with_the_fix(
    tmp_path: Path, capsys, section: str
) -> None:
    check_measured_script_errors(bench, ["--section", section], tmp_path=tmp_path, capsys=capsys)


def test_flower_executor_of_an_engine_simulation_names_the_fix() -> None:
    """The script connects its own grid through the simulation's FlowerExecutor; a simulation
    the engine runs has none, and the error says to build it with flower_simulation."""
    x, y = torch.zeros(64, 1, 8, 8), torch.zeros(64, dtype=torch.int64)
    kw = dict(
        strategy=_SeedBroadcast(),
        program=_Trivial(),
        clients=[ClientData(x, y, torch.arange(i * 32, (i + 1) * 32)) for i in range(2)],
        test=(torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=1, per_round=2, eval_every=10**9),
    )
    assert isinstance(bench._flower_executor(flower_simulation(**kw)), FlowerExecutor)
    with pytest.raises(TypeError, match=r"got InProcessExecutor; build it with flower_simulation"):
        bench._flower_executor(Simulation(**kw))
