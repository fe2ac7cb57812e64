"""fedge.core.threads: the block runs under the asked thread count, the caller's comes back
after it, also when the block raises; None leaves the caller's count."""

import pytest
import torch

from fedge.core.threads import torch_threads


@pytest.mark.parametrize("caller, asked", [(1, 2), (2, 1), (2, 2), (2, None)])
def test_torch_threads_sets_and_restores(caller, asked):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(caller)
        with torch_threads(asked):
            assert torch.get_num_threads() == (caller if asked is None else asked)
        assert torch.get_num_threads() == caller
        with pytest.raises(RuntimeError, match="inside"), torch_threads(asked):
            raise RuntimeError("inside")
        assert torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(before)
