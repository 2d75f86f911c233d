"""SFT examples from trajectories: one per model call, loss on exactly the completion tokens."""

from __future__ import annotations

import pytest

from tests.conftest import require_model
from whale.harness import Runtime, Trajectory
from whale.harness.trajectory import ModelCall, ToolCall
from whale.models.base import Completion
from whale.train.data import (
    IGNORE,
    Example,
    Skip,
    call_example,
    end_of_turn_id,
    template_ids,
    trajectory_examples,
)

SYSTEM = "Please think step by step, then give the answer as a single number at the end."
QUESTION = "What is seven times eight?"
REPLIES = [
    "```python\nprint(7 * 8)\n```",
    "The tool says 56. Let me check: ```python\nprint(56 // 8)\n```",
    "Answer: 56",
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class CountingModel:
    """A backend that counts tokens the way llama.cpp's server does (measured, see
    whale/train/data.py): the prompt by the chat template, the completion without the
    end-of-turn token. Records no token ids."""

    name = "counting"

    def __init__(self, tok, replies):
        self.tok, self.replies, self.calls = tok, list(replies), 0

    def chat(self, messages, sampling, timeout=None):
        text = self.replies[self.calls]
        self.calls += 1
        p = len(template_ids(self.tok, messages))
        c = len(self.tok(text, add_special_tokens=False)["input_ids"])
        return Completion(text, "stop", {"prompt_tokens": p, "completion_tokens": c,
                                         "total_tokens": p + c})


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def llama_usage(tok, messages, text):
    return {"prompt_tokens": len(template_ids(tok, messages)),
            "completion_tokens": len(enc(tok, text))}


def conversation(tok) -> Trajectory:
    """Three model calls; a python tool call (result sent back as a `tool` message) between
    the first and second, a `user` follow-up between the second and third."""
    t = Trajectory(question_id="q1", harness_hash="h")
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    follow = [{"role": "tool", "content": "56\n"}, {"role": "user", "content": "Output: 7\n"}]
    for i, reply in enumerate(REPLIES):
        t.add_model_call(ModelCall(messages=[dict(m) for m in msgs], text=reply,
                                   finish_reason="stop", usage=llama_usage(tok, msgs, reply)))
        if i < 2:
            t.add_tool_call(ToolCall(name="python", args={"code": "print(7 * 8)"},
                                     result={"stdout": "56\n"}))
            msgs += [{"role": "assistant", "content": reply}, follow[i]]
    return t


def test_mask_covers_exactly_the_completion_tokens(tok):
    examples, skips = trajectory_examples(conversation(tok), tok)
    assert skips == [] and [e.source for e in examples] == ["q1#0", "q1#1", "q1#2"]
    eot = end_of_turn_id(tok)
    for i, e in enumerate(examples):
        completion = [*enc(tok, REPLIES[i]), eot]
        n_prompt = len(e.input_ids) - len(completion)
        assert e.input_ids[n_prompt:] == completion
        for pos, (x, y) in enumerate(zip(e.input_ids, e.labels, strict=True)):
            assert y == (IGNORE if pos < n_prompt else x), (i, pos)
        # the prompt is the template of what the call was sent, generation prompt included
        prompt_text = tok.decode(e.input_ids[:n_prompt])
        assert prompt_text.endswith("<|im_start|>assistant\n")
        assert tok.decode(e.input_ids[n_prompt:]) == REPLIES[i] + "<|im_end|>"
    # later calls see the tool result and earlier completions, all masked
    last = examples[2]
    masked = tok.decode([x for x, y in zip(last.input_ids, last.labels, strict=True)
                         if y == IGNORE])
    assert "<|im_start|>tool\n56\n<|im_end|>" in masked
    assert REPLIES[0] in masked and REPLIES[1] in masked
    trained = tok.decode([y for y in last.labels if y != IGNORE])
    assert trained == REPLIES[2] + "<|im_end|>"


def test_a_real_harness_run_with_a_tool_call(tok):
    """The same through the broker: a jailed harness calls the model, runs python, sends the
    output back with role `tool`; each model call is one example, prompt masked."""
    src = (
        "def run(q, env):\n"
        "    m = [{'role': 'user', 'content': q}]\n"
        "    r = env.llm(m)\n"
        "    out = env.tools.python('print(7 * 8)')\n"
        "    m += [{'role': 'assistant', 'content': r.text},"
        " {'role': 'tool', 'content': out.stdout}]\n"
        "    return env.llm(m).text\n"
    )
    rt = Runtime(model=CountingModel(tok, REPLIES))
    try:
        traj = rt.run(src, QUESTION, "q9")
    finally:
        rt.close()
    assert traj.status == "ok", traj.error
    examples, skips = trajectory_examples(traj, tok)
    assert skips == [] and len(examples) == 2
    e = examples[1]
    masked = tok.decode([x for x, y in zip(e.input_ids, e.labels, strict=True) if y == IGNORE])
    assert "<|im_start|>tool\n56\n<|im_end|>" in masked
    assert tok.decode([y for y in e.labels if y != IGNORE]) == REPLIES[1] + "<|im_end|>"


def test_recorded_ids_are_used_verbatim(tok):
    """Ids the backend recorded win over any rebuild, even when the text disagrees."""
    call = ModelCall(messages=[{"role": "user", "content": "hi"}], text="ignored text",
                     finish_reason="stop", usage={"prompt_tokens": 999},
                     prompt_token_ids=[5, 6, 7], token_ids=[8, 9])
    e = call_example(call, tok, "q#0", 4096)
    assert e == Example([5, 6, 7, 8, 9], [IGNORE, IGNORE, IGNORE, 8, 9], "q#0")
    # only the completion recorded: the prompt is rebuilt (and checked), completion verbatim
    msgs = [{"role": "user", "content": "hi"}]
    call = ModelCall(messages=msgs, text="x", finish_reason="stop",
                     usage={"prompt_tokens": len(template_ids(tok, msgs))}, token_ids=[8, 9])
    e = call_example(call, tok, "q#0", 4096)
    assert isinstance(e, Example) and e.input_ids == template_ids(tok, msgs) + [8, 9]


def test_template_mismatch_is_skipped(tok):
    msgs = [{"role": "user", "content": QUESTION}]
    usage = llama_usage(tok, msgs, "It is 56.")
    ok = ModelCall(messages=msgs, text="It is 56.", finish_reason="stop", usage=usage)
    assert isinstance(call_example(ok, tok, "q#0", 4096), Example)
    off = ModelCall(messages=msgs, text="It is 56.", finish_reason="stop",
                    usage={**usage, "prompt_tokens": usage["prompt_tokens"] + 2})
    r = call_example(off, tok, "q#0", 4096)
    assert isinstance(r, Skip) and r.reason.startswith("template mismatch: prompt")
    off = ModelCall(messages=msgs, text="It is 56.", finish_reason="stop",
                    usage={**usage, "completion_tokens": usage["completion_tokens"] + 3})
    r = call_example(off, tok, "q#0", 4096)
    assert isinstance(r, Skip) and r.reason.startswith("template mismatch: completion")


def test_eos_only_when_the_model_ended_its_turn(tok):
    msgs = [{"role": "user", "content": QUESTION}]
    text, eot = "It is fifty six", end_of_turn_id(tok)
    usage = llama_usage(tok, msgs, text)
    length = call_example(ModelCall(msgs, text, "length", usage), tok, "q#0", 4096)
    assert isinstance(length, Example) and length.input_ids[-1] != eot
    assert length.input_ids[-len(enc(tok, text)):] == enc(tok, text)
    # a stop string ended it: llama.cpp counts the stop string's tokens, the text omits them
    stopped = ModelCall(msgs, text, "stop", {**usage, "completion_tokens": len(enc(tok, text)) + 2},
                        params={"stop": ["."]})
    e = call_example(stopped, tok, "q#0", 4096)
    assert isinstance(e, Example) and e.input_ids[-1] != eot
    # with stop strings set but the count equal to the text, the end-of-turn token ended it
    eos = ModelCall(msgs, text, "stop", usage, params={"stop": ["."]})
    e = call_example(eos, tok, "q#0", 4096)
    assert isinstance(e, Example) and e.input_ids[-1] == eot


def test_unusable_calls_are_skipped_with_reasons(tok):
    msgs = [{"role": "user", "content": QUESTION}]
    t = Trajectory(question_id="q2", harness_hash="h")
    t.add_model_call(ModelCall(msgs, "", "error", error="ModelTimeout: no reply in 120 s"))
    t.add_model_call(ModelCall(msgs, "", "stop", llama_usage(tok, msgs, "")))
    t.add_model_call(ModelCall(msgs, "It is 56.", "stop", llama_usage(tok, msgs, "It is 56.")))
    t.add_model_call(ModelCall(msgs, "", "tool_calls", {}))
    t.add_model_call(ModelCall([{"role": "user", "content": "x" * 50 + "…[123 chars not recorded]…"}],
                               "ok", "stop"))
    examples, skips = trajectory_examples(t, tok, max_len=8)
    assert examples == []
    reasons = {s.source: s.reason for s in skips}
    assert reasons["q2#0"].startswith("call failed: ModelTimeout")
    assert reasons["q2#1"] == "empty completion"
    assert "over max_len 8" in reasons["q2#2"]
    assert "tool_calls" in reasons["q2#3"]
    assert "clipped" in reasons["q2#4"]
    examples, skips = trajectory_examples(t, tok)
    assert [e.source for e in examples] == ["q2#2"] and len(skips) == 4


MULTI_TURN = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 17*23? Use python."},
    {"role": "assistant", "content": "```python\nprint(17*23)\n```"},
    {"role": "tool", "content": "391"},
    {"role": "user", "content": "Now answer with just the number."},
]


