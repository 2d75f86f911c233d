"""Experiments: ordered steps of the public API's operators in one config file
(`experiment.toml`), run resumably at a scale (`run_experiment`, `whale experiment run`), and
every results table made from their run directories (`experiment_tables`, `whale experiment
table`). The two papers' experiments are `experiments/harness-learning/` and
`experiments/whale/`; docs/experiments.md says how to run them.

Layer: beside `whale.api` (it calls the API's operators, the CLI calls it).
"""

from whale.experiments.runner import DEFAULT_RUNS, Experiment, StepChanged, run_experiment
from whale.experiments.select import SelectionShort
from whale.experiments.tables import experiment_tables

__all__ = ["DEFAULT_RUNS", "Experiment", "SelectionShort", "StepChanged", "experiment_tables",
           "run_experiment"]  # fmt: skip
