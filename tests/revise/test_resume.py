"""A run killed mid-round resumes without paying for any rollout or proposal twice."""

import json
import multiprocessing
import os
import signal
import time
from dataclasses import asdict

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


def _timeout_in_round_1(messages, sampling):  # round 1's proposal 0 (seed 1000) times out
    if sampling.seed == 1000:
        raise ModelTimeout("no reply within 600.0 s")
    return GOOD_EDIT


def _as_an_older_whale_wrote_them(tmp_path, rounds):
    """proposals.json rows without the prompt they answer (whale before 2026-12-05)."""
    for t in rounds:
        path = tmp_path / f"round_{t:02d}" / "proposals.json"
        rows = [{k: v for k, v in r.items() if k != "prompt_sha256"}
                for r in json.loads(path.read_text())]  # fmt: skip
        path.write_text(json.dumps(rows))


def test_a_decided_round_s_timed_out_proposal_is_replayed_on_resume(tmp_path):
    # adapt goes on past a failed proposal (a candidate that failed); a resume (after a kill,
    # or a runner's retry of a later transient error) must decide the round the same way, or a
    # finished run's kept harness would change after its eval split was read.
    settings = LoopSettings(rounds=1, g=2, select="ratchet", feedback=4, workers=2)
    r1 = run(tmp_path, ScriptedModel(_timeout_in_round_1), settings)
    assert [c.reason.startswith("proposer: ModelTimeout") for c in r1.rounds[0].candidates] == [
        True, False,
    ]  # fmt: skip
    kept = json.loads((tmp_path / "round_01" / "proposals.json").read_text())
    assert [(p["index"], p["error"] is None) for p in kept] == [(0, False), (1, True)]
    again = ScriptedModel([GOOD_EDIT])
    r2 = run(tmp_path, again, settings)
    assert again.calls == []
    assert [asdict(c) for c in r2.rounds[0].candidates] == [
        asdict(c) for c in r1.rounds[0].candidates]  # fmt: skip
    assert r2.final_hash == r1.final_hash


def test_a_failed_proposal_stored_by_an_older_whale_is_asked_again(tmp_path):
    settings = LoopSettings(rounds=1, g=2, select="ratchet", feedback=4, workers=2)
    run(tmp_path, ScriptedModel(_timeout_in_round_1), settings)
    _as_an_older_whale_wrote_them(tmp_path, [1])
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


def test_a_stored_proposal_that_answers_another_prompt_is_asked_again(tmp_path):
    settings = LoopSettings(rounds=1, g=1, select="ratchet", feedback=4, workers=2)
    run(tmp_path, ScriptedModel([GOOD_EDIT]), settings)
    path = tmp_path / "round_01" / "proposals.json"
    path.write_text(json.dumps([{**r, "prompt_sha256": "0" * 64}
                                for r in json.loads(path.read_text())]))  # fmt: skip
    again = ScriptedModel([GOOD_EDIT])  # the same edit: the eval split read keeps its harness
    run(tmp_path, again, settings)
    assert [s.seed for _, s in again.calls] == [1000]


def _resumed_with_another_parent_in_round_2(tmp_path):
    """Round 1's proposal timed out under an older whale (which asked failures again on
    resume) and round 2 kept an edit of the seed. The resume asks round 1 again and keeps its
    edit: round 2's parent, and prompt, are new. Returns both runs and round 2's new proposer."""
    settings = LoopSettings(rounds=2, g=1, select="ratchet", feedback=4, workers=2)
    r1 = run(tmp_path, ScriptedModel(_timeout_in_round_1), settings)
    assert r1.rounds[1].decision.chosen is not None  # round 2 kept its edit of the seed
    _as_an_older_whale_wrote_them(tmp_path, [1, 2])
    again = ScriptedModel([GOOD_EDIT, "no edit"])
    return r1, run(tmp_path, again, settings), again


def test_an_older_whale_s_proposal_written_for_another_parent_is_asked_again(tmp_path):
    # The rows name no prompt; the round's prompt.txt, written before they were asked, does.
    r1, r2, again = _resumed_with_another_parent_in_round_2(tmp_path)
    assert [s.seed for _, s in again.calls] == [1000, 2000]  # round 2 asked again
    assert r2.rounds[0].decision.chosen is not None
    assert r2.rounds[1].candidates[0].reason != r1.rounds[1].candidates[0].reason


class Killed(BaseException):
    """Stands for a kill while the proposer is asked."""


def test_an_older_whale_s_rows_are_not_reused_after_a_resume_killed_while_asking(tmp_path):
    # The first resume rewrites prompt.txt (the new parent's prompt) before asking; killed
    # there, the next resume must not read the older rows as answers to the new prompt.
    settings = LoopSettings(rounds=2, g=1, select="ratchet", feedback=4, workers=2)
    run(tmp_path, ScriptedModel(_timeout_in_round_1), settings)
    _as_an_older_whale_wrote_them(tmp_path, [1, 2])

    def killed_in_round_2(messages, sampling):
        if sampling.seed == 2000:
            raise Killed()
        return GOOD_EDIT

    with pytest.raises(Killed):
        run(tmp_path, ScriptedModel(killed_in_round_2), settings)
    again = ScriptedModel(["no edit"])
    run(tmp_path, again, settings)
    assert [s.seed for _, s in again.calls] == [2000]


def test_a_round_asked_again_leaves_no_diff_of_its_earlier_candidate(tmp_path):
    # The lineage report (whale.analysis.report_lineage) reads candidate_N.diff as the edit of
    # the candidate in candidates.json: a diff of the edit asked before must not stay beside it.
    _, r2, _ = _resumed_with_another_parent_in_round_2(tmp_path)
    (cand,) = r2.rounds[1].candidates
    assert not cand.valid and cand.parent_hash != r2.seed_hash
    assert not (tmp_path / "round_02" / "candidate_0.diff").exists()


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
