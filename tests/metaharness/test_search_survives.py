"""Issue 20: a search goes on past any agent call, a failing session, or a full context, and a
resumed run never replays the step that stopped it."""

import json
import os

import pytest

from tests.fakes import ScriptedModel
from tests.metaharness.test_bad_calls import BAD_CALLS
from tests.metaharness.test_loop import GOOD
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.harness import Runtime, harness_hash
from whale.metaharness import Archive, ArchiveTools, CandidateMeta
from whale.metaharness.agent import PENDING, ProposerAgent
from whale.metaharness.loop import SearchSettings, search
from whale.metaharness.run import SearchConfig, run_search
from whale.models.base import ContextOverflow
from whale.runs import OutcomeStore

BAD = list(BAD_CALLS.values())


class Killed(BaseException):
    """A kill of the whole process (it passes every `except Exception`)."""


def go(tmp_path, model, iterations=2, tools_cls=ArchiveTools):
    task = SumTask()
    qs = task.questions()[:6]
    (tmp_path / "archive").mkdir(exist_ok=True)
    if not (tmp_path / "archive/pipe").exists():
        os.mkfifo(tmp_path / "archive/pipe")  # what BAD_CALLS greps
    store = OutcomeStore(tmp_path)
    archive = Archive(tmp_path / "archive", [q.id for q in qs])
    agent = ProposerAgent(model, tools_cls(archive, task.description))
    try:
        r = search(task, SEED, qs, Runtime(model=prose_solver()), agent, store, archive,
                   SearchSettings(iterations=iterations, m=1, workers=3))
    finally:
        store.close()
    return r, archive, store


def bad_then_good(messages, sampling):
    """Every bad call of the issue, then a good submission."""
    k = sum(m["role"] == "assistant" for m in messages)
    return BAD[k] if k < len(BAD) else GOOD


def session(tmp_path, cid):
    return json.loads((tmp_path / f"sessions/{cid}.json").read_text())


def test_a_search_whose_agent_sends_every_bad_call_runs_to_the_end_and_resumes(tmp_path):
    def killed_in_iteration_2(messages, sampling):
        if messages[1]["content"].startswith("Iteration 2.") and len(messages) > 6:
            raise Killed()  # after three bad calls of the second session
        return bad_then_good(messages, sampling)

    with pytest.raises(Killed):
        go(tmp_path, ScriptedModel(killed_in_iteration_2))
    model = ScriptedModel(bad_then_good)
    r, archive, _ = go(tmp_path, model)
    assert [m.id for m in archive.candidates()] == ["c0000", "c0100", "c0200"]
    assert r.accepted_id == "c0100" and len(r.iterations) == 2
    for cid in ("c0100", "c0200"):
        outputs = [c["output"] for c in session(tmp_path, cid)["calls"]]
        assert len(outputs) == 6 and all(o.startswith("error:") for o in outputs[:5]), outputs
    assert len(model.calls) == 3  # the second session went on from its third bad call
    again = ScriptedModel(bad_then_good)
    _, _, store = go(tmp_path, again)
    assert again.calls == [] and store.new_rollouts == 0


def test_the_whole_search_command_survives_the_bad_calls_and_resumes(tmp_path):
    (tmp_path / "archive").mkdir()
    os.mkfifo(tmp_path / "archive/pipe")
    cfg = SearchConfig(iterations=1, m=1, dev=6, eval=6, workers=3)
    task = SumTask(n=12)
    _, meta = run_search(cfg, tmp_path, task, SEED, prose_solver(), ScriptedModel(bad_then_good))
    assert meta["final_eval"]["id"] == "c0100" and meta["per_iteration"][0]["tool_calls"] == 6
    proposer = ScriptedModel(bad_then_good)
    _, again = run_search(cfg, tmp_path, task, SEED, prose_solver(), proposer)
    assert proposer.calls == [] and again["rollouts paid this invocation"] == 0


