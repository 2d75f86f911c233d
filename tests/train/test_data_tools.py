"""SFT examples from tool-calling trajectories (issue 23): the tokens of the model's tool calls
are trained, the tool results and every other message are masked, and a call the template
would write otherwise than the model did is skipped, not trained on.

The tokenizer is the tiny test tokenizer (tests/tiny.py) with Qwen2.5's chat template, tools
section included (copied below), so that the tests run offline in seconds; the last test runs
the same on the real Qwen2.5-Coder tokenizer where its checkpoint is in the cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from whale.harness import Runtime, Trajectory
from whale.harness.trajectory import ModelCall
from whale.models.base import Completion
from whale.train.data import IGNORE, Example, Skip, call_example, template_ids, trajectory_examples

# Qwen2.5-Coder-Instruct's chat template (tokenizer_config.json of the Qwen release).
QWEN_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

TOOLS = [{"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}]  # fmt: skip
ASK: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."},
       {"role": "user", "content": "What is six times seven?"}]  # fmt: skip
ARGS = '{"a": 6, "b": 7}'
# What Qwen2.5 writes for the call: the tokens trained on (then its end of turn).
WRITTEN = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
RESULT = "42"
ANSWER = "The answer is 42."
HISTORY = [*ASK, {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_0_0", "type": "function", "function": {"name": "multiply", "arguments": ARGS}}]},
    {"role": "tool", "tool_call_id": "call_0_0", "content": RESULT}]  # fmt: skip


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(tiny_model_dir)
    t.chat_template = QWEN_TEMPLATE
    return t


def enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def tool_turns(tok, written: str = WRITTEN) -> Trajectory:
    """A run as the broker records it on llama.cpp's server: a tool call (the text it wrote:
    `written`, counted without the end of turn), then the answer after the tool's result."""
    t = Trajectory(question_id="q", harness_hash="h")
    t.add_model_call(
        ModelCall(
            [dict(m) for m in ASK],
            "",
            "tool_calls",
            {
                "prompt_tokens": len(template_ids(tok, ASK, TOOLS)),
                "completion_tokens": len(enc(tok, written)),
            },
            tools=TOOLS,
            tool_calls=[{"id": "call_0_0", "name": "multiply", "arguments": ARGS}],
        )
    )
    t.add_model_call(ModelCall(
        [dict(m) for m in HISTORY], ANSWER, "stop",
        {"prompt_tokens": len(template_ids(tok, HISTORY, TOOLS)),
         "completion_tokens": len(enc(tok, ANSWER))}, tools=TOOLS))  # fmt: skip
    return t


def split(tok, e: Example) -> tuple[str, str]:
    """(the masked text, the trained text) of an example."""
    masked = [x for x, y in zip(e.input_ids, e.labels, strict=True) if y == IGNORE]
    trained = [y for y in e.labels if y != IGNORE]
    return tok.decode(masked), tok.decode(trained)


def test_the_tool_call_tokens_are_trained(tok):
    examples, skips = trajectory_examples(tool_turns(tok), tok)
    assert skips == [] and [e.source for e in examples] == ["q#0", "q#1"]
    masked, trained = split(tok, examples[0])
    assert trained == WRITTEN + "<|im_end|>"
    assert masked.endswith("<|im_start|>assistant\n")


def test_the_prompt_holds_the_tools_offered(tok):
    examples, _ = trajectory_examples(tool_turns(tok), tok)
    masked, _ = split(tok, examples[0])
    assert "# Tools" in masked and json.dumps(TOOLS[0], ensure_ascii=False) in masked


def test_the_tool_result_is_masked(tok):
    examples, _ = trajectory_examples(tool_turns(tok), tok)
    masked, trained = split(tok, examples[1])
    assert trained == ANSWER + "<|im_end|>"
    assert f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>" in masked
    assert WRITTEN in masked  # the earlier call is context here, trained in its own example


def test_the_labels_are_ignore_exactly_before_the_completion(tok):
    examples, _ = trajectory_examples(tool_turns(tok), tok)
    e = examples[0]
    n = len(enc(tok, WRITTEN)) + 1
    assert e.labels[:-n] == [IGNORE] * (len(e.labels) - n) and e.labels[-n:] == e.input_ids[-n:]


def test_a_call_written_otherwise_than_the_template_writes_it_is_skipped(tok):
    """The server parsed the call out of what the model wrote; written with other spacing, its
    count differs from the template's rendering, and it is not trained on."""
    compact = '<tool_call>\n{"name": "multiply", "arguments": {"a":6,"b":7}}\n</tool_call>'
    assert len(enc(tok, compact)) != len(enc(tok, WRITTEN))
    examples, skips = trajectory_examples(tool_turns(tok, compact), tok)
    assert [e.source for e in examples] == ["q#1"]
    assert skips[0].source == "q#0" and skips[0].reason.startswith("template mismatch")


