"""`whale search` end to end against local servers; its exit-2 paths."""

import json

from typer.testing import CliRunner

from tests.servers import StubServer
from whale.cli import app

runner = CliRunner()
SUBMIT = (
    'CALL submit {"base": "c0000", "hypothesis": "keep the number after Answer:"}\n'
    "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    return reply.text.strip().split()[-1]\n>>>>>>> REPLACE\n"
)


def search(*args):
    return runner.invoke(app, ["search", *args], catch_exceptions=False)


def test_search_runs_and_resume_pays_nothing_twice(tmp_path):
    out = tmp_path / "run"
    common = ["--set", "solver.cache=false", "--set", "proposer.cache=false", "--json"]
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer(
        [("ok", 'CALL top {"k": 3}'), ("ok", SUBMIT)]
    ) as proposer:
        r = search("--task", "rg:basic_arithmetic", "--solver", f"s@{solver.base_url}",
                   "--proposer", f"p@{proposer.base_url}", "--iterations", "1", "--m", "1",
                   "--dev", "5", "--eval", "5", "--out", str(out), *common)  # fmt: skip
        assert r.exit_code == 0, r.output
        first = json.loads(r.output.strip().splitlines()[-1])
        asked = len(proposer.requests)
        r2 = search("--resume", str(out), *common)
        assert r2.exit_code == 0, r2.output
    again = json.loads(r2.output.strip().splitlines()[-1])
    assert first["archived"] == 2 and first["per_iteration"][0]["tool_calls"] == 2
    assert again["rollouts paid this invocation"] == 0
    assert len(proposer.requests) == asked  # the saved session is reused
    assert (out / "archive/c0100/harness.py").exists() and (out / "sessions/c0100.json").exists()


def test_a_bad_patience_is_exit_2(tmp_path):
    r = search("--patience", "six", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "J_MIN,P_H" in r.output


def test_resume_refuses_flags_that_define_the_experiment(tmp_path):
    (tmp_path / "config.toml").write_text("")
    r = search("--resume", str(tmp_path), "--seed", "3")
    assert r.exit_code == 2 and "--seed cannot be given with --resume" in r.output


def test_a_seed_that_breaks_the_run_contract_is_exit_2_before_any_cost(tmp_path):
    r = search("--harness", "/etc/passwd", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "the seed harness does not parse" in r.output
    assert not (tmp_path / "x").exists()


def test_more_than_99_candidates_per_iteration_is_exit_2(tmp_path):
    r = search("--m", "100", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "m must be at most 99" in r.output