def test_a_session_that_fails_in_a_way_whale_does_not_know_ends_its_candidate_only(tmp_path):
    def broken_in_iteration_1(messages, sampling):
        if messages[1]["content"].startswith("Iteration 1."):
            raise RuntimeError("a backend bug")  # not a ModelError
        return GOOD

    r, archive, _ = go(tmp_path, ScriptedModel(broken_in_iteration_1))
    bad = archive.get("c0100")
    assert not bad.valid and bad.reason == "no submission (failed: RuntimeError: a backend bug)"
    assert session(tmp_path, "c0100")["ended"] == "failed: RuntimeError: a backend bug"
    assert r.accepted_id == "c0200" and len(r.iterations) == 2


def test_a_resume_does_not_run_again_the_call_that_killed_the_run(tmp_path):
    class DeadlyGrep(ArchiveTools):
        runs = 0

        def grep(self, args):
            DeadlyGrep.runs += 1
            raise Killed()  # as a call that brings the process down would

    script = ['CALL grep {"pattern": "x"}', GOOD]
    with pytest.raises(Killed):
        go(tmp_path, ScriptedModel(script), iterations=1, tools_cls=DeadlyGrep)
    model = ScriptedModel(script[1:])
    r, _, _ = go(tmp_path, model, iterations=1, tools_cls=DeadlyGrep)
    assert DeadlyGrep.runs == 1 and len(model.calls) == 1 and r.accepted_id == "c0100"
    calls = session(tmp_path, "c0100")["calls"]
    assert calls[0]["name"] == "grep" and calls[0]["output"] == PENDING
    assert model.calls[0][0][3]["content"] == "RESULT:\n" + PENDING  # what the agent read


class SmallContext:
    """A proposer whose context holds `limit` characters of messages; replies from a script."""

    name = "small"

    def __init__(self, replies, limit):
        self.model, self.limit, self.sent = ScriptedModel(replies), limit, []

    def chat(self, messages, sampling, timeout=None):
        size = sum(len(m["content"]) for m in messages)
        if size > self.limit:
            raise ContextOverflow(f"small: prompt does not fit ({size} > {self.limit} chars)")
        self.sent.append(messages)
        return self.model.chat(messages, sampling, timeout)


def test_an_overflowing_session_trims_its_oldest_results_and_goes_on(tmp_path):
    archive = Archive(tmp_path / "archive", ["s0"])
    archive.add(CandidateMeta("c0000", None, 0, "seed", harness_hash(SEED), True, score=0.0,
                              accuracy=0.0), SEED)
    tools = ArchiveTools(archive, "Add two integers. " * 160, char_budget=3000)  # 2,880 chars
    probe = SmallContext([GOOD], limit=10**9)
    ProposerAgent(probe, tools).run(1, 0, seed=0, brief="brief")
    first = sum(len(m["content"]) for m in probe.sent[0])  # the system prompt and the brief
    model = SmallContext(["CALL task {}"] * 3 + [GOOD], limit=first + 7000)  # 2 results fit
    s = ProposerAgent(model, tools).run(1, 0, seed=0, brief="brief")
    assert s.ended == "submitted" and s.submission.valid and s.trimmed == 1
    last = model.sent[-1]
    assert last[1]["content"] == "brief" and "older result trimmed" in last[3]["content"]
    assert last[5]["content"] == last[7]["content"] == s.messages[7]["content"]  # latest kept
    assert s.messages[3]["content"] == s.messages[7]["content"]  # the record keeps it whole


def test_a_session_that_cannot_fit_ends_its_candidate_with_the_reason(tmp_path):
    r, archive, _ = go(tmp_path, SmallContext([GOOD], limit=100))
    bad = archive.get("c0100")
    assert not bad.valid and "context overflow" in bad.reason and "100 chars" in bad.reason
    assert len(r.iterations) == 2 and r.accepted_id == "c0000"  # the search went on
