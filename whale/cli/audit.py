"""`whale audit RUN_DIR`: the structural audit and the screens of a run (registered on
`whale.cli.app`). Prints the counts per family and class and every failed screen, then writes
RUN_DIR/audit.json atomically. Reads the run; never executes a harness.

Exit codes: 0 shown and written; 1 shown but audit.json could not be written (a read-only
folder, an audit.json that is a folder: a warning on stderr says why); 2 nothing to audit (not
a folder, or no harness and no dataset of edits in it: nothing is written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from whale.cli.common import app, err, fail, out


@app.command("audit")
def audit_cmd(
    run_dir: Path = typer.Argument(..., help="an adapt, search, cotrain or train-proposer run"),  # noqa: B008
    as_json: bool = typer.Option(False, "--json", help="print the audit as one JSON object"),
    no_echo: bool = typer.Option(
        False, "--no-echo", help="skip the answer-echo screen (it loads the task)"
    ),
) -> None:
    """Classify every harness of RUN_DIR and screen it; write RUN_DIR/audit.json."""
    from whale.analysis.audit import AUDIT_CLASSES, UNPARSEABLE, audit_run, write_audit

    if not run_dir.is_dir():
        fail(f"{run_dir}: not a run directory")
    audit = audit_run(run_dir, echo=not no_echo)
    if not audit.harnesses and not audit.screens:
        fail(f"no harness found in {run_dir}")
    data = audit.to_json()
    path = run_dir / "audit.json"
    if as_json:
        print(json.dumps({**data, "path": str(path)}))
    else:
        _print(data, run_dir, [*AUDIT_CLASSES, UNPARSEABLE])
    try:
        write_audit(audit, path)
    except OSError as e:
        err.print(f"[yellow]warning:[/yellow] cannot write {escape(str(path))}: "
                  f"{escape(str(e.strerror or e))}", soft_wrap=True)  # fmt: skip
        raise typer.Exit(1) from None
    if not as_json:
        out.print(f"wrote {escape(str(path))}")


def _print(data: dict[str, Any], run_dir: Path, all_classes: list[str]) -> None:
    classes = [c for c in all_classes if any(c in row for row in data["counts"].values())]
    table = Table(title=f"harness classes in {escape(str(run_dir))}")
    table.add_column("family")
    for c in classes:
        table.add_column(c, justify="right")
    for fam, row in sorted(data["counts"].items()):
        table.add_row(escape(fam), *(str(row.get(c, 0)) for c in classes))
    out.print(table)
    failed = [s for s in data["screens"] if not s["passed"]]
    out.print(f"screens: {len(data['screens']) - len(failed)} passed, {len(failed)} failed")
    for s in failed:
        ev = "; ".join(s["evidence"]) or "(no evidence)"
        out.print(f"  {escape(s['screen'])} {escape(s['hash'])}: {escape(ev)}", soft_wrap=True)
    for note in data["notes"]:
        out.print(f"note: {escape(note)}", soft_wrap=True)
