"""Benchmarks behind ``fedge bench``: each measures, returns JSON-ready figures, and can
append a Markdown section with the exact command to ``docs/benchmarks.md``."""
