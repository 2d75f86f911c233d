"""`whale adapt --harness DIR`: a folder harness is one candidate through Apply, the ledger,
the report, the audit and resume; the final harness is written out as a folder too."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from tests.bundles import FILES, write
from tests.servers import StubServer
from whale.cli import app
from whale.harness import harness_hash
from whale.harness.bundle import parse, read_folder

runner = CliRunner()
EDIT = ("Drop the mark.\n<<<<<<< SEARCH helpers/marks.py\nBANG = '!'\n=======\nBANG = ''\n"
        ">>>>>>> REPLACE\n")  # fmt: skip
COMMON = ["--set", "solver.cache=false", "--set", "proposer.cache=false", "--json"]


def cli(*args: str) -> Result:
    return runner.invoke(app, list(args), catch_exceptions=False)


def adapt_run(tmp_path: Path) -> tuple[Path, Path, dict, StubServer]:
    seed, out = write(tmp_path / "seed"), tmp_path / "run"
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", EDIT)]) as proposer:
        r = cli("adapt", "--task", "rg:basic_arithmetic", "--harness", str(seed),
                "--solver", f"s@{solver.base_url}", "--proposer", f"p@{proposer.base_url}",
                "--rounds", "1", "--g", "2", "--select", "best-of-g", "--dev", "6",
                "--eval", "6", "--feedback", "3", "--out", str(out), *COMMON)  # fmt: skip
        assert r.exit_code == 0, r.output
        summary = json.loads(r.output.strip().splitlines()[-1])
        r2 = cli("adapt", "--resume", str(out), *COMMON)
        assert r2.exit_code == 0, r2.output
        again = json.loads(r2.output.strip().splitlines()[-1])
    assert (
        again["rollouts_paid_this_invocation"] == 0 and again["final_eval"] == summary["final_eval"]
    )
    return seed, out, summary, proposer


def test_adapt_edits_one_file_and_writes_the_final_harness_as_a_folder(tmp_path):
    seed, out, summary, proposer = adapt_run(tmp_path)
    assert len(proposer.requests) == 2  # the resume asked nothing again
    prompt = proposer.requests[0]["messages"][0]["content"]
    assert "File helpers/marks.py:\n```python\nBANG = '!'\n```" in prompt
    src = read_folder(seed)
    assert summary["seed_eval"]["hash"] == harness_hash(src)
    assert (out / "harnesses" / f"{harness_hash(src)}.py").read_text() == src
    final = out / "final_harness"
    assert summary["final_harness_folder"] == str(final)
    assert summary["final_eval"]["hash"] == harness_hash(read_folder(final))
    assert (final / "helpers" / "marks.py").read_text() == "BANG = ''\n"
    for path in ("harness.py", "util.py", "helpers/text.py"):
        assert (final / path).read_bytes() == (seed / path).read_bytes()
    cands = json.loads((out / "round_01" / "candidates.json").read_text())
    assert [c["valid"] for c in cands] == [True, True]
    diff = (out / "round_01" / "candidate_0.diff").read_text()
    assert "-BANG = '!'" in diff and "+BANG = ''" in diff
    assert "final harness folder" in (out / "summary.md").read_text()


def test_report_and_audit_see_one_candidate_per_folder_harness(tmp_path):
    seed, out, summary, _ = adapt_run(tmp_path)
    r = cli("report", str(out))
    assert r.exit_code == 0, r.output
    assert "BANG" in (out / "report.html").read_text()
    r = cli("audit", str(out), "--no-echo", "--json")
    assert r.exit_code == 0, r.output
    audit = json.loads(r.stdout)
    hashes = {h["hash"] for h in audit["harnesses"]}
    assert hashes == {summary["seed_eval"]["hash"], summary["final_eval"]["hash"]}
    assert all(h["class"] == "single_call" for h in audit["harnesses"])
    assert {s["hash"] for s in audit["screens"]} == hashes
    assert all(s["passed"] for s in audit["screens"] if s["screen"] != "duplicate")
    # a one-character edit is a near duplicate of its parent, read as one program each
    dup = [s for s in audit["screens"] if s["screen"] == "duplicate" and not s["passed"]]
    assert [s["evidence"][0].split(" (")[0] for s in dup] == [
        f"duplicate of {summary['seed_eval']['hash']}"]  # fmt: skip
    assert harness_hash((seed / "harness.py").read_text()) not in hashes  # final_harness/ skipped


def test_a_resume_after_a_file_of_the_folder_changed_is_refused(tmp_path):
    seed, out, _, _ = adapt_run(tmp_path)
    (seed / "util.py").write_text(FILES["util.py"] + "# edited\n")
    r = cli("adapt", "--resume", str(out), *COMMON)
    assert r.exit_code == 2 and "the file was edited (for a folder, one of its files)" in r.output


def test_a_folder_that_breaks_the_rules_is_exit_2_before_any_cost(tmp_path):
    seed = write(tmp_path / "seed")
    (seed / "notes.txt").write_text("x")
    r = cli("adapt", "--harness", str(seed), "--out", str(tmp_path / "run"))
    assert r.exit_code == 2 and "notes.txt" in r.output
    assert not (tmp_path / "run").exists()
    assert sorted(parse(read_folder(write(tmp_path / "ok")))) == sorted(FILES)
