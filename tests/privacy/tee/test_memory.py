import pytest
import torch

from fedge.privacy.tee import EnclaveMemory, EnclaveMemoryError, MiB, tensor_bytes


def test_budget_enforced_and_peak_tracked():
    m = EnclaveMemory(MiB)
    m.alloc_tensors("layer", [torch.zeros(1000)])  # 4000 bytes
    assert m.used == 4000 == tensor_bytes([torch.zeros(1000)])
    m.alloc("acts", MiB - 4000)
    assert m.peak == MiB
    m.free("acts")
    m.alloc("acts", 10)  # replaced, not added
    assert m.used == 4010 and m.peak == MiB
    with pytest.raises(EnclaveMemoryError, match="over the enclave's budget of 1.00 MiB"):
        m.alloc("grads", MiB)
    assert "grads" not in m.held
