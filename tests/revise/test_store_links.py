"""A run directory's records are never written (or read) through a link (issue 20): a resume
whose ledger, trajectory file or sub-folder was replaced by a symlink to something outside the
run stops with exit 2 naming it, and the file outside is left as it was."""

import os

from tests.revise.test_resume_cli import (  # noqa: F401 - finished, run_dir, servers: fixtures
    COMMON,
    adapt,
    finished,
    run_dir,
    said,
    servers,
)


def test_a_symlinked_ledger_is_refused_on_resume_and_not_written(run_dir, tmp_path):  # noqa: F811
    # issue 20: outcomes.jsonl replaced by a link to a file outside the run directory; the
    # resume appended its rows there. Half the rows kept, so the resume has rollouts to pay.
    ledger = run_dir / "outcomes.jsonl"
    rows = ledger.read_bytes().splitlines(keepends=True)
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"".join(rows[: len(rows) // 2]))
    before = outside.read_bytes()
    ledger.unlink()
    ledger.symlink_to(outside)
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 2, r.output
    assert "outcomes.jsonl: a symbolic link" in said(r)
    assert outside.read_bytes() == before


def test_a_symlinked_trajectories_folder_is_refused_on_resume(run_dir, tmp_path):  # noqa: F811
    folder = run_dir / "trajectories"
    outside = tmp_path / "elsewhere"
    folder.rename(outside)
    folder.symlink_to(outside)
    before = sorted(os.listdir(outside))
    r = adapt("--resume", str(run_dir), *COMMON)
    assert r.exit_code == 2, r.output
    assert "trajectories: a symbolic link" in said(r)
    assert sorted(os.listdir(outside)) == before


def test_a_fifo_as_ledger_is_refused_without_blocking(run_dir):  # noqa: F811
    ledger = run_dir / "outcomes.jsonl"
    ledger.unlink()
    os.mkfifo(ledger)
    r = adapt("--resume", str(run_dir), *COMMON)  # reading a FIFO would wait for ever
    assert r.exit_code == 2, r.output
    assert "outcomes.jsonl: not a regular file" in said(r)
