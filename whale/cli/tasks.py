"""`whale tasks`: the task ids the commands accept (the registry's list): the id pattern, where
it comes from (built-in, registered in Python, or the entry point's distribution) and one line."""

from __future__ import annotations

import typer

from whale.cli.common import app
from whale.tasks import task_entries


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
    for e in task_entries():
        print(f"{e.pattern:24s} {e.source:20s} {e.description}")
