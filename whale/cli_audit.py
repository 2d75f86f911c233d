"""`whale audit RUN_DIR`: the structural audit and the screens of a run (registered on
`whale.cli.app`). Prints the counts per family and class and every failed screen, and writes
RUN_DIR/audit.json atomically. Reads the run; never executes a harness."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from whale.cli import app, fail, out


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
    try:
        path = write_audit(audit)
    except OSError as e:
        fail(f"cannot write {run_dir / 'audit.json'}: {e.strerror or e}")
    data = audit.to_json()
    if as_json:
        print(json.dumps({**data, "path": str(path)}))
        return
    classes = [c for c in (*AUDIT_CLASSES, UNPARSEABLE)
               if any(c in row for row in data["counts"].values())]  # fmt: skip
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
    out.print(f"wrote {escape(str(path))}")
