"""`whale audit RUN_DIR` on a small hand-made run directory."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import whale.cli_audit  # noqa: F401  (registers the command until whale.cli imports it)
from tests.analysis.test_audit import make_run
from whale.cli import app


def test_audit_cli_table_json_and_file(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    res = CliRunner().invoke(app, ["audit", str(run), "--no-echo"])
    assert res.exit_code == 0, res.output
    assert "t:fam" in res.output and "retry_loop" in res.output and "unparseable" in res.output
    assert "duplicate c0ffee" in res.output and "interface deadbeef" in res.output
    saved = json.loads((run / "audit.json").read_text())
    assert saved["counts"] == {"t:fam": {"single_call": 1, "retry_loop": 2, "unparseable": 1}}
    res = CliRunner().invoke(app, ["audit", str(run), "--no-echo", "--json"])
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["path"] == str(run / "audit.json")
    assert {h["hash"] for h in data["harnesses"]} >= {"deadbeef", "c0ffee"}
    assert not list(run.glob(".audit.json.*"))  # written atomically, no temporary left


def test_audit_cli_refuses_a_missing_folder(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["audit", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "not a run directory" in res.output
