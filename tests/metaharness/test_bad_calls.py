"""Issue 20: agent calls that ended `whale search` (and every resume of it) with a traceback.

Each is answered with an `error:` reply the agent reads, recorded in its session, and the
search goes on. The exact inputs of the issue are in BAD_CALLS.
"""

import json
import os
import threading

import pytest

from tests.fakes import ScriptedModel
from whale.harness import harness_hash
from whale.metaharness import Archive, ArchiveTools, CandidateMeta, ToolCall
from whale.metaharness.agent import ProposerAgent
from whale.models.base import Completion

SEED = "def run(question, env):\n    reply = env.llm(question)\n    return reply.text.strip()\n"
SUBMIT = (
    'CALL submit {"base": "c0000", "hypothesis": "take the last number"}\n'
    "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    import re\n    return re.findall(r'-?\\d+', reply.text)[-1]\n>>>>>>> REPLACE\n"
)
DEEP = "[" * 5000 + "]" * 5000
# The inputs, as the text protocol carries them (the escape is JSON's, six characters).
BAD_CALLS = {
    "through a file": 'CALL read {"path": "c0000/harness.py/run"}',
    "name too long": 'CALL read {"path": "c0000/' + "a" * 300 + '"}',
    "lone surrogate": 'CALL read {"path": "\\ud800"}',
    "nested 5,000 deep": 'CALL read {"path": ' + DEEP + "}",
    "grep a FIFO": 'CALL grep {"pattern": "x", "path": "pipe"}',
}


@pytest.fixture
def tools(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(CandidateMeta("c0000", None, 0, "seed", harness_hash(SEED), True, score=0.0,
                        accuracy=0.0), SEED)
    os.mkfifo(tmp_path / "archive/pipe")
    os.mkfifo(tmp_path / "archive/c0000/pipe")
    return ArchiveTools(a, "Add two numbers.")


def within(seconds, fn):
    """fn() run in a thread; fails the test (not hangs it) when it blocks, as on a FIFO."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"blocked for over {seconds} s"
    return out[0]


@pytest.mark.parametrize("path", ["c0000/harness.py/run", "c0000/" + "a" * 300, "\ud800"])
def test_a_path_the_file_system_refuses_is_an_error_reply(tools, path):
    # NotADirectoryError, OSError "File name too long", UnicodeEncodeError before
    out = tools.call(ToolCall("read", {"path": path}))
    assert out.startswith("error:") and str(tools.root) not in out


@pytest.mark.parametrize("name", ["grep", "read", "list"])
@pytest.mark.parametrize("path", ["pipe", "c0000/pipe"])
def test_a_fifo_is_refused_and_never_opened(tools, name, path):
    out = within(10, lambda: tools.call(ToolCall(name, {"pattern": "x", "path": path})))
    assert out.startswith("error:") and "not a" in out


def test_grep_of_the_whole_archive_skips_fifos(tools):
    out = within(10, lambda: tools.call(ToolCall("grep", {"pattern": "reply.text"})))
    assert "c0000/harness.py:3" in out and "pipe" not in out


def test_a_candidate_record_replaced_by_a_fifo_is_refused_by_failures(tools, tmp_path):
    (tmp_path / "archive/c0000/outcomes.jsonl").unlink()
    os.mkfifo(tmp_path / "archive/c0000/outcomes.jsonl")
    out = within(10, lambda: tools.call(ToolCall("failures", {"id": "c0000"})))
    assert out.startswith("error:") and "not a regular file" in out


def test_a_tool_error_whale_did_not_foresee_is_an_error_reply(tools):
    def boom(args):
        raise KeyError("question_id")

    tools.top = boom
    assert tools.call(ToolCall("top", {})) == "error: top failed (KeyError: 'question_id')"


@pytest.mark.parametrize("kind", list(BAD_CALLS))
def test_each_bad_text_call_is_answered_and_recorded_in_the_session(tools, kind):
    s = ProposerAgent(ScriptedModel([BAD_CALLS[kind], SUBMIT]), tools).run(1, 0, seed=0, brief="")
    assert s.calls[0]["output"].startswith("error:"), s.calls[0]
    assert s.messages[3]["content"] == "RESULT:\n" + s.calls[0]["output"]  # what the agent read
    assert s.ended == "submitted" and s.submission.valid
    json.dumps(s.messages, ensure_ascii=False).encode("utf-8")  # the session can be written


def test_the_json_escaped_surrogate_is_cleaned_after_decoding(tools):
    s = ProposerAgent(ScriptedModel([BAD_CALLS["lone surrogate"], SUBMIT]), tools).run(
        1, 0, seed=0, brief="")
    assert s.calls[0]["args"] == {"path": "?"} and "does not exist" in s.calls[0]["output"]


class FunctionCalls:
    """A function-calling model: each reply is (name, arguments as raw JSON text)."""

    name = "functions"

    def __init__(self, script):
        self.script, self.calls = script, []

    def chat(self, messages, sampling, timeout=None):
        self.calls.append(messages)
        name, raw = self.script[min(len(self.calls), len(self.script)) - 1]
        return Completion("", "tool_calls", {"completion_tokens": 5},
                          tool_calls=[{"name": name, "arguments": raw}])


@pytest.mark.parametrize("raw", ['{"path": ' + DEEP + "}", '{"path": "\\ud800"}',
                                 '{"path": {"a": 1}}', "[1]"])
def test_bad_function_call_arguments_are_answered(tools, raw):
    edits = SUBMIT.split("\n", 1)[1]
    model = FunctionCalls([("read", raw), ("submit", json.dumps(
        {"base": "c0000", "hypothesis": "h", "edits": edits}))])
    s = ProposerAgent(model, tools).run(1, 0, seed=0, brief="")
    assert s.calls[0]["output"].startswith("error:") and s.submission.valid
