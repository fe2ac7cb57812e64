"""``python -m fedge``: the ``fedge`` command line (where the console script is not on PATH)."""

from fedge.cli.main import app

if __name__ == "__main__":  # pragma: no cover
    app(prog_name="fedge")
