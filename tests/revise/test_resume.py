"""A run killed mid-round resumes without paying for any rollout or proposal twice."""

import json
import multiprocessing
import os
import signal
import time

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, SumTask
from whale.harness import Runtime
from whale.models.base import ModelTimeout
from whale.records import RecordError
from whale.revise.loop import LoopSettings, adapt
from whale.revise.proposer import Proposer
from whale.runs import OutcomeStore
from whale.tasks import SealedSplit

SETTINGS = LoopSettings(rounds=2, g=2, select="ratchet", feedback=4, workers=2)


def slow_solver():
    import re

    def reply(messages, sampling):
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return f"The answer is {a + b}."

    return ScriptedModel(reply, delay_s=0.05)


def run(tmp_path, proposer, settings=SETTINGS):
    task = SumTask()
    qs = task.questions()
    store = OutcomeStore(tmp_path)
    try:
        return adapt(
            task, SEED, qs[:10], qs[:10], SealedSplit(qs[10:20], tmp_path / "eval_read.json"),
            Runtime(model=slow_solver()), Proposer(proposer), store, settings,
        )  # fmt: skip
    finally:
        store.close()


def _child(path):
    run(path, ScriptedModel([GOOD_EDIT, "no edit"]))


def ledger(tmp_path):
    return [json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines() if x]


def test_resume_after_kill_mid_round_scores_no_candidate_twice(tmp_path):
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(tmp_path,))
    proc.start()
    deadline = time.monotonic() + 60
    seed_hash = None
    while time.monotonic() < deadline:  # wait until a candidate is part-way through scoring
        if (tmp_path / "outcomes.jsonl").exists():
            rows = ledger(tmp_path)
            seed_hash = seed_hash or (rows[0]["harness"] if rows else None)
            cand = [r for r in rows if r["harness"] != seed_hash and r["split"] == "score"]
            if 2 <= len(cand) < 10:
                break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    before = ledger(tmp_path)
    assert (tmp_path / "round_01" / "proposals.json").exists()
    assert not (tmp_path / "round_01" / "decision.json").exists()

    proposer = ScriptedModel([GOOD_EDIT, "no edit"])
    result = run(tmp_path, proposer)
    after = ledger(tmp_path)
    keys = [(r["harness"], r["question_id"]) for r in after]
    assert len(keys) == len(set(keys)), "a rollout was paid for twice"
    assert after[: len(before)] == before
    assert len(proposer.calls) == SETTINGS.g  # only round 2 was proposed again
    assert result.final_eval.accuracy == 1.0


def test_a_timed_out_proposal_is_asked_again_on_resume(tmp_path):
    settings = LoopSettings(rounds=1, g=2, select="ratchet", feedback=4, workers=2)

    def first(messages, sampling):  # round 1's proposal 0 (seed 1000) times out
        if sampling.seed == 1000:
            raise ModelTimeout("no reply within 600.0 s")
        return GOOD_EDIT

    r1 = run(tmp_path, ScriptedModel(first), settings)
    assert [c.reason.startswith("proposer: ModelTimeout") for c in r1.rounds[0].candidates] == [
        True, False,
    ]  # fmt: skip
    kept = json.loads((tmp_path / "round_01" / "proposals.json").read_text())
    assert [p["index"] for p in kept] == [1]  # only the finished proposal is stored
    again = ScriptedModel([GOOD_EDIT])
    r2 = run(tmp_path, again, settings)
    assert [s.seed for _, s in again.calls] == [1000]  # the timed-out one, with its own seed
    assert all(c.valid for c in r2.rounds[0].candidates)


def test_a_cut_proposals_file_is_an_error_naming_it(tmp_path):
    settings = LoopSettings(rounds=1, g=1, select="ratchet", feedback=4, workers=2)
    run(tmp_path, ScriptedModel([GOOD_EDIT]), settings)
    path = tmp_path / "round_01" / "proposals.json"
    path.write_bytes(path.read_bytes()[:25])
    with pytest.raises(RecordError, match=r"round_01/proposals\.json: not valid JSON"):
        run(tmp_path, ScriptedModel([GOOD_EDIT]), settings)


def test_a_stored_proposal_written_for_another_parent_is_asked_again(tmp_path):
    # Round 1's proposal times out (adapt goes on: no candidate), so round 2 proposes for the
    # seed. The resume asks round 1 again and keeps its edit: round 2's parent, and prompt, are
    # new, and the edit stored for the seed must not be applied to them.
    settings = LoopSettings(rounds=2, g=1, select="ratchet", feedback=4, workers=2)

    def first(messages, sampling):
        if sampling.seed == 1000:
            raise ModelTimeout("no reply within 600.0 s")
        return GOOD_EDIT

    r1 = run(tmp_path, ScriptedModel(first), settings)
    assert r1.rounds[1].decision.chosen is not None  # round 2 kept its edit of the seed
    again = ScriptedModel([GOOD_EDIT, "no edit"])
    r2 = run(tmp_path, again, settings)
    assert [s.seed for _, s in again.calls] == [1000, 2000]  # round 2 asked again
    assert r2.rounds[0].decision.chosen is not None
    assert r2.rounds[1].candidates[0].reason != r1.rounds[1].candidates[0].reason


def test_a_round_told_to_stop_on_a_failed_proposal_stops_before_its_decision(tmp_path):
    from whale.experiments.runner import _transient
    from whale.revise.proposer import ProposalsFailed

    settings = LoopSettings(rounds=2, g=2, select="ratchet", feedback=4, workers=2,
                            stop_on_failed_proposal=True)  # fmt: skip

    def first(messages, sampling):
        if sampling.seed == 1001:
            raise ModelTimeout("no reply within 600.0 s")
        return GOOD_EDIT

    with pytest.raises(ProposalsFailed, match="round 1: 1 of 2") as err:
        run(tmp_path, ScriptedModel(first), settings)
    assert isinstance(_transient(err.value), ModelTimeout)  # a runner resumes it
    assert not (tmp_path / "round_01" / "decision.json").exists()
    again = ScriptedModel([GOOD_EDIT, "no edit", "no edit"])
    r = run(tmp_path, again, settings)
    assert [s.seed for _, s in again.calls][0] == 1001  # the failed one, with its own seed
    assert len(r.rounds) == 2 and r.rounds[0].decision.chosen is not None