@pytest.fixture(scope="module")
def gguf():
    """The catalog GGUF and its tokenizer as transformers reads it (~15 s)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    path = Path(require_model("qwen-coder-0.5b"))
    return path, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.model
@pytest.mark.slow
def test_template_ids_equal_llama_cpp_tokenization(gguf):
    """The GGUF's tokenizer and chat template, read by transformers, give the ids llama.cpp
    itself gives the rendered prompt, for a multi-turn conversation with a tool message."""
    import llama_cpp

    path, tok = gguf
    ids = template_ids(tok, MULTI_TURN)
    text = tok.apply_chat_template(MULTI_TURN, add_generation_prompt=True, tokenize=False)
    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        assert vocab.tokenize(text.encode(), add_bos=False, special=True) == ids
        assert end_of_turn_id(tok) == vocab.token_eos() == 151645
    finally:
        vocab.close()
    assert len(ids) == 77  # the server's usage.prompt_tokens for these messages (measured)


@pytest.mark.model
@pytest.mark.slow
def test_embedded_server_counts_match_the_rebuild(gguf):
    """What data.py assumes of llama.cpp's server: prompt_tokens is the template's length and
    completion_tokens leaves the end-of-turn token out. If a llama.cpp release changes its
    counting, these calls become Skips and this test says so."""
    from whale.models import EmbeddedLlama, Sampling

    path, tok = gguf
    # The server refuses a `tool` message without a tool_call_id; the harness's tool results
    # arrive here as `user` messages.
    msgs = [m if m["role"] != "tool" else {"role": "user", "content": m["content"]}
            for m in MULTI_TURN]
    model = EmbeddedLlama(path, n_ctx=1024, threads=1)
    try:
        stop = model.chat(msgs, Sampling(max_tokens=48))
        length = model.chat(msgs[:2], Sampling(max_tokens=4))
    finally:
        model.close()
    assert stop.finish_reason == "stop" and length.finish_reason == "length"
    for c, m, last_is_eot in ((stop, msgs, True), (length, msgs[:2], False)):
        call = ModelCall(m, c.text, c.finish_reason, dict(c.usage))
        e = call_example(call, tok, "q#0", 4096)
        assert isinstance(e, Example), e
        assert (e.input_ids[-1] == end_of_turn_id(tok)) == last_is_eot
