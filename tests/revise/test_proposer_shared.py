"""The G proposals of a round in one request where the proposer's backend shares the prompt
among samples (issue 25): proposal i is still the sample of seed + i, a failure fails the G,
and a resumed round asks for the runs of consecutive proposals it lacks."""

from __future__ import annotations

import json
import threading

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, SumTask
from whale.harness import Runtime
from whale.models.base import Completion, ModelError, ModelTimeout
from whale.revise.loop import LoopSettings, adapt
from whale.revise.proposer import ProposalsFailed, Proposer
from whale.runs import OutcomeStore
from whale.tasks import SealedSplit


class Sharing(ScriptedModel):
    """A scripted proposer whose backend asks for G samples in one request (`chat_n`)."""

    def __init__(self, replies, fail_seeds=(), fail_batch=False):
        super().__init__(replies)
        self.batches: list[tuple[int, int]] = []
        self.fail_seeds, self.fail_batch = set(fail_seeds), fail_batch
        self._batch_lock = threading.Lock()

    def shares_prompt(self, sampling):
        return sampling.temperature > 0

    def chat(self, messages, sampling, timeout=None):
        if sampling.seed in self.fail_seeds:
            raise ModelTimeout("no reply within 600.0 s")
        return super().chat(messages, sampling, timeout)

    def chat_n(self, messages, sampling, n, timeout=None):
        with self._batch_lock:
            self.batches.append((sampling.seed, n))
        if self.fail_batch:
            raise ModelError("server gone")
        return [
            Completion(f"{GOOD_EDIT}\n(seed {sampling.seed + i})", "stop",
                       {"completion_tokens": 10 + i})
            for i in range(n)
        ]  # fmt: skip


def test_the_g_proposals_are_one_request_and_keep_their_seeds():
    model = Sharing([GOOD_EDIT])
    out = Proposer(model).propose("prompt", 4, 100)
    assert model.batches == [(100, 4)] and model.calls == []
    assert [p.seed for p in out] == [100, 101, 102, 103]
    assert [p.text.endswith(f"(seed {p.seed})") for p in out] == [True] * 4
    assert [p.tokens for p in out] == [10, 11, 12, 13]


def test_a_failed_request_fails_each_of_the_g():
    out = Proposer(Sharing([GOOD_EDIT], fail_batch=True)).propose("prompt", 3, 7)
    assert [(p.seed, p.finish_reason) for p in out] == [(7, "error"), (8, "error"), (9, "error")]
    assert all("server gone" in (p.error or "") for p in out)


def test_a_greedy_proposer_asks_one_call_per_proposal():
    from whale.revise.proposer import ProposerConfig

    model = Sharing([GOOD_EDIT])
    Proposer(model, ProposerConfig(temperature=0.0)).propose("prompt", 3, 7)
    assert model.batches == [] and sorted(s.seed for _, s in model.calls) == [7, 8, 9]


def _run(tmp_path, proposer, settings):
    task = SumTask()
    qs = task.questions()
    store = OutcomeStore(tmp_path)
    try:
        return adapt(
            task, SEED, qs[:10], qs[:10], SealedSplit(qs[10:20], tmp_path / "eval_read.json"),
            Runtime(model=ScriptedModel(["5"])), Proposer(proposer), store, settings,
        )  # fmt: skip
    finally:
        store.close()


# A round that stops on its failed proposals (evaluate's ratchet) asks them again on resume;
# one that goes on (adapt) keeps them as failed candidates (tests/revise/test_resume.py).
STOPPING = LoopSettings(rounds=1, g=4, select="ratchet", feedback=4, workers=2,
                        stop_on_failed_proposal=True)  # fmt: skip


def test_a_resumed_round_asks_each_run_of_missing_proposals_at_once(tmp_path):
    settings = STOPPING
    # First run: a proposer that shares nothing, whose proposals 1, 2 (seeds 1001, 1002) time out.
    first = Sharing([GOOD_EDIT], fail_seeds={1001, 1002})
    first.shares_prompt = lambda sampling: False
    with pytest.raises(ProposalsFailed):
        _run(tmp_path, first, settings)
    kept = json.loads((tmp_path / "round_01" / "proposals.json").read_text())
    assert [p["index"] for p in kept] == [0, 3]
    again = Sharing([GOOD_EDIT])
    _run(tmp_path, again, settings)
    assert again.batches == [(1001, 2)] and again.calls == []


def test_a_resumed_round_asks_lone_missing_proposals_alone(tmp_path):
    settings = STOPPING
    first = Sharing([GOOD_EDIT], fail_seeds={1001, 1003})
    first.shares_prompt = lambda sampling: False
    with pytest.raises(ProposalsFailed):
        _run(tmp_path, first, settings)
    again = Sharing([GOOD_EDIT])
    _run(tmp_path, again, settings)
    assert again.batches == [] and sorted(s.seed for _, s in again.calls) == [1001, 1003]
