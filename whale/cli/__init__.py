"""`whale` command line: one module per command, each a thin layer over `whale.api`. Exit
codes: 0 ok, 1 a run stopped by a cause outside it (`--resume` continues), 2 bad arguments or
a refusal (the message names the bad value), 130 Ctrl-C, 143 SIGTERM."""

from __future__ import annotations

import sys

from whale.cli import (  # noqa: F401  (each module registers its commands on `app`)
    adapt,
    audit,
    cotrain,
    diagnose,
    evaluate,
    experiment,
    index,
    models,
    report,
    search,
    tasks,
    train_proposer,
)
from whale.cli.common import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover
    sys.exit(app())
