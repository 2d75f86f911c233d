"""The proposals of a teacher or evaluate context: the missing ones asked in one request per
run of consecutive indices (the embedded server decodes them together), each run stored as
it comes; a failed one asked again on resume, and a timeout one that an unattended runner
resumes by itself (it stopped the Harness Learning experiment once: one 0.5B proposal of 8
got no reply within 600 s)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.revise.conftest import GOOD_EDIT, SEED
from tests.revise.test_proposer_shared import Sharing
from whale.experiments.runner import _transient
from whale.models.base import ModelTimeout, failure_cause
from whale.revise.proposer import ProposalsFailed, Proposer
from whale.train.proposer.evaluate import EvaluateSettings, _single_step
from whale.train.proposer.teacher import stored_proposals

CTX = SimpleNamespace(id="rg:x/h/evaluate.0", prompt="x_t", parent_source=SEED)


def _stored(path):
    return [row["index"] for row in json.loads(path.read_text())]


def test_the_missing_proposals_are_one_request_with_their_seeds(tmp_path):
    model = Sharing([GOOD_EDIT])
    out = stored_proposals(tmp_path / "p.json", Proposer(model), CTX, 8, 1000)
    assert model.batches == [(1000, 8)] and model.calls == []
    assert [p.seed for p in out] == list(range(1000, 1008))
    assert _stored(tmp_path / "p.json") == list(range(8))


def test_a_resume_asks_each_run_of_missing_proposals_at_once(tmp_path):
    path = tmp_path / "p.json"
    stored_proposals(path, Proposer(Sharing([GOOD_EDIT])), CTX, 8, 1000)
    rows = [r for r in json.loads(path.read_text()) if r["index"] in (0, 3)]
    path.write_text(json.dumps(rows))
    again = Sharing([GOOD_EDIT])
    out = stored_proposals(path, Proposer(again), CTX, 8, 1000)
    assert sorted(again.batches) == [(1001, 2), (1004, 4)]
    assert [p.seed for p in out] == list(range(1000, 1008)) and _stored(path) == list(range(8))


def test_a_failed_proposal_is_not_stored_and_is_asked_again(tmp_path):
    path = tmp_path / "p.json"
    first = Sharing([GOOD_EDIT], fail_seeds={1002})
    first.shares_prompt = lambda sampling: False  # one call each: only seed 1002 fails
    out = stored_proposals(path, Proposer(first), CTX, 4, 1000)
    assert [p.error is None for p in out] == [True, True, False, True]
    assert _stored(path) == [0, 1, 3]
    again = Sharing([GOOD_EDIT])
    stored_proposals(path, Proposer(again), CTX, 4, 1000)
    assert again.batches == [] and [s.seed for _, s in again.calls] == [1002]


def test_an_evaluate_context_whose_proposal_timed_out_stops_as_a_transient_error(tmp_path):
    model = Sharing([GOOD_EDIT], fail_seeds={1})
    model.shares_prompt = lambda sampling: False
    es = EvaluateSettings(g=2, seed=0)
    with pytest.raises(ProposalsFailed, match="run evaluate again") as err:
        _single_step("grpo", Proposer(model), CTX, 0, None, es, tmp_path)  # type: ignore[arg-type]
    assert isinstance(_transient(err.value), ModelTimeout)


def test_only_a_timeout_or_an_unreachable_server_is_a_transient_cause():
    assert isinstance(failure_cause(["ValueError: x", "ModelTimeout: no reply"]), ModelTimeout)
    assert failure_cause(["ModelError: server gone", "PartialBatch: x"]) is None


def test_proposals_lost_with_a_batch_that_timed_out_are_named_by_the_timeout(tmp_path):
    from whale.models.base import PartialBatch

    class Partial(Sharing):
        def chat_n(self, messages, sampling, n, timeout=None):  # type: ignore[no-untyped-def]
            done = super().chat_n(messages, sampling, 2)
            raise PartialBatch("no reply (after 2 of 4 samples)", done) from ModelTimeout("x")

    out = stored_proposals(tmp_path / "p.json", Proposer(Partial([GOOD_EDIT])), CTX, 4, 0)
    assert [p.error is None for p in out] == [True, True, False, False]
    assert failure_cause([str(p.error) for p in out[2:]]) is not None
    assert _stored(tmp_path / "p.json") == [0, 1]


def test_a_failed_proposal_stored_by_an_older_whale_is_asked_again(tmp_path):
    # whale before this change wrote a failed proposal into the file with the next success,
    # and a resume then read the failure back for ever ("run evaluate again" did not help).
    path = tmp_path / "p.json"
    stored_proposals(path, Proposer(Sharing([GOOD_EDIT])), CTX, 3, 1000)
    rows = json.loads(path.read_text())
    rows[1].update(text="", finish_reason="error", error="ModelTimeout: no reply", tokens=0)
    path.write_text(json.dumps(rows))
    again = Sharing([GOOD_EDIT])
    out = stored_proposals(path, Proposer(again), CTX, 3, 1000)
    assert [s.seed for _, s in again.calls] == [1001] and all(p.error is None for p in out)


def test_proposals_lost_with_a_cached_batch_that_timed_out_are_named_by_the_timeout(tmp_path):
    """The response cache wraps the backend's PartialBatch in its own."""
    from whale.models.base import PartialBatch

    class Wrapped(Sharing):
        def chat_n(self, messages, sampling, n, timeout=None):  # type: ignore[no-untyped-def]
            done = super().chat_n(messages, sampling, 1)
            try:
                raise PartialBatch("inner", done) from ModelTimeout("no reply")
            except PartialBatch as inner:
                raise PartialBatch("outer", done) from inner

    out = Proposer(Wrapped([GOOD_EDIT])).propose("p", 3, 0)
    assert [str(p.error).split(":")[0] for p in out[1:]] == ["ModelTimeout"] * 2


def test_an_evaluate_context_whose_prompt_does_not_fit_reads_a_failed_edit(tmp_path):
    from whale.models.base import ContextOverflow

    class Small:
        name = "small"

        def chat(self, messages, sampling, timeout=None):
            raise ContextOverflow("small: prompt does not fit")

    es = EvaluateSettings(g=2, seed=0)
    plan = _single_step("base", Proposer(Small()), CTX, 0, None, es, tmp_path)  # type: ignore[arg-type]
    assert plan.sources == {} and plan.applied == 0
    assert all(r.startswith("proposer: ContextOverflow") for r in plan.reasons.values())
    assert sorted(plan.reasons) == [0, 1]
