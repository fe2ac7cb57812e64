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
