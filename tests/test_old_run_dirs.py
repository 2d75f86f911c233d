"""Run directories made before issue 22 (whale at cfa345e: `whale/cli.py`, `whale/search/`,
`whale/cotrain.py`) still resume, from the command line and from Python, paying nothing twice.

tests/fixtures/adapt-pre22 is a `whale adapt` run (rg:basic_arithmetic, 1 round, G = 2, 6 dev
and 6 eval questions) written by that whale against local stub servers; a resume builds the
models from its config but asks them nothing: every rollout and proposal is in its records.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

import whale
from whale.cli import app

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "adapt-pre22"


def copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    return run


def test_an_adapt_run_of_the_old_whale_resumes_from_the_cli_paying_nothing(tmp_path):
    run = copy(tmp_path)
    before = json.loads((run / "summary.json").read_text())
    r = CliRunner().invoke(app, ["adapt", "--resume", str(run), "--json"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.output.strip().splitlines()[-1])
    assert again["rollouts_paid_this_invocation"] == 0
    assert again["final_eval"] == before["final_eval"] and again["proposals"] == before["proposals"]


def test_an_adapt_run_of_the_old_whale_resumes_from_python_paying_nothing(tmp_path):
    run = copy(tmp_path)
    before = json.loads((run / "summary.json").read_text())
    again = whale.adapt(resume=run)
    assert again.records["rollouts_paid_this_invocation"] == 0
    assert again.held_out["final"].accuracy == before["final_eval"]["accuracy"]
    assert again.harness is not None and "def run" in again.harness
