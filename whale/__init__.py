"""whale: optimize an LLM agent as a pair (weights, harness).

The public API (`whale.api`): `evaluate`, `adapt`, `search`, `rsft`, `cotrain`,
`train_proposer`, `diagnose`, `load_task`, `load_harness`; each run returns a `Run`, and every
refusal is a `WhaleError` naming its config field. Experiments (`whale.experiments`):
`run_experiment` and `experiment_tables`.
"""

from whale.api import (
    Reading,
    Run,
    RunInterrupted,
    WhaleError,
    adapt,
    cotrain,
    diagnose,
    evaluate,
    load_harness,
    load_task,
    rsft,
    search,
    train_proposer,
)
from whale.experiments import experiment_tables, run_experiment
from whale.revise.edits import ApplyResult, apply_edits

__all__ = [
    "ApplyResult", "Reading", "Run", "RunInterrupted", "WhaleError", "adapt", "apply_edits",
    "cotrain", "diagnose", "evaluate", "experiment_tables", "load_harness", "load_task", "rsft",
    "run_experiment", "search", "train_proposer",
]  # fmt: skip
__version__ = "0.1.0"
