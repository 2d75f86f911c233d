"""`whale tasks`: the task ids the commands accept (the registry's list)."""

from __future__ import annotations

import typer

from whale.cli.common import app
from whale.tasks import task_ids


@app.command("tasks")
def tasks_cmd(
    families: bool = typer.Option(False, "--families", help="list Reasoning Gym families"),
) -> None:
    """Task ids the commands accept."""
    if families:
        from whale.tasks.rg import families as fams

        for f in fams():
            print(f"rg:{f}")
        return
    for pattern, line in task_ids():
        print(f"{pattern:24s} {line}")
