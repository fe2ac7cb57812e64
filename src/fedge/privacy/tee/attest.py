"""Simulated remote attestation (PPFL, seed 001, Sec. 4.1 and Algorithm 1's "attest"), with the
platform's simulated fuses (a file of OS randomness). Design notes: docs/decisions.md#trusted-execution-environment.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedge.core.errors import FedgeError

__all__ = [
    "AttestationError",
    "Report",
    "hardware_key",
    "measure",
    "platform_id",
    "platform_path",
    "sign_report",
    "verify_report",
    "vendor_public_key",
]

_MAGIC = b"fedge-tee-platform-v1\n"
_SIZE = len(_MAGIC) + 64


@dataclass(frozen=True)
class _Platform:
    root: bytes  # the fused root secret: sealing keys derive from it
    vendor: Ed25519PrivateKey  # the provisioned attestation key


_PLATFORMS: dict[str, _Platform] = {}  # by file path ("" for a process-only platform)


class AttestationError(FedgeError, PermissionError):
    """An attestation report was refused (bad signature or unexpected measurement)."""


def platform_path() -> Path:
    """Where this machine's simulated fuses live (see the module docstring)."""
    env = os.environ.get("FEDGE_TEE_PLATFORM")
    if env:
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "fedge" / "tee-platform"


def _read_platform(path: Path) -> _Platform:
    data = path.read_bytes()
    if len(data) != _SIZE or not data.startswith(_MAGIC):
        raise AttestationError(
            f"{str(path)!r} is not a fedge TEE platform file ({len(data)} bytes; expected {_SIZE} starting "
            f"{_MAGIC[:-1].decode()!r}); point $FEDGE_TEE_PLATFORM elsewhere, or delete it (runs sealed under it "
            "can then no longer be resumed)"
        )
    body = data[len(_MAGIC) :]
    return _Platform(body[:32], Ed25519PrivateKey.from_private_bytes(body[32:]))


def _create_platform(path: Path) -> _Platform:
    """Write fresh fuses to ``path`` (0600, atomically: a concurrent creator's file wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + os.urandom(32) + os.urandom(32))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another process created it first
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    return _read_platform(path)


def _platform() -> _Platform:
    path = platform_path()
    key = str(path)
    if key in _PLATFORMS:
        return _PLATFORMS[key]
    try:
        plat = _read_platform(path) if path.exists() else _create_platform(path)
    except AttestationError:  # a file that is not a platform: never replaced silently
        raise
    except OSError as e:
        warnings.warn(
            f"cannot keep the simulated TEE platform at {key!r} ({e.strerror or e}); using one that lives in "
            "this process only, so PPFL runs started now cannot be resumed by another process. Set "
            "$FEDGE_TEE_PLATFORM to a writable file to keep it",
            RuntimeWarning,
            stacklevel=3,
        )
        plat = _PLATFORMS.setdefault("", _Platform(os.urandom(32), Ed25519PrivateKey.generate()))
    _PLATFORMS[key] = plat
    return plat


def _vendor_key() -> Ed25519PrivateKey:
    return _platform().vendor


def vendor_public_key() -> bytes:
    return (
        _vendor_key()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def platform_id() -> str:
    """A public name of this platform: the first 16 hex digits of SHA-256 of its attestation key."""
    return hashlib.sha256(b"fedge/tee/platform" + vendor_public_key()).hexdigest()[:16]


def hardware_key(label: str) -> bytes:
    """A 32-byte sealing key unique to this platform and ``label`` (HKDF-SHA256 of the fused
    root secret; the same in every process on this platform)."""
    info = b"fedge/tee/v1/huk/" + label.encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(_platform().root)


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


def verify_report(
    report: Report, *, expected: bytes, nonce: bytes, vendor: bytes | None = None
) -> None:
    """Raise :class:`AttestationError` unless ``report`` is signed by the vendor key, answers
    ``nonce`` and carries the ``expected`` measurement."""
    key = Ed25519PublicKey.from_public_bytes(vendor or vendor_public_key())
    try:
        key.verify(report.signature, report.body())
    except InvalidSignature as e:
        raise AttestationError(
            "attestation report signature is invalid: not signed by the vendor key"
        ) from e
    if report.nonce != nonce:
        raise AttestationError(
            "attestation report answers another challenge (stale or replayed report)"
        )
    if report.measurement != expected:
        raise AttestationError(
            f"enclave measurement {report.measurement.hex()[:16]}… differs from the expected "
            f"{expected.hex()[:16]}…: it runs other code or another configuration; refused"
        )
