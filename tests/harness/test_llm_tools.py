"""Multi-turn tool calling through `env.llm` (issue 23), through the real jail and broker: a
harness offers OpenAI tool schemas, gets the model's calls, runs them, sends the results back
as `role: "tool"` messages and calls again. Every request is checked before it is sent;
malformed ones are error replies, out-of-range ones are also `refused` events; the trajectory
keeps the tools offered, the calls made and the tool messages."""

from __future__ import annotations

import json

import pytest

from tests.conftest import require_model
from whale.harness import Runtime, Trajectory
from whale.harness.calls import MAX_MESSAGE_CALLS, MAX_TOOLS, SCHEMA_BOUND, TOOLS_CHARS, BadCall
from whale.models.base import Completion, Sampling
from whale.models.embedded import EmbeddedLlama

TOOLS = [{"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]  # fmt: skip

# The standard loop: call with tools, run each call, send back a `tool` message, call again.
LOOP = f"""
TOOLS = {TOOLS!r}

def multiply(a, b):
    return a * b

def run(question, env):
    messages = [{{"role": "user", "content": question}}]
    for _ in range(4):
        reply = env.llm(messages, tools=TOOLS, max_tokens=64)
        if not reply.tool_calls:
            return reply.text
        messages.append(reply.message)
        for call in reply.tool_calls:
            result = multiply(**call["arguments"])
            messages.append({{"role": "tool", "tool_call_id": call["id"], "content": str(result)}})
    return "no answer"
"""


class ToolModel:
    """Calls `multiply` until the conversation holds a tool result, then answers with it.
    Records what it was sent."""

    name = "tool-model"

    def __init__(self, arguments: str = '{"a": 6, "b": 7}') -> None:
        self.arguments = arguments
        self.calls: list[tuple[list[dict], object]] = []

    def chat(self, messages, sampling, timeout=None):
        self.calls.append((messages, sampling))
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        if messages[-1]["role"] == "tool":
            return Completion(f"The answer is {messages[-1]['content']}.", "stop", usage)
        call = {"id": "backend-id", "name": "multiply", "arguments": self.arguments}
        return Completion("", "tool_calls", usage, tool_calls=[call])


class BareModel(ToolModel):
    """Writes the call as bare JSON, read by whale out of the text (models.base.text_call)."""

    def chat(self, messages, sampling, timeout=None):
        c = super().chat(messages, sampling, timeout)
        if c.tool_calls:
            c.raw_text = '{"name": "multiply", "arguments": ' + self.arguments + "}"
        return c


def run(model, source: str, **kw) -> Trajectory:
    rt = Runtime(model=model, **kw)
    try:
        return rt.run(source, "What is 6 times 7?", "q")
    finally:
        rt.close()


def test_the_standard_loop_runs_to_the_answer():
    model = ToolModel()
    t = run(model, LOOP)
    assert t.status == "ok", t.error
    assert t.answer == "The answer is 42." and len(model.calls) == 2


def test_the_second_call_carries_the_call_and_its_result():
    model = ToolModel()
    run(model, LOOP)
    sent, sampling = model.calls[1]
    assert sent[1] == {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_0_0", "type": "function",
        "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}]}  # fmt: skip
    assert sent[2] == {"role": "tool", "content": "42", "tool_call_id": "call_0_0"}
    assert json.loads(sampling.tools) == TOOLS


def test_the_trajectory_keeps_tools_calls_and_results():
    t = run(ToolModel(), LOOP)
    first, second = t.model_calls()
    assert first.tools == TOOLS and second.tools == TOOLS
    assert first.tool_calls == [{"id": "call_0_0", "name": "multiply",
                                 "arguments": '{"a": 6, "b": 7}'}]  # fmt: skip
    assert first.finish_reason == "tool_calls" and second.tool_calls is None
    assert second.messages[2]["tool_call_id"] == "call_0_0"
    assert "tools" not in first.params  # recorded once, as `tools`
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.model_calls()[0].tool_calls == first.tool_calls
    assert back.model_calls()[0].tools == TOOLS


def test_a_call_read_out_of_the_text_keeps_what_the_model_wrote():
    t = run(BareModel(), LOOP)
    assert t.status == "ok" and t.answer == "The answer is 42.", t.error
    first, second = t.model_calls()
    assert first.raw_text == '{"name": "multiply", "arguments": {"a": 6, "b": 7}}'
    assert first.text == "" and second.raw_text is None


def test_a_version_2_record_reads_with_no_tools():
    t = run(ToolModel(), LOOP)
    old = json.loads(json.dumps(t.to_dict()))
    old["version"] = 2
    for e in old["events"]:
        e.pop("tools", None)
        e.pop("tool_calls", None)
    back = Trajectory.from_dict(old)
    assert back.version == t.version == 3
    assert all(c.tools is None and c.tool_calls is None for c in back.model_calls())


# Returns what env.llm gave: the reply's tool calls and message, as JSON.
SHOW = f"""
import json
TOOLS = {TOOLS!r}

def run(question, env):
    r = env.llm(question, tools=TOOLS)
    return json.dumps({{"calls": r.tool_calls, "message": r.message, "text": r,
                       "finish": r.finish_reason}})
"""


def shown(arguments: str) -> dict:
    t = run(ToolModel(arguments), SHOW)
    assert t.status == "ok" and t.answer is not None, t.error
    return dict(json.loads(t.answer))


def test_the_harness_gets_parsed_arguments_and_the_message_to_append():
    r = shown('{"a": 6, "b": 7}')
    assert r["calls"] == [{"id": "call_0_0", "name": "multiply", "arguments": {"a": 6, "b": 7}}]
    assert r["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 6, "b": 7}'
    assert r["finish"] == "tool_calls" and r["text"] == ""


@pytest.mark.parametrize("raw", ["{not json", "[6, 7]", "42", '{"a": ' * 40 + "1" + "}" * 40,
                                 "[" * 3000])  # fmt: skip
def test_arguments_that_are_no_json_object_reach_the_harness_as_text(raw):
    """What the model wrote is untrusted: anything but a JSON object of at most 32 levels is
    handed over as the text it is, and the run goes on."""
    assert shown(raw)["calls"][0]["arguments"] == raw


def test_a_reply_without_calls_has_an_empty_list_and_a_plain_message():
    src = "def run(q, env):\n    r = env.llm(q)\n    return repr((r.tool_calls, r.message))\n"
    t = run(ToolModel(), src.replace("env.llm(q)", "env.llm([{'role': 'tool', 'content': 'x'}])"))
    assert t.status == "ok", t.error
    assert t.answer == repr(([], {"role": "assistant", "content": "The answer is x."}))


def test_a_bare_tool_message_is_still_accepted():
    """Harnesses fed tool output back as `{"role": "tool", "content": ...}` before tool
    calling existed; the embedded backend gives such a message an id (server_messages)."""
    model = ToolModel()
    src = ("def run(q, env):\n"
           "    return env.llm([{'role': 'user', 'content': q}, {'role': 'tool', 'content': '1'}])\n")  # fmt: skip
    t = run(model, src)
    assert t.status == "ok" and model.calls[0][0][1] == {"role": "tool", "content": "1"}


def test_tool_choice_is_passed_and_recorded():
    model = ToolModel()
    src = SHOW.replace("tools=TOOLS)", "tools=TOOLS, tool_choice='required')")
    t = run(model, src)
    assert t.status == "ok", t.error
    assert model.calls[0][1].tool_choice == "required"
    assert t.model_calls()[0].params["tool_choice"] == "required"


# Sends one llm request and returns the error the harness got ("sent" when none).
ASK = """
TOOLS = {tools}

def run(q, env):
    try:
        env._link.call("llm", messages={messages}, **{extra})
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
    return "sent"
"""
USER = [{"role": "user", "content": "hi"}]
CALLED = [
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": "{}"}}
        ],
    },
]


def ask(messages=USER, extra="{}", tools=TOOLS):
    model = ToolModel()
    t = run(model, ASK.format(tools=repr(tools), messages=repr(messages), extra=extra))
    assert t.status == "ok", t.error
    return t, model


def refusals(t):
    return [e for e in t.events if e["kind"] == "refused"]


BIG = {"type": "function", "function": {"name": "f", "description": "x" * TOOLS_CHARS}}


def schema(**prop) -> list:
    return [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": prop}}}}]  # fmt: skip


@pytest.mark.parametrize("tools, why", [
    ([{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)],
     f"at most {MAX_TOOLS}"),
    ([BIG], f"at most {TOOLS_CHARS:,}"),
    # a bound of n becomes ~n grammar rules in llama.cpp's server, shared by every run
    (schema(type="string", maxLength=10**9), "maxLength"),
    (schema(type="array", minItems=SCHEMA_BOUND + 1), "minItems"),
    (schema(type="string", pattern="^a{2,1000000}$"), "pattern repeats"),
])  # fmt: skip
def test_tools_over_a_cap_are_refused_recorded_and_not_sent(tools, why):
    t, model = ask(extra="{'tools': TOOLS}", tools=tools)
    assert t.answer.startswith("ToolError: llm(tools=)") and why in t.answer, t.answer
    assert model.calls == [] and [e["op"] for e in refusals(t)] == ["llm"]


def test_a_message_with_too_many_tool_calls_is_refused():
    calls = [{"id": f"c{i}", "type": "function",
              "function": {"name": "multiply", "arguments": "{}"}}
             for i in range(MAX_MESSAGE_CALLS + 1)]  # fmt: skip
    t, model = ask([*USER, {"role": "assistant", "content": "", "tool_calls": calls}])
    assert f"at most {MAX_MESSAGE_CALLS}" in t.answer and model.calls == []
    assert len(refusals(t)) == 1


def test_a_schema_bound_within_the_cap_is_sent():
    t, model = ask(extra="{'tools': TOOLS}", tools=schema(type="string", maxLength=SCHEMA_BOUND))
    assert t.answer == "sent" and len(model.calls) == 1


@pytest.mark.parametrize("messages, extra, why", [
    (USER, "{'tools': 'multiply'}", "llm(tools=): must be a list"),
    (USER, "{'tools': []}", "llm(tools=): must be a list"),
    (USER, "{'tools': [{'type': 'function', 'function': {'name': 'has space'}}]}", "name"),
    (USER, "{'tools': TOOLS + TOOLS}", "unique"),
    (USER, "{'tools': [{'type': 'retrieval'}]}", "tool 0 must be"),
    (USER, "{'tools': [{'function': {'name': 'f', 'parameters': 'x'}}]}", "parameters must be"),
    (USER, "{'tools': TOOLS, 'tool_choice': 'maybe'}", "tool_choice='maybe'"),
    (USER, "{'tool_choice': 'auto'}", "needs tools="),
    ([{"role": "user", "content": "hi", "tool_calls": []}], "{}", "only an assistant"),
    ([{"role": "user", "content": "hi", "tool_call_id": "c1"}], "{}", "only a tool"),
    ([*USER, {"role": "tool", "tool_call_id": "nope", "content": "1"}], "{}", "names no tool call"),
    ([*CALLED, {"role": "tool", "tool_call_id": "c2", "content": "1"}], "{}", "names no tool call"),
    ([*USER, {"role": "assistant", "content": None, "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "{}"}}]}], "{}", "id None"),
    ([*CALLED, CALLED[1]], "{}", "unique in the conversation"),
    ([*USER, {"role": "assistant", "content": None, "tool_calls": [{"id": "c1",
      "function": {"name": "f", "arguments": 7}}]}], "{}", "arguments must be"),
    ([*USER, {"role": "assistant", "content": None, "tool_calls": "call"}], "{}", "must be a list"),
    ([*USER, {"role": "assistant", "content": None}], "{}", "string 'content'"),
])  # fmt: skip
def test_a_malformed_tool_request_is_an_error_reply_and_not_sent(messages, extra, why):
    t, model = ask(messages, extra)
    assert t.answer.startswith("ToolError: llm(") and why in t.answer, t.answer
    assert model.calls == []


def test_a_history_in_whales_flat_form_with_object_arguments_is_sent_as_openais():
    flat = [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "name": "multiply", "arguments": {"a": 1, "b": 2}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"}]  # fmt: skip
    t, model = ask(flat)
    assert t.answer == "sent"
    assert model.calls[0][0][1]["tool_calls"] == [{"id": "c1", "type": "function", "function": {
        "name": "multiply", "arguments": '{"a": 1, "b": 2}'}}]  # fmt: skip


@pytest.mark.parametrize("description, sent", [(3000, True), (5000, False)])
def test_the_tools_count_toward_the_prompt_bound(description, sent):
    model = ToolModel()
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * description}}]
    src = ASK.format(tools=repr(tools), messages=repr(USER), extra="{'tools': TOOLS}")
    t = run(model, src, prompt_chars=4000)
    assert (t.answer == "sent") is sent and len(model.calls) == int(sent), t.answer
    assert sent or "ContextOverflow" in t.answer


def test_a_backend_that_cannot_call_tools_says_so_to_the_harness(tmp_path):
    """The python embedded server refuses tools= (never drops them): the harness gets the
    error, the failed call is on the trajectory, the run goes on."""
    model = EmbeddedLlama(tmp_path / "absent.gguf", server="python")
    t = run(model, ASK.format(tools=repr(TOOLS), messages=repr(USER), extra="{'tools': TOOLS}"))
    assert t.status == "ok" and "native llama-server" in t.answer
    assert t.model_calls()[0].finish_reason == "error" and t.model_calls()[0].tools == TOOLS
    assert not model.started


# -- on the embedded model -------------------------------------------------------------------

E2E = f"""
TOOLS = {TOOLS!r}

def run(question, env):
    messages = [{{"role": "system", "content": "Use the multiply tool for arithmetic."}},
                {{"role": "user", "content": question}}]
    reply = env.llm(messages, tools=TOOLS, max_tokens=64, temperature=0)
    messages.append(reply.message)
    for call in reply.tool_calls:
        try:
            result = int(call["arguments"]["a"]) * int(call["arguments"]["b"])
        except Exception as e:
            result = "error: " + repr(e)
        messages.append({{"role": "tool", "tool_call_id": call["id"], "content": str(result)}})
    final = env.llm(messages, tools=TOOLS, max_tokens=32, temperature=0)
    return final.text
"""


@pytest.mark.model
@pytest.mark.slow
def test_a_tool_calling_harness_on_the_embedded_model_and_its_sft_examples():
    """qwen-coder-0.5b on the default embedded server (native llama-server, --jinja): the
    model calls the tool (it writes the call as bare JSON, read by whale: models.base.
    text_call), gets the result as a tool message, answers; the server renders the tool
    conversation as transformers does (its /apply-template), and every call of the run is an
    SFT example (the rebuilt ids match the server's counts), the tool result masked."""
    import httpx
    from transformers import AutoTokenizer

    from whale.models.base import template_messages
    from whale.train.data import IGNORE, trajectory_examples

    path = require_model("qwen-coder-0.5b")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = EmbeddedLlama(path, alias="qwen-coder-0.5b", n_ctx=2048, slots=1, threads=1)
    rt = Runtime(model=model)
    try:
        t = rt.run(E2E, "What is 1234 times 5678?", "e2e")
        assert t.status == "ok", (t.error, t.events)
        first, second = t.model_calls()
        base = model._client.base_url.removesuffix("/v1")
        r = httpx.post(f"{base}/apply-template", timeout=60,
                       json={"messages": second.messages, "tools": second.tools})  # fmt: skip
    finally:
        rt.close()
        model.close()
    assert model.kind == "native"
    print("call:", first.tool_calls, repr(first.raw_text), first.usage, "| answer:",
          repr(t.answer), second.finish_reason, second.usage)  # fmt: skip
    ours = tok.apply_chat_template(template_messages(second.messages), tools=second.tools,
                                   add_generation_prompt=True, tokenize=False)  # fmt: skip
    print("apply-template:", r.status_code, r.text[-600:], "\nours:", ours[-600:])
    assert r.status_code == 200 and r.json()["prompt"] == ours
    assert first.finish_reason == "tool_calls" and first.tool_calls[0]["name"] == "multiply"
    assert set(json.loads(first.tool_calls[0]["arguments"])) == {"a", "b"}
    assert second.messages[-1]["role"] == "tool"
    assert second.messages[-1]["tool_call_id"] == "call_0_0"
    examples, skips = trajectory_examples(t, tok)
    print("skips:", skips)
    assert skips == [] and len(examples) == 2, skips
    masked = tok.decode([x for x, y in zip(examples[1].input_ids, examples[1].labels,
                                           strict=True) if y == IGNORE])  # fmt: skip
    trained = [tok.decode([y for y in e.labels if y != IGNORE]) for e in examples]
    print("trained:", trained)
    result = second.messages[-1]["content"]
    assert f"<tool_response>\n{result}\n</tool_response>" in masked
    written = first.raw_text if first.raw_text is not None else "<tool_call>"
    assert trained[0].startswith(written) and trained[0].endswith("<|im_end|>")
    assert trained[1].endswith("<|im_end|>") and "<tool_response>" not in trained[1]


# Tool shapes an OpenAI client sends that llama.cpp's server rewrites when it renders them:
# `strict` (the Agents SDK sets it), no description, no parameters, keys in another order.
ODD_TOOLS = [
    {"type": "function", "function": {"name": "calc", "description": "d", "strict": True,
                                      "parameters": {"type": "object", "properties": {},
                                                     "additionalProperties": False}}},
    {"function": {"parameters": {"type": "object"}, "name": "bare"}, "type": "function"},
    {"type": "function", "function": {"name": "nothing", "strict": False}},
]  # fmt: skip


def test_recorded_tools_are_the_form_llama_cpp_renders():
    from whale.harness.calls import check_tools

    text = check_tools(ODD_TOOLS)
    assert text is not None
    assert [t["function"] for t in json.loads(text)] == [
        {"name": "calc", "description": "d",
         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
        {"name": "bare", "description": "", "parameters": {"type": "object"}},
        {"name": "nothing", "description": "", "parameters": {}},
    ]  # fmt: skip


# Numbers in a schema: llama.cpp's template engine writes a float with 6 significant digits
# and no ".0" (1.0 -> 1, 3.14159265 -> 3.14159, 1e300 -> 1e+300) and an integer as a signed
# 64-bit one (2**64 - 1 -> -1), where transformers writes Python's repr: a pydantic schema's
# `"maximum": 1.0` or `"default": 0.7` made every call offering it a template mismatch.
NUMBER_TOOLS = [{"type": "function", "function": {"name": "sample", "parameters": {
    "type": "object", "properties": {
        "temperature": {"type": "number", "minimum": 0.0, "maximum": 1.0, "default": 0.7},
        "top_p": {"type": "number", "exclusiveMaximum": 1.000001, "multipleOf": 0.05},
        "scale": {"type": "number", "minimum": 1e-7, "maximum": 1234567.0, "default": 3.14159265},
        "huge": {"type": "number", "maximum": 1e300},
        "n": {"type": "integer", "minimum": -3, "maximum": 10},
        "ok": {"type": "boolean", "default": True}}}}}]  # fmt: skip


def test_recorded_numbers_are_ones_llama_cpp_and_python_write_alike():
    from whale.harness.calls import check_tools

    props = json.loads(check_tools(NUMBER_TOOLS) or "")[0]["function"]["parameters"]["properties"]
    text = {k: json.dumps(v) for k, v in props.items()}  # 1 and 1.0 are equal, not alike
    assert text["temperature"] == '{"type": "number", "minimum": 0, "maximum": 1, "default": 0.7}'
    assert text["top_p"] == '{"type": "number", "exclusiveMaximum": 1, "multipleOf": 0.05}'
    assert text["scale"] == ('{"type": "number", "minimum": 1e-07, "maximum": 1234567, '
                             '"default": 3.14159}')  # fmt: skip
    assert text["huge"] == '{"type": "number", "maximum": 1e+300}'
    assert text["n"] == '{"type": "integer", "minimum": -3, "maximum": 10}'
    assert text["ok"] == '{"type": "boolean", "default": true}'
    for v in (float("nan"), float("inf"), 2**63, -(2**63) - 1, 5e-324):
        bad = [{"type": "function", "function": {"name": "f", "parameters": {"maximum": v}}}]
        with pytest.raises(BadCall, match="maximum"):
            check_tools(bad)


HISTORY_ARGS = ['{"x": 1.0, "y": 37.7749295, "n": 3}', '{"x":2.5,"s":"<&>"}',
                '{"big": 12345678901234567890}', '[1.0]', 'not json']  # fmt: skip


def _with_history(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"}]  # fmt: skip


def test_a_tool_calls_arguments_are_sent_with_numbers_both_write_alike():
    """The arguments of an earlier tool call (the model's own reply, sent back) are rendered
    from the parsed object by both the server and transformers: their numbers follow the rule
    of the tools' ones; a text whose numbers need no change is sent as it is."""
    from whale.harness.calls import check_messages

    def sent(arguments: str) -> str:
        return check_messages(_with_history(arguments))[1]["tool_calls"][0]["function"][
            "arguments"]  # fmt: skip

    assert sent(HISTORY_ARGS[0]) == '{"x": 1, "y": 37.7749, "n": 3}'
    assert [sent(a) for a in HISTORY_ARGS[1:]] == HISTORY_ARGS[1:]  # as given


@pytest.mark.model
def test_the_native_server_renders_recorded_tools_as_transformers_does():
    """What a run records of odd tools (check_tools) renders, through the native server's
    template (/apply-template) and through transformers, to one prompt: the weight phase's
    count check passes on calls that offered them (an Agents SDK run's calls were all skipped
    as template mismatches while `strict` was recorded and the server dropped it)."""
    import httpx
    from transformers import AutoTokenizer

    from whale.harness.calls import check_tools
    from whale.models.base import template_messages

    path = require_model("qwen-coder-0.5b")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = EmbeddedLlama(path, alias="qwen-coder-0.5b", n_ctx=2048, slots=1, threads=1)
    messages = [{"role": "system", "content": "Use the tools."},
                {"role": "user", "content": "2+2?"}]  # fmt: skip
    recorded = json.loads(check_tools(ODD_TOOLS) or "[]")
    numbers = json.loads(check_tools(NUMBER_TOOLS) or "[]")
    try:
        model.chat([{"role": "user", "content": "Say OK."}], Sampling(max_tokens=1))  # starts it
        base = model._client.base_url.removesuffix("/v1")
        rendered = [httpx.post(f"{base}/apply-template", timeout=60,
                               json={"messages": messages, "tools": tools}).json()["prompt"]
                    for tools in (ODD_TOOLS, recorded, numbers)]  # fmt: skip
    finally:
        model.close()
    ours = [tok.apply_chat_template(template_messages(messages), tools=tools,
                                    add_generation_prompt=True, tokenize=False)
            for tools in (recorded, numbers)]  # fmt: skip
    assert rendered[0] == rendered[1] == ours[0]
    assert rendered[2] == ours[1]


@pytest.mark.model
def test_the_native_server_renders_recorded_tool_call_arguments_as_transformers_does():
    import httpx
    from transformers import AutoTokenizer

    from whale.harness.calls import check_messages, check_tools
    from whale.models.base import template_messages

    path = require_model("qwen-coder-0.5b")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = EmbeddedLlama(path, alias="qwen-coder-0.5b", n_ctx=2048, slots=1, threads=1)
    tools = json.loads(check_tools(TOOLS) or "[]")
    recorded = check_messages(_with_history(HISTORY_ARGS[0]))
    try:
        model.chat([{"role": "user", "content": "Say OK."}], Sampling(max_tokens=1))  # starts it
        base = model._client.base_url.removesuffix("/v1")
        served = httpx.post(f"{base}/apply-template", timeout=60,
                            json={"messages": recorded, "tools": tools}).json()["prompt"]  # fmt: skip
    finally:
        model.close()
    ours = tok.apply_chat_template(template_messages(recorded), tools=tools,
                                   add_generation_prompt=True, tokenize=False)  # fmt: skip
    assert served == ours


@pytest.mark.model
@pytest.mark.slow
def test_the_python_embedded_server_takes_a_bare_tool_message():
    """llama-cpp-python's server answered HTTP 500 to a tool message without tool_call_id."""
    from whale.models.base import Sampling

    path = require_model("qwen-coder-0.5b")
    model = EmbeddedLlama(path, n_ctx=512, threads=1, server="python")
    try:
        c = model.chat([{"role": "user", "content": "Say OK."}, {"role": "tool", "content": "1"}],
                       Sampling(max_tokens=4))  # fmt: skip
    finally:
        model.close()
    assert c.usage["completion_tokens"] > 0


# The weight phase's provenance rule on real records: a tool turn counts when its call ran
# through the broker and its very result went back (whale.train.provenance).
BROKERED = LOOP.replace("result = multiply(**call[\"arguments\"])",
                        "result = env.tools.multiply(**call[\"arguments\"])")
assert BROKERED != LOOP


def test_a_tool_turn_served_by_the_broker_is_proven_for_the_weight_phase():
    from whale.harness.tools import parse_tools
    from whale.train.provenance import answer_provenance

    t = run(ToolModel(), BROKERED,
            tools=parse_tools({"multiply": "tests.harness.tool_fns:multiply"}))  # fmt: skip
    assert t.status == "ok" and t.answer == "The answer is 42.", t.error
    assert answer_provenance(t).calls == {0, 1}


def test_a_tool_turn_the_harness_answered_itself_is_not():
    """LOOP runs multiply in the harness's own Python: the rule cannot tell its result from
    one the harness made up, so only the answering call is proven (a false drop)."""
    from whale.train.provenance import answer_provenance

    assert answer_provenance(run(ToolModel(), LOOP)).calls == {1}
