"""The engine's thread default (1 intra-op thread, documented in core/config.py) applies
during a run and the caller's own torch setting comes back afterwards."""

import torch

from fedge.core.config import load_config
from fedge.experiment.run import run_experiment


def test_run_uses_one_thread_by_default_and_restores_the_callers(tiny, tmp_path):
    cfg = load_config(tiny(rounds=1))
    assert cfg.threads == 1
    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_experiment(
            cfg,
            out=tmp_path / "run",
            progress=lambda line, total: seen.append(torch.get_num_threads()),
            render=False,
        )
        assert seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_build_runs_under_the_configs_threads_whatever_the_caller_uses(tiny):
    """What the build computes (a pruning mask from float32 scores, a warm start) may change
    with the thread count; the build therefore runs under ``threads`` too. Oracle: the thread
    count a registered model's builder sees each time the build makes the model."""
    from torch import nn

    from fedge.experiment.build import build_run
    from fedge.models.registry import _REGISTRY, register_model

    seen: list[int] = []

    @register_model("test-threads", description="d", reference="r", flat_inputs=True)
    def _build(*, input_shape, num_classes, activation, norm):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return nn.Flatten(), nn.Linear(int(torch.Size(input_shape).numel()), num_classes)

    before = torch.get_num_threads()
    try:
        for caller in (1, 2):
            torch.set_num_threads(caller)
            seen.clear()
            build_run(load_config(tiny(**{"model.name": "test-threads", "threads": 1})))
            assert seen and set(seen) == {1}, f"caller at {caller} threads: builder saw {seen}"
            assert torch.get_num_threads() == caller
            seen.clear()
            build_run(load_config(tiny(**{"model.name": "test-threads", "threads": None})))
            assert seen and set(seen) == {caller}  # null: the caller's count, unchanged
    finally:
        torch.set_num_threads(before)
        _REGISTRY.unregister("test-threads")
