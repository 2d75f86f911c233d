"""The base of every error whale raises on purpose, at the bottom of the layers.

Each layer's own errors (a bad config value, an unknown task or model, a run directory in use,
a resume that would change the experiment, ...) subclass `WhaleError`, so a script catches
whale's refusals with one `except whale.WhaleError` and lets programming errors through.
`field` names the config field the error is about (`"solver.name"`, `"dev"`, `"out"`) where
there is one: the API fills it in where the layer below could not know it (a model error does
not know whether its model is the solver or the proposer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self


class WhaleError(Exception):
    """A refusal or failure whale names; `field` is the config field it is about, or None."""

    field: str | None = None
    run_dir: Path | None = None  # the run it stopped, once one was made: resume it there

    def at(self, field: str) -> Self:
        """This error, about `field` (kept when the error already names a field)."""
        if self.field is None:
            self.field = field
        return self


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped a run: what finished is recorded in `run_dir`, and the same
    call with `resume=run_dir` (or the command with `--resume`) continues it."""

    def __init__(self, run_dir: Path, total: int | None = None) -> None:
        super().__init__(f"stopped; the finished rollouts are recorded in {run_dir}")
        self.run_dir = run_dir
        self.total = total  # the rollouts the run was to make, where it says
