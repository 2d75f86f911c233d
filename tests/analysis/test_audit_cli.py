"""`whale audit RUN_DIR` on a small hand-made run directory."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import whale.cli.audit  # noqa: F401  (registers the command until whale.cli imports it)
from tests.analysis.test_audit import BROKEN_H, COPY_H, make_run
from whale.cli import app


def test_audit_cli_table_json_and_file(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    res = CliRunner().invoke(app, ["audit", str(run), "--no-echo"])
    assert res.exit_code == 0, res.output
    assert "t:fam" in res.output and "retry_loop" in res.output and "unparseable" in res.output
    assert f"duplicate {COPY_H}" in res.output and f"interface {BROKEN_H}" in res.output
    saved = json.loads((run / "audit.json").read_text())
    assert saved["counts"] == {"t:fam": {"single_call": 1, "retry_loop": 2, "unparseable": 1}}
    res = CliRunner().invoke(app, ["audit", str(run), "--no-echo", "--json"])
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["path"] == str(run / "audit.json")
    assert {h["hash"] for h in data["harnesses"]} >= {BROKEN_H, COPY_H}
    assert not list(run.glob(".audit.json.*"))  # written atomically, no temporary left


def test_audit_cli_refuses_a_missing_folder(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["audit", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "not a run directory" in res.output


def test_audit_cli_on_a_folder_without_harnesses(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a run")
    res = CliRunner().invoke(app, ["audit", str(tmp_path), "--no-echo"])
    assert res.exit_code == 2 and "no harness found in" in res.output
    assert not (tmp_path / "audit.json").exists()


def test_audit_cli_shows_the_result_when_the_write_fails(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "audit.json").mkdir()  # the write cannot replace a folder
    res = CliRunner().invoke(app, ["audit", str(run), "--no-echo"])
    assert res.exit_code == 1, res.output
    assert "retry_loop" in res.output and f"duplicate {COPY_H}" in res.output
    assert "warning: cannot write" in res.stderr and "wrote" not in res.stdout
    res = CliRunner().invoke(app, ["audit", str(run), "--no-echo", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["counts"]["t:fam"]["retry_loop"] == 2
