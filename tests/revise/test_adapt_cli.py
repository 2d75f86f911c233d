"""`whale adapt` end to end: against local servers, resume, and on the real embedded models."""

import json

import pytest
from typer.testing import CliRunner

from tests.conftest import require_model
from tests.servers import StubServer
from whale.cli import app

runner = CliRunner()
EDIT = (
    "Return the number after 'Answer:' only.\n<<<<<<< SEARCH\n    return reply.text.strip()\n"
    "=======\n    return reply.text.strip().split()[-1]\n>>>>>>> REPLACE\n"
)


def last_json(output):
    return json.loads(output.strip().splitlines()[-1])


def adapt(*args):
    return runner.invoke(app, ["adapt", *args], catch_exceptions=False)


def test_adapt_runs_and_resume_pays_nothing_twice(tmp_path):
    out = tmp_path / "run"
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", EDIT)]) as proposer:
        common = ["--set", "solver.cache=false", "--set", "proposer.cache=false", "--json"]
        r = adapt("--task", "rg:basic_arithmetic", "--solver", f"s@{solver.base_url}",
                  "--proposer", f"p@{proposer.base_url}", "--rounds", "2", "--g", "2",
                  "--dev", "6", "--eval", "6", "--feedback", "3", "--out", str(out), *common)  # fmt: skip
        assert r.exit_code == 0, r.output
        first = last_json(r.output)
        asked = len(proposer.requests)
        r2 = adapt("--resume", str(out), *common)
        assert r2.exit_code == 0, r2.output
    again = last_json(r2.output)
    assert first["proposals"] == 4 and first["rollouts_ledger"] > 0
    assert again["rollouts_paid_this_invocation"] == 0 and len(proposer.requests) == asked
    assert again["final_eval"] == first["final_eval"]
    assert (out / "summary.md").exists() and (out / "round_02" / "decision.json").exists()
    assert json.loads((out / "eval_read.json").read_text())["n"] == 6


def test_adapt_refuses_a_pool_too_small(tmp_path):
    r = runner.invoke(app, ["adapt", "--task", "rg:basic_arithmetic", "--dev", "5", "--eval", "5",
                            "--set", "task.size=6", "--out", str(tmp_path / "r")])  # fmt: skip
    assert r.exit_code == 2 and "pool has" in r.output


def test_adapt_refuses_an_unknown_select_rule(tmp_path):
    r = runner.invoke(app, ["adapt", "--select", "greedy", "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "greedy" in r.output


@pytest.mark.model
def test_adapt_on_the_embedded_models_with_the_edit_grammar(tmp_path):
    require_model("smollm2-135m")
    r = adapt("--task", "rg:basic_arithmetic", "--solver", "smollm2-135m", "--proposer",
              "smollm2-135m", "--rounds", "1", "--g", "2", "--dev", "3", "--eval", "3",
              "--feedback", "2", "--out", str(tmp_path / "r"), "--set", "propose.max_tokens=200",
              "--set", f"solver.cache_path='{tmp_path / 'c.sqlite'}'",
              "--set", f"proposer.cache_path='{tmp_path / 'c.sqlite'}'", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    s = last_json(r.output)
    assert s["proposals"] == 2 and s["rollouts_ledger"] >= 3 + 3
    proposals = json.loads((tmp_path / "r" / "round_01" / "proposals.json").read_text())
    # Under the grammar every proposal is in the block format (truncation aside).
    assert all("<<<<<<< SEARCH" in p["text"] for p in proposals)


def test_near_duplicate_prompts_never_straddle_dev_and_eval():
    from whale.revise.run import AdaptConfig, split_pools
    from whale.tasks import Question, normalize_prompt

    class Dupes:
        name, description = "dupes", "d"

        def questions(self):
            qs = [Question(f"a{i}", f"What is {i} plus one?", i + 1) for i in range(30)]
            qs += [Question(f"b{i}", f"what is {i} PLUS one", i + 1) for i in range(30)]
            return qs

    fb, score, held = split_pools(Dupes(), AdaptConfig(dev=10, eval=15, share_dev=False, score=5))
    dev_texts = {normalize_prompt(q.prompt) for q in fb + score}
    assert not dev_texts & {normalize_prompt(q.prompt) for q in held}
    assert not {q.id for q in fb} & {q.id for q in score}
