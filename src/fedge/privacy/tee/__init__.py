"""A simulated trusted execution environment (PPFL, seed 001): the enclave's memory budget,
attestation and the sealed channel; real cryptography, isolation by convention. Design notes: docs/decisions.md#trusted-execution-environment.
"""

from fedge.privacy.tee.attest import (
    AttestationError,
    Report,
    hardware_key,
    measure,
    platform_id,
    platform_path,
    sign_report,
    verify_report,
)
from fedge.privacy.tee.channel import (
    DOWN,
    UP,
    KeyPair,
    SealedChannel,
    SealError,
    open_blob,
    seal_blob,
    session_key,
)
from fedge.privacy.tee.memory import EnclaveMemory, EnclaveMemoryError, MiB, tensor_bytes

__all__ = [
    "AttestationError",
    "DOWN",
    "EnclaveMemory",
    "EnclaveMemoryError",
    "KeyPair",
    "MiB",
    "Report",
    "SealError",
    "SealedChannel",
    "UP",
    "hardware_key",
    "measure",
    "open_blob",
    "platform_id",
    "platform_path",
    "seal_blob",
    "session_key",
    "sign_report",
    "tensor_bytes",
    "verify_report",
]
