"""An executor lost after the run started (ExecutorUnavailable from inside the rollouts) ends
`whale adapt`, `whale search` and `whale train-proposer` with exit 2 and the resume command,
not a traceback; what finished is in the ledger and a resume pays only the rest (issue 20)."""

import json

import pytest
from typer.testing import CliRunner

from tests.servers import StubServer
from whale.cli import app
from whale.harness.executor import ExecutorUnavailable
from whale.records import read_jsonl

runner = CliRunner()
LOST = "ray: 1 actor(s) not started after 120 s (does the cluster have 1 free CPU(s)?)"
COMMON = ["--set", "solver.cache=false", "--set", "proposer.cache=false", "--json"]


class LostAfter:
    """An executor that runs its first `k` rollouts (in the caller's thread) and is then lost
    for good, as a Ray cluster that has no room left for a replacement actor is."""

    def __init__(self, k: int) -> None:
        self.left = k

    def stream(self, runtime, source, rollouts, workers, retriever):
        for i, r in enumerate(rollouts):
            if self.left <= 0:
                raise ExecutorUnavailable(LOST)
            self.left -= 1
            yield i, runtime.run(source, r.prompt, r.question_id, retriever)

    def close(self) -> None:
        pass


@pytest.fixture
def lost_after(monkeypatch):
    def install(k: int) -> None:
        fake = LostAfter(k)
        monkeypatch.setattr("whale.harness.settings.make_executor", lambda cfg: fake)

    yield install
    monkeypatch.undo()


def said(r):
    return " ".join(r.output.split())


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_adapt_exits_2_with_the_resume_command_and_resumes(tmp_path, lost_after):
    out = tmp_path / "run"
    edit = ("Keep the last word.\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
            "    return reply.text.strip().split()[-1]\n>>>>>>> REPLACE\n")  # fmt: skip
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", edit)]) as proposer:
        args = ["--task", "rg:basic_arithmetic", "--solver", f"s@{solver.base_url}",
                "--proposer", f"p@{proposer.base_url}", "--rounds", "1", "--g", "1",
                "--dev", "4", "--eval", "4", "--feedback", "2", "--out", str(out)]  # fmt: skip
        lost_after(3)
        r = invoke("adapt", *args, *COMMON)
        assert r.exit_code == 2, r.output
        assert "executor unavailable" in said(r) and f"whale adapt --resume {out}" in said(r)
        assert len(read_jsonl(out / "outcomes.jsonl")) == 3
        lost_after(10**6)
        r = invoke("adapt", "--resume", str(out), *COMMON)
    assert r.exit_code == 0, r.output
    done = json.loads(r.output.strip().splitlines()[-1])
    paid = len(read_jsonl(out / "outcomes.jsonl"))
    assert done["rollouts_paid_this_invocation"] == paid - 3


def test_search_exits_2_with_the_resume_command_and_resumes(tmp_path, lost_after):
    out = tmp_path / "run"
    submit = ('CALL submit {"base": "c0000", "hypothesis": "keep the number"}\n'
              "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
              "    return reply.text.strip().split()[-1]\n>>>>>>> REPLACE\n")  # fmt: skip
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", submit)]) as proposer:
        args = ["--task", "rg:basic_arithmetic", "--solver", f"s@{solver.base_url}",
                "--proposer", f"p@{proposer.base_url}", "--iterations", "1", "--m", "1",
                "--dev", "4", "--eval", "4", "--out", str(out)]  # fmt: skip
        lost_after(2)
        r = invoke("search", *args, *COMMON)
        assert r.exit_code == 2, r.output
        assert "executor unavailable" in said(r) and f"whale search --resume {out}" in said(r)
        lost_after(10**6)
        r = invoke("search", "--resume", str(out), *COMMON)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["archived"] == 2


def test_train_proposer_exits_2_with_the_command_that_continues(tmp_path, lost_after,
                                                                 monkeypatch):  # fmt: skip
    from tests.revise.conftest import SEED, prose_solver
    from tests.train.test_proposer_pipeline import BASES, OffsetSum
    from whale.train.proposer import run as runmod
    from whale.train.proposer.contexts import family_dir, family_of

    seed, template = tmp_path / "seed.py", tmp_path / "template.txt"
    seed.write_text(SEED)
    template.write_text("Task: {description}\nHarness:\n{source}\nReport:\n{report}\nEdit it.")
    monkeypatch.setattr(runmod, "build_model", lambda mcfg: prose_solver())
    monkeypatch.setattr(runmod, "open_family", lambda fam, cs, run_dir, solver, rt: family_of(
        fam, OffsetSum(BASES[fam]), cs, family_dir(run_dir, fam)))  # fmt: skip
    config = tmp_path / "c.toml"
    config.write_text(f"""
[families]
sft = ["test:a", "test:b"]
rl = ["test:c"]
eval = ["test:d"]
[contexts]
dev = 12
score = 6
eval = 8
feedback = 4
contexts = 1
seeds = ["{seed}"]
template = "{template}"
[solver]
name = "solver"
[teacher]
name = "teacher"
""")
    lost_after(2)
    run = tmp_path / "run"
    r = invoke("train-proposer", "sft", "--run", str(run), "--config", str(config))
    assert r.exit_code == 2, r.output
    assert "executor unavailable" in said(r)
    assert f"whale train-proposer sft --run {run}" in said(r)
