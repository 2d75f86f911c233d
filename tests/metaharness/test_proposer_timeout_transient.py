"""A search stopped by a proposer call that got no reply in time is a transient stop for the
experiment runner (whale.experiments.runner: ModelTimeout anywhere in the error's chain), which
resumes it by itself; that the resume asks only the step that failed is
test_loop.py's `test_a_proposer_error_stops_the_search_and_is_asked_again_on_resume`."""

import pytest

from tests.fakes import ScriptedModel
from tests.metaharness.test_loop import run
from whale.experiments.runner import _transient
from whale.metaharness.loop import SearchStopped
from whale.models.base import ModelTimeout


def test_a_proposer_timeout_stops_the_search_as_a_transient_error(tmp_path):
    def proposer(messages, sampling):
        if any(m["role"] == "assistant" for m in messages):  # the session's second step
            raise ModelTimeout("proposer at x: no reply within 600.0 s")
        return 'CALL top {"k": 2}'

    with pytest.raises(SearchStopped, match="proposer failed in session c0100") as got:
        run(tmp_path, [], iterations=1, m=1, agent_model=ScriptedModel(proposer))
    assert isinstance(_transient(got.value), ModelTimeout)


def test_a_proposer_error_that_is_not_transient_stops_the_search_for_good(tmp_path):
    from whale.models.base import ModelNotFound

    def proposer(messages, sampling):
        raise ModelNotFound("proposer: no such model")

    with pytest.raises(SearchStopped) as got:
        run(tmp_path, [], iterations=1, m=1, agent_model=ScriptedModel(proposer))
    assert _transient(got.value) is None
