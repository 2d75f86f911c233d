"""`whale experiment run | table`, over `whale.experiments` (the runner and the tables).

    whale experiment run experiments/whale --scale toy     # every step, resumably
    whale experiment table experiments/whale --scale toy   # the tables, from the run folders

Run again after a kill or Ctrl-C: finished steps are skipped, the one in progress resumes.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from whale.cli.common import JSON, app, call, err, out, say

experiment_app = typer.Typer(
    no_args_is_help=True, help="Run an experiment's steps resumably; make its tables."
)
app.add_typer(experiment_app, name="experiment")

_DIR = typer.Argument(..., help="a folder holding experiment.toml (or the file)")
_RUNS = typer.Option(
    None,
    "--runs",
    help="ROOT of the runs (default ~/whale-runs/experiments): "
    "each step runs in ROOT/<experiment>/<scale>/<step>",
)
_SCALE = typer.Option(
    "small",
    "--scale",
    help="small (the file as written), toy, paper, or another [scale.NAME] of the file",
)


def _again(directory: Path, runs: Path | None, scale: str, retries: int = 2) -> str:
    where = f" --runs {runs}" if runs is not None else ""
    more = f" --retries {retries}" if retries != 2 else ""
    return f"whale experiment run {directory} --scale {scale}{where}{more}"


@experiment_app.command("run")
def run_cmd(directory: Path = _DIR, runs: Path = _RUNS, scale: str = _SCALE,
            retries: int = typer.Option(2, "--retries", min=0,
                                        help="times a step stopped by a model call that got no "
                                        "reply or found no server is resumed"),
            as_json: bool = JSON) -> None:  # fmt: skip
    """Run the experiment's steps in order: a finished step is skipped, a started one resumed
    through its operator's resume; a step whose config changed since it started is refused."""
    from whale.experiments import run_experiment
    from whale.models import ModelError
    from whale.records import RecordError

    result = call(lambda: run_experiment(directory, runs, scale, say, retries),
                  lambda d: _again(directory, runs, scale, retries),
                  also=(RecordError, ModelError, OSError))  # fmt: skip
    if as_json:
        print(json.dumps({"experiment": result.name, "scale": result.scale,
                          "root": str(result.root), "config_sha256": result.config_sha256,
                          "steps": result.steps}))  # fmt: skip
        return
    for s in result.steps:
        out.print(f"{s['step']:<24} {s['kind']:<15} {s['action']:<8} {s['wall_s']:>9.0f} s  "
                  f"{s['dir']}", highlight=False)  # fmt: skip
    err.print(
        f"tables: whale experiment table {directory} --scale {scale}"
        + (f" --runs {runs}" if runs is not None else "")
    )


@experiment_app.command("table")
def table_cmd(directory: Path = _DIR, runs: Path = _RUNS, scale: str = _SCALE,
              out_file: Path = typer.Option(None, "--out", help="the Markdown file (default "
                                            "ROOT/<experiment>/<scale>/tables.md); plots "
                                            "beside it")) -> None:  # fmt: skip
    """Every results table of the experiment, made from its run directories, with n, model,
    task, standard errors, the whale commits and the config hashes they came from."""
    from whale.experiments import experiment_tables
    from whale.records import RecordError

    path = call(
        lambda: experiment_tables(directory, runs, scale, out_file),
        lambda d: f"whale experiment table {directory}",
        also=(RecordError, OSError),
    )
    out.print(str(path), highlight=False, soft_wrap=True)
