import dataclasses
import json

import pytest

from tests.fakes import ScriptedModel
from whale.harness import harness_hash
from whale.metaharness import Archive, ArchiveTools, CandidateMeta
from whale.metaharness.agent import AgentConfig, ProposerAgent

SEED = "def run(question, env):\n    reply = env.llm(question)\n    return reply.text.strip()\n"
SUBMIT = (
    'The reply has prose; keep the last number.\nCALL submit {"base": "c0000", "hypothesis": '
    '"take the last number"}\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n'
    "    import re\n    return re.findall(r'-?\\d+', reply.text)[-1]\n>>>>>>> REPLACE\n"
)


@pytest.fixture
def tools(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(CandidateMeta("c0000", None, 0, "seed", harness_hash(SEED), True, score=0.0,
                        accuracy=0.0), SEED)
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    return ArchiveTools(a, "Add two numbers.")


def test_a_session_reads_then_submits_a_valid_candidate(tools, tmp_path):
    model = ScriptedModel(['CALL read {"path": "c0000/harness.py"}', SUBMIT])
    s = ProposerAgent(model, tools).run(1, 0, seed=7, brief="top: c0000 0.0")
    assert s.ended == "submitted" and s.submission.valid and s.submission.base == "c0000"
    assert "re.findall" in s.submission.source
    assert "return reply.text.strip()" in model.calls[1][0][-1]["content"]  # saw the file
    s.save(tmp_path / "sessions/it01_0.json")
    saved = json.loads((tmp_path / "sessions/it01_0.json").read_text())
    assert [c["name"] for c in saved["calls"]] == ["read", "submit"] and saved["tokens"] > 0


def test_a_path_outside_the_archive_is_refused_in_the_agents_view(tools):
    model = ScriptedModel(['CALL read {"path": "../secret.txt"}', SUBMIT])
    s = ProposerAgent(model, tools).run(1, 0, seed=0, brief="")
    assert "outside the archive" in s.messages[3]["content"]
    assert "TOP SECRET" not in json.dumps(s.messages)


def test_a_malformed_reply_is_answered_with_what_was_wrong(tools):
    model = ScriptedModel(["I think we should read the harness", SUBMIT])
    s = ProposerAgent(model, tools).run(1, 0, seed=0, brief="")
    assert "no CALL line" in s.messages[3]["content"] and s.submission.valid


def test_the_step_budget_ends_a_session_without_a_submission(tools):
    model = ScriptedModel(['CALL top {"k": 3}'])
    s = ProposerAgent(model, tools, AgentConfig(max_steps=3)).run(1, 0, seed=0, brief="")
    assert s.ended == "step budget" and s.submission is None and len(model.calls) == 3
    assert "must be a submit" in model.calls[2][0][-1]["content"]  # told before its last reply


def test_an_edit_that_does_not_apply_is_an_invalid_submission_with_its_reason(tools):
    bad = SUBMIT.replace("    return reply.text.strip()\n=", "    return nothing()\n=")
    s = ProposerAgent(ScriptedModel([bad]), tools).run(1, 0, seed=0, brief="")
    assert not s.submission.valid and "not found" in s.submission.reason


def test_the_token_budget_ends_a_session(tools):
    model = ScriptedModel(["CALL top {} " + "word " * 50])
    s = ProposerAgent(model, tools, AgentConfig(max_tokens=60)).run(1, 0, seed=0, brief="")
    assert s.ended == "token budget" and len(model.calls) == 2


def test_the_token_budget_ends_a_session_whose_backend_reports_no_usage(tools):
    class NoUsage(ScriptedModel):
        def chat(self, messages, sampling, timeout=None):  # type: ignore[no-untyped-def]
            return dataclasses.replace(super().chat(messages, sampling, timeout), usage={})

    model = NoUsage(['CALL top {"k": 3}'])  # each reply is charged its cap, step_tokens 40
    cfg = AgentConfig(max_tokens=100, step_tokens=40)
    s = ProposerAgent(model, tools, cfg).run(1, 0, seed=0, brief="")
    assert s.ended == "token budget" and len(model.calls) == 3


def test_the_grammar_lets_submit_search_only_whole_lines_of_the_offered_bases():
    from whale.metaharness.agent import call_grammar

    g = call_grammar({"c0000": SEED, "c0101": "def run(q, env):\n    return 'x'\n"})
    assert '"CALL submit {\\"base\\": \\"c0000\\", \\"hypothesis\\": "' in g
    assert 'b1-l1 ::= "    return \'x\'\\n"' in g
    assert "b0-search ::= b0-s0 | b0-s1 | b0-s2" in g  # one start per line of the seed
    assert "submit ::= sub0 | sub1" in g


def test_a_grammar_backend_is_offered_the_top_bases(tools):
    model = ScriptedModel([SUBMIT])
    model.name = "embedded:test"
    ProposerAgent(model, tools).run(1, 0, seed=0, brief="")
    grammar = model.calls[0][1].grammar
    assert grammar is not None and "b0-l2 ::= \"    return reply.text.strip()\\n\"" in grammar


def test_a_reply_with_a_lone_surrogate_is_saved_and_applied(tools, tmp_path):
    reply = SUBMIT.replace("take the last number", "\ud800 x").replace("import re", "import re  # \udfff")
    s = ProposerAgent(ScriptedModel([reply]), tools).run(1, 0, seed=0, brief="")
    s.save(tmp_path / "s.json")  # raised UnicodeEncodeError before
    assert s.submission.valid and "\ud800" not in s.submission.hypothesis
    assert json.loads((tmp_path / "s.json").read_text())["ended"] == "submitted"


def test_function_calling_against_an_openai_compatible_server(tools):
    from tests.servers import StubServer
    from whale.models import OpenAICompatible

    edits = SUBMIT.split("\n", 2)[2]
    script = [("tool", "read", {"path": "c0000/harness.py"}),
              ("tool", "submit", {"base": "c0000", "hypothesis": "last number", "edits": edits})]
    with StubServer(script) as server:
        model = OpenAICompatible("p", server.base_url, api_key="x")
        agent = ProposerAgent(model, tools)
        assert agent.uses_functions() and not agent.uses_grammar()
        s = agent.run(1, 0, seed=0, brief="")
        sent = server.requests
    assert s.ended == "submitted" and s.submission.valid and "re.findall" in s.submission.source
    assert [t["function"]["name"] for t in sent[0]["tools"]][-1] == "submit"
    # the call is kept in the history as text, and the tool's output follows it
    assert sent[1]["messages"][2]["content"].startswith('CALL read {"path": "c0000/harness.py"}')
    assert "return reply.text.strip()" in sent[1]["messages"][3]["content"]


def test_a_malformed_function_call_is_answered_with_what_was_wrong(tools):
    from tests.servers import StubServer
    from whale.models import OpenAICompatible

    with StubServer([("tool", "rm", {"path": "/"}), ("ok", SUBMIT)]) as server:
        s = ProposerAgent(OpenAICompatible("p", server.base_url, api_key="x"), tools).run(
            1, 0, seed=0, brief="")
    assert "unknown tool 'rm'" in s.messages[3]["content"] and s.submission.valid


def test_the_embedded_backend_gets_the_text_protocol(tools):
    model = ScriptedModel([SUBMIT])
    model.name = "embedded:qwen"
    agent = ProposerAgent(model, tools)
    assert not agent.uses_functions() and agent.uses_grammar()
    agent.run(1, 0, seed=0, brief="")
    assert model.calls[0][1].tools is None
