"""Which runtime runs a run's client steps (``engine``, ``flower-sim``, ``flower``), as one typed,
validated value, :class:`Runtime`; :meth:`Runtime.of` is the one place a runtime and a backend
given as text are checked.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from fedge.core.errors import ConfigError

__all__ = [
    "BACKENDS",
    "RUNTIMES",
    "Backend",
    "Runtime",
    "RuntimeName",
    "check_backend",
    "require_ray",
]

RuntimeName = Literal["engine", "flower-sim", "flower"]
#: what runs the simulated nodes of ``flower-sim``: fedge's LocalGrid, or Flower's Ray engine
Backend = Literal["local", "ray"]
RUNTIMES: tuple[str, ...] = get_args(RuntimeName)
BACKENDS: tuple[str, ...] = get_args(Backend)


def _named(key: str, value: str, flags: bool) -> str:
    return f"--{key} {value}" if flags else f"{key} {value!r}"


@dataclass(frozen=True)
class Runtime:
    """A run's runtime: ``name``, the ``backend`` of ``flower-sim``, and the ``grid`` of
    ``flower`` (a Flower ``Grid``, inside a deployed ServerApp)."""

    name: RuntimeName = "engine"
    backend: Backend = "local"
    grid: Any = None

    @classmethod
    def of(
        cls,
        runtime: Runtime | str | Any = "engine",
        backend: str | None = None,
        *,
        flags: bool = False,
    ) -> Runtime:
        """``runtime`` (a name, a :class:`Runtime`, or a Flower ``Grid``: ``flower`` on that
        grid) with ``backend`` (None: ``local``, or the given Runtime's), checked: an unknown
        name or backend, or a backend without ``flower-sim``, is a :class:`ConfigError`
        (``flags``: naming them as ``fedge run``'s options)."""
        grid = None
        name: str
        if isinstance(runtime, Runtime):
            name, grid = runtime.name, runtime.grid
            backend = runtime.backend if backend is None else backend
        elif isinstance(runtime, str):
            name = runtime
        else:  # a Flower Grid, inside a deployed ServerApp
            name, grid = "flower", runtime
        if name not in RUNTIMES:
            raise ConfigError(
                f"{'--' if flags else ''}runtime {name!r} is not known; "
                "expected engine, flower-sim or flower"
            )
        backend = "local" if backend is None else backend
        if backend != "local" and name != "flower-sim":
            raise ConfigError(
                f"{_named('backend', backend, flags)} goes with "
                f"{_named('runtime', 'flower-sim', flags)} (got {_named('runtime', name, flags)})"
            )
        return cls(cast(RuntimeName, name), check_backend(backend), grid)

    def ready(self) -> Runtime:
        """This runtime, once what it needs is here (flwr; Ray for ``ray``; the Grid for
        ``flower``): checked before a run writes anything."""
        if self.name == "engine":
            return self
        if self.name == "flower" and self.grid is None:
            raise ConfigError(
                "runtime 'flower' runs the rounds on a Flower deployment, inside its ServerApp: "
                "use fedge run --runtime flower --superlink HOST:PORT "
                "(fedge.experiment.flower.submit), or, inside a ServerApp, pass its Grid as the runtime"
            )
        import fedge.runtime.flower  # noqa: F401  (a missing flwr fails here)

        if self.backend == "ray":
            require_ray()
        return self


def check_backend(backend: str) -> Backend:
    """``backend`` if it is one of :data:`BACKENDS`, else a :class:`ConfigError`."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"Flower simulation backend {backend!r} is not known; expected one of {list(BACKENDS)}"
        )
    return cast(Backend, backend)


def require_ray() -> None:
    """A :class:`ConfigError` saying how to install Ray, unless it is installed."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "--backend ray runs Flower's simulation engine, which needs Ray (not installed); "
            "install it with: pip install 'fedge[flower-sim]', or use --backend local"
        )
