"""The experiment layer: config → built method → engine → run directory.

It sits above :mod:`fedge.methods` and :mod:`fedge.runtime` (DESIGN.md, "layers"): the pure
layers below it never import it, and the CLI and the public API call it.
"""

from fedge.experiment.build import BuiltRun, build_run, resolved_config
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment

__all__ = ["BuiltRun", "build_run", "resolved_config", "resume_experiment", "run_experiment"]
