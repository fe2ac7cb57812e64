"""Simulated remote attestation (PPFL, seed 001, Sec. 4.1 and Algorithm 1's "attest").

An enclave's *measurement* is the SHA-256 of its code (the source of the modules it runs)
and its configuration. The enclave signs ``measurement ‖ its X25519 public key ‖ a nonce``
with an Ed25519 attestation key, as a vendor-provisioned device key would; the verifier
checks the signature against the vendor's public key and compares the measurement with the
one it expects, refusing anything else (:class:`AttestationError`).

Simulation: the attestation key stands for a key burned into the device by its vendor. It
lives in this module's :data:`_FUSES` (one per process), never in an object the REE
holds, and is created from OS randomness, so no one who knows the run seed can forge a
report. A consequence: a run's enclaves cannot be re-attested in another process (no resume
across processes mid-run).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedge.core.errors import FedgeError

__all__ = ["AttestationError", "Report", "hardware_key", "measure", "sign_report", "verify_report", "vendor_public_key"]

_FUSES: dict[str, Any] = {}


class AttestationError(FedgeError, PermissionError):
    """An attestation report was refused (bad signature or unexpected measurement)."""


def _vendor_key() -> Ed25519PrivateKey:
    if "vendor" not in _FUSES:
        _FUSES["vendor"] = Ed25519PrivateKey.generate()
    return _FUSES["vendor"]


def vendor_public_key() -> bytes:
    return _vendor_key().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def hardware_key(label: str) -> bytes:
    """A 32-byte device-unique sealing key (simulated fuses; OS randomness, once per process)."""
    k = "huk/" + label
    if k not in _FUSES:
        _FUSES[k] = os.urandom(32)
    return _FUSES[k]


def measure(modules: list[ModuleType], config: dict[str, Any]) -> bytes:
    """SHA-256 over the source of ``modules`` and the canonical JSON of ``config``."""
    h = hashlib.sha256()
    for m in modules:
        h.update(inspect.getsource(m).encode())
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    return h.digest()


@dataclass(frozen=True)
class Report:
    measurement: bytes
    public_key: bytes  # the enclave's X25519 key for the sealed channel
    nonce: bytes  # the verifier's challenge (freshness)
    signature: bytes

    def body(self) -> bytes:
        return b"fedge/tee/report/v1" + self.measurement + self.public_key + self.nonce


def sign_report(measurement: bytes, public_key: bytes, nonce: bytes) -> Report:
    unsigned = Report(measurement, public_key, nonce, b"")
    return Report(measurement, public_key, nonce, _vendor_key().sign(unsigned.body()))


def verify_report(report: Report, *, expected: bytes, nonce: bytes, vendor: bytes | None = None) -> None:
    """Raise :class:`AttestationError` unless ``report`` is signed by the vendor key, answers
    ``nonce`` and carries the ``expected`` measurement."""
    key = Ed25519PublicKey.from_public_bytes(vendor or vendor_public_key())
    try:
        key.verify(report.signature, report.body())
    except InvalidSignature as e:
        raise AttestationError("attestation report signature is invalid: not signed by the vendor key") from e
    if report.nonce != nonce:
        raise AttestationError("attestation report answers another challenge (stale or replayed report)")
    if report.measurement != expected:
        raise AttestationError(
            f"enclave measurement {report.measurement.hex()[:16]}… differs from the expected "
            f"{expected.hex()[:16]}…: it runs other code or another configuration; refused"
        )