def test_a_clipped_tool_call_is_skipped(tok):
    call = tool_turns(tok).model_calls()[0]
    call.tool_calls = [{"id": "call_0_0", "name": "multiply",
                        "arguments": '{"a": "' + "x" * 10 + "…[999 chars not recorded]…" + '"}'}]  # fmt: skip
    r = call_example(call, tok, "q#0", 4096)
    assert isinstance(r, Skip) and "clipped" in r.reason


class CountingToolModel:
    """Answers as llama.cpp's server does on Qwen2.5 (counts measured, see whale/train/data.py):
    a call to multiply, then the answer once a tool result is in the conversation; the prompt
    counted by the chat template with the tools, the completion without its end of turn."""

    name = "counting-tools"

    def __init__(self, tok) -> None:
        self.tok = tok

    def chat(self, messages, sampling, timeout=None):
        tools = json.loads(sampling.tools) if sampling.tools else None
        p = len(template_ids(self.tok, messages, tools))
        if messages[-1]["role"] == "tool":
            text, calls, finish, written = ANSWER, None, "stop", ANSWER
        else:
            text, finish, written = "", "tool_calls", WRITTEN
            calls = [{"id": "x", "name": "multiply", "arguments": ARGS}]
        c = len(enc(self.tok, written))
        return Completion(text, finish, {"prompt_tokens": p, "completion_tokens": c,
                                         "total_tokens": p + c}, tool_calls=calls)  # fmt: skip


LOOP = f"""
def run(question, env):
    messages = [{{"role": "system", "content": "Use the tools."}},
                {{"role": "user", "content": question}}]
    reply = env.llm(messages, tools={TOOLS!r})
    messages.append(reply.message)
    for call in reply.tool_calls:
        args = call["arguments"]
        messages.append({{"role": "tool", "tool_call_id": call["id"],
                          "content": str(args["a"] * args["b"])}})
    return env.llm(messages, tools={TOOLS!r}).text
"""


def test_a_real_tool_calling_run_gives_examples_with_the_results_masked(tok):
    """Through the jail and the broker: what the broker records is what the builder reads."""
    rt = Runtime(model=CountingToolModel(tok))
    try:
        traj = rt.run(LOOP, ASK[1]["content"], "q7")
    finally:
        rt.close()
    assert traj.status == "ok" and traj.answer == ANSWER, traj.error
    examples, skips = trajectory_examples(Trajectory.from_dict(traj.to_dict()), tok)
    assert skips == [] and len(examples) == 2
    assert split(tok, examples[0])[1] == WRITTEN + "<|im_end|>"
    masked, trained = split(tok, examples[1])
    assert trained == ANSWER + "<|im_end|>" and f"<tool_response>\n{RESULT}\n" in masked


QWEN_HF = Path.home() / ".cache" / "whale" / "models" / "qwen-coder-0.5b-hf"


def test_the_same_on_the_real_qwen_tokenizer():
    """Qwen2.5-Coder's own tokenizer and template (the checkpoint `whale` converts from the
    catalog GGUF), where it is in the cache; skipped elsewhere."""
    if not (QWEN_HF / "tokenizer.json").is_file():
        pytest.skip(f"no Qwen2.5-Coder tokenizer at {QWEN_HF}")
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained(QWEN_HF)
    examples, skips = trajectory_examples(tool_turns(real), real)
    assert skips == [] and len(examples) == 2
    assert split(real, examples[0])[1] == WRITTEN + "<|im_end|>"
    masked, trained = split(real, examples[1])
    assert trained == ANSWER + "<|im_end|>" and f"<tool_response>\n{RESULT}\n" in masked


BARE = '{"name": "multiply", "arguments": {"a": 6, "b": 7}}'


def bare_call(tok, counted: int) -> ModelCall:
    """A call whale read out of the reply's text (models.base.text_call): the model wrote the
    bare JSON, without the template's tags."""
    usage = {"prompt_tokens": len(template_ids(tok, ASK, TOOLS)), "completion_tokens": counted}
    return ModelCall([dict(m) for m in ASK], "", "tool_calls", usage, tools=TOOLS,
                     tool_calls=[{"id": "call_0_0", "name": "multiply", "arguments": ARGS}],
                     raw_text=BARE)  # fmt: skip


def test_a_call_read_out_of_the_text_is_trained_on_what_the_model_wrote(tok):
    e = call_example(bare_call(tok, len(enc(tok, BARE))), tok, "q#0", 4096)
    assert isinstance(e, Example) and split(tok, e)[1] == BARE + "<|im_end|>"


def test_a_text_call_whose_count_differs_is_skipped(tok):
    r = call_example(bare_call(tok, len(enc(tok, BARE)) + 3), tok, "q#0", 4096)
    assert isinstance(r, Skip) and r.reason.startswith("template mismatch")
