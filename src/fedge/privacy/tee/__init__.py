"""A simulated trusted execution environment (PPFL, seed 001): the enclave's memory budget,
attestation, and the sealed channel. Pure pieces; the method (fedge.methods.ppfl) runs
enclaves as side parties.

What is simulated and what is real: the cryptography is real (Ed25519 signatures, X25519,
HKDF, AES-GCM from ``cryptography``); the isolation is by convention — an enclave runs in the
same process, keeps its plaintext only while it handles a call, and hands the engine only
sealed state, sealed under keys derived from the machine's simulated fuses (a file; see
:mod:`fedge.privacy.tee.attest`). The memory budget is enforced by accounting of every tensor it holds.
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
