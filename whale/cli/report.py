"""`whale report RUN_DIR`: one self-contained HTML file of a run (registered on `whale.cli.app`).

The page is built by `whale.analysis.report.build_report` (imported when the command runs, so
matplotlib stays out of `whale --help`). A folder holding nothing any run writes (see
`report_data.has_run_records`) is refused with exit 2 rather than given an empty page; a run
of a known kind that was cut short still renders, with notes. Not covered: opening a browser;
the path is printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from whale.cli.common import app, fail, out


@app.command("report")
def report_cmd(
    run_dir: Annotated[
        Path, typer.Argument(help="an adapt, search, cotrain or train-proposer run")
    ],
    out_file: Annotated[
        Path | None, typer.Option("--out", help="where to write (default RUN_DIR/report.html)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Write one HTML file (no server, no network) of a run: the result first (held-out
    accuracy before and after, as k/n with a 95% interval; the kept edits; the curve), then
    lineage, diffs, curves, metrics, proposer format compliance, audit and split reads; the
    raw config and summary.json last."""
    from whale.analysis.report import build_report
    from whale.analysis.report_data import has_run_records

    if not run_dir.is_dir():
        fail(f"{run_dir}: not a folder")
    if not has_run_records(run_dir):
        fail(f"no run records found in {run_dir} (no round_NN/, archive/, schedule folders, "
             "train-proposer stages, config.toml or outcomes.jsonl)")  # fmt: skip
    try:
        path = build_report(run_dir, out=out_file)
    except OSError as e:
        fail(f"cannot write the report: {e}")
        return
    if as_json:
        print(json.dumps({"run_dir": str(run_dir), "report": str(path)}))
    else:
        out.print(str(path), soft_wrap=True, markup=False, highlight=False)
