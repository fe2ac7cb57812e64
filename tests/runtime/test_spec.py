"""The runtime as one checked value: names, backends, a Grid, and the errors' two spellings."""

import pytest

from fedge.core.errors import ConfigError
from fedge.runtime.spec import BACKENDS, RUNTIMES, Runtime


def test_names_and_backends_are_the_literals():
    assert RUNTIMES == ("engine", "flower-sim", "flower") and BACKENDS == ("local", "ray")


def test_of_reads_a_name_a_backend_a_runtime_or_a_grid():
    assert Runtime.of() == Runtime("engine", "local")
    assert Runtime.of("flower-sim", "ray") == Runtime("flower-sim", "ray")
    assert Runtime.of("flower-sim") == Runtime("flower-sim", "local")
    chosen = Runtime.of("flower-sim", "ray")
    assert Runtime.of(chosen) == chosen and Runtime.of(chosen, "local").backend == "local"
    grid = object()
    on_grid = Runtime.of(grid)
    assert on_grid.name == "flower" and on_grid.grid is grid and on_grid.backend == "local"


@pytest.mark.parametrize(
    ("runtime", "backend", "plain", "flags"),
    [
        (
            "flowr",
            None,
            "runtime 'flowr' is not known; expected engine, flower-sim or flower",
            "--runtime 'flowr' is not known; expected engine, flower-sim or flower",
        ),
        (
            "engine",
            "ray",
            "backend 'ray' goes with runtime 'flower-sim' (got runtime 'engine')",
            "--backend ray goes with --runtime flower-sim (got --runtime engine)",
        ),
        (
            "flower-sim",
            "dask",
            "Flower simulation backend 'dask' is not known; expected one of ['local', 'ray']",
            "Flower simulation backend 'dask' is not known; expected one of ['local', 'ray']",
        ),
    ],
)
def test_a_bad_runtime_or_backend_is_named_as_the_caller_spells_it(runtime, backend, plain, flags):
    with pytest.raises(ConfigError) as info:
        Runtime.of(runtime, backend)
    assert str(info.value) == plain
    with pytest.raises(ConfigError) as info:
        Runtime.of(runtime, backend, flags=True)
    assert str(info.value) == flags


def test_flower_without_its_grid_is_not_ready():
    assert Runtime.of("engine").ready() == Runtime()
    with pytest.raises(
        ConfigError, match=r"runtime 'flower' runs the rounds on a Flower deployment"
    ):
        Runtime.of("flower").ready()
