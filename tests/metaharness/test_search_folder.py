"""`whale search --harness DIR`: the agent edits a folder harness through the same Apply (a
block names its file), each candidate is one archive folder, and the report, the audit and
resume read them as one candidate each; the accepted harness is written out as a folder."""

from __future__ import annotations

import json

from typer.testing import CliRunner, Result

from tests.bundles import write
from tests.servers import StubServer
from whale.cli import app
from whale.harness import harness_hash
from whale.harness.bundle import parse, read_folder
from whale.metaharness.loop import FILES_NOTE

runner = CliRunner()
HEAD = 'CALL submit {"base": "c0000", "hypothesis": "drop the mark"}\n'
MISSING = HEAD + "<<<<<<< SEARCH marks.py\nBANG = '!'\n=======\nBANG = ''\n>>>>>>> REPLACE\n"
GOOD = (HEAD + "<<<<<<< SEARCH helpers/marks.py\nBANG = '!'\n=======\nBANG = ''\n"
        ">>>>>>> REPLACE\n")  # fmt: skip
COMMON = ["--set", "solver.cache=false", "--set", "proposer.cache=false", "--json"]


def cli(*args: str) -> Result:
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_search_on_a_folder_harness_archives_one_candidate_each(tmp_path):
    seed, out = write(tmp_path / "seed"), tmp_path / "run"
    with (
        StubServer([("ok", "Answer: 3")]) as solver,
        StubServer([("ok", MISSING), ("ok", GOOD)]) as proposer,
    ):
        r = cli("search", "--task", "rg:basic_arithmetic", "--harness", str(seed),
                "--solver", f"s@{solver.base_url}", "--proposer", f"p@{proposer.base_url}",
                "--iterations", "2", "--m", "1", "--dev", "5", "--eval", "5",
                "--out", str(out), *COMMON)  # fmt: skip
        assert r.exit_code == 0, r.output
        first = json.loads(r.output.strip().splitlines()[-1])
        asked = len(proposer.requests)
        r2 = cli("search", "--resume", str(out), *COMMON)
        assert r2.exit_code == 0, r2.output
    again = json.loads(r2.output.strip().splitlines()[-1])
    assert again["rollouts paid this invocation"] == 0 and len(proposer.requests) == asked == 2
    assert FILES_NOTE in proposer.requests[0]["messages"][1]["content"]  # the brief
    src = read_folder(seed)
    archive = out / "archive"
    assert (archive / "c0000" / "harness.py").read_text() == src
    bad = json.loads((archive / "c0100" / "meta.json").read_text())
    assert not bad["valid"] and bad["reason"].startswith(
        "block 1: the harness has no file marks.py"
    )
    good = json.loads((archive / "c0200" / "meta.json").read_text())
    cand = (archive / "c0200" / "harness.py").read_text()
    assert good["valid"] and good["hash"] == harness_hash(cand)
    before, after = parse(src), parse(cand)
    assert after["helpers/marks.py"] == "BANG = ''\n"
    assert {p: t for p, t in after.items() if p != "helpers/marks.py"} == {
        p: t for p, t in before.items() if p != "helpers/marks.py"}  # fmt: skip
    final = out / "final_harness"
    assert first["final harness folder"] == str(final)
    assert harness_hash(read_folder(final)) == first["final_eval"]["hash"]

    assert cli("report", str(out)).exit_code == 0
    r = cli("audit", str(out), "--no-echo", "--json")
    assert r.exit_code == 0, r.output
    hashes = {h["hash"] for h in json.loads(r.stdout)["harnesses"]}
    assert hashes == {harness_hash(src), good["hash"]}
