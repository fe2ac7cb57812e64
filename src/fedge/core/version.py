"""fedge's version, in one place below every layer (the CLI, the Flower handshake and the public
API read it); ``version`` in pyproject.toml must say the same (a test checks)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
