"""SFT examples from accepted trajectories: one example per model call, loss on its completion.

Each model call of a trajectory becomes one example: the tokens of its prompt (the chat template
applied to the messages it was sent, with the generation prompt) followed by the tokens of its
completion; labels are -100 on every prompt position, so system, user, tool and earlier
assistant tokens are context only. Later calls repeat earlier completions inside their prompts;
those are masked there (they are trained on in their own call's example). Which calls of a run
are trained on at all is the weight phase's answer-provenance rule (`whale.train.provenance`,
passed as `trajectory_examples(calls=...)`).

Train on what was sampled. Where the backend recorded token ids they are used verbatim. Where
it did not (llama.cpp's server gives none), the ids are rebuilt: the prompt by the tokenizer's
chat template rendered to text and encoded with no special tokens added (what llama.cpp does:
render its template, then tokenize the text with special tokens parsed), the completion by
encoding the text and, when the model ended it itself, appending the end-of-turn id. The
backend's own token counts then check the rebuild; a count that disagrees means the template
or tokenizer is not the one that served the call, and the call is skipped, never trained on.

Measured on the embedded default (llama-cpp-python 0.3.36 server, Qwen2.5-Coder-0.5B-Instruct
Q4_K_M, tokenizer read from the GGUF by transformers 5.24, 2026-12-01; kept checked by the
model-marked tests of tests/train/test_data.py):
- `usage.prompt_tokens` equals the length of the HF template's ids (77 for system, user,
  assistant, tool, user), and those ids equal `Llama(vocab_only=True).tokenize(text,
  add_bos=False, special=True)` of the rendered text, token for token. (The server answers
  HTTP 500 to a `tool` message without a `tool_call_id`; the 77 was measured with one.)
- `usage.completion_tokens` does NOT count the end-of-turn token: "391" ending with eos ->
  finish "stop", 3 completion tokens (3 text tokens); a length stop of 3 -> 3.
- a stop *string* ends the call with finish "stop" too, and the count includes the tokens that
  made the stop string (34 counted for 33 text tokens, stop="print"), which the text omits.
So for finish "stop" with no stop strings the rebuilt completion (text + end of turn) matches
when `completion_tokens` is the text's length (llama.cpp) or one more (backends that count the
end-of-turn token). With stop strings, a count equal to the text's length is an end-of-turn
stop; a larger one is a stop-string stop, and the completion is the text alone, with no
end-of-turn token (the stop string's tokens were sampled but not recorded; the text is a
prefix of the sample, so training on it stays faithful). A count below the text's length is
a mismatch.

Tool calling (`env.llm(messages, tools=...)`, trajectory version 3). A call's prompt is the
template rendered with the tools it offered (`ModelCall.tools`) and its history's tool calls
and `tool` results, all masked: a tool result is context, never trained on. A completion that
called tools is not all in the recorded text (the server parsed the calls out of what the
model wrote), so its ids are rebuilt from the template: the conversation with the reply
appended as an assistant message carrying its calls, rendered without a generation prompt,
less the prompt's rendering, up to and including the end-of-turn token (Qwen2.5: the text,
then `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>`). That is what
the model wrote when it wrote the call the way the template shows it; the backend's count
checks it (`completion_tokens` equal to the rebuilt ids without, or with, the end-of-turn
token), and a call written any other way (other spacing, other key order) counts differently
and is skipped ("template mismatch"), never trained on. Arguments recorded as JSON text are
parsed into objects before rendering, as llama.cpp's server does (`models.base.
template_messages`). A call whale read out of the reply's text (`ModelCall.raw_text`: the
model wrote the call without the template's tags, and the server did not read it; see
`models.base.text_call`) is trained on that text and its end of turn, as any reply that
stopped, while later prompts show the call as the template writes it (what the server sent).

Not covered: records clipped by the trajectory size cap (skipped: their text is no longer what
was sampled), a tool-call completion whose backend gave no count (trained on as the template
renders it), and truncation (an example over `max_len` is skipped, not cut: a cut prompt is
not what the model saw).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from whale.harness.trajectory import ModelCall, Trajectory
from whale.models.base import template_messages
from whale.train.provenance import NO_PROVENANCE

IGNORE = -100
END_OF_TURN = "<|im_end|>"
# What Trajectory._clip leaves in a string it shortened.
_CLIPPED = re.compile(r"…\[\d+ chars not recorded\]…")
# Rebuilt completion ids, or None and why they could not be.
_Ids = tuple[list[int], None] | tuple[None, str]


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]  # IGNORE (-100) on masked (prompt) positions, else the token id
    source: str  # f"{question_id}#{call index}"


@dataclass(frozen=True)
class Skip:
    source: str
    reason: str


def end_of_turn_id(tokenizer: Any) -> int:
    """The id the model emits to end its turn: `<|im_end|>` when the vocabulary has it (Qwen's
    chat format), else the tokenizer's eos id."""
    i = tokenizer.convert_tokens_to_ids(END_OF_TURN)  # not get_vocab(): it copies the vocab
    if i is not None and (i != tokenizer.unk_token_id or tokenizer.unk_token == END_OF_TURN):
        return int(i)
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has neither <|im_end|> nor an eos token")
    return int(tokenizer.eos_token_id)


def template_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The prompt ids of `messages` (offered `tools`, if any): the chat template with the
    generation prompt, rendered to text and encoded without added special tokens (special
    tokens in the text are parsed)."""
    return _encode(tokenizer, _render(tokenizer, messages, tools, generation_prompt=True))


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            generation_prompt: bool) -> str:  # fmt: skip
    # `tools=` only when some were offered: a call without tools renders as it did before
    # tool calling existed, with any tokenizer (some take no `tools` argument).
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(
        template_messages(messages), add_generation_prompt=generation_prompt, tokenize=False,
        **extra,
    )  # fmt: skip
    return str(text)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _clipped(call: ModelCall) -> bool:
    """Whether any text of the call's record was shortened by the trajectory size cap."""
    return _holds_clip([call.text, call.messages, call.tools, call.tool_calls])


def _holds_clip(x: Any) -> bool:
    if isinstance(x, str):
        return _CLIPPED.search(x) is not None
    if isinstance(x, dict):
        return any(_holds_clip(v) for v in x.values())
    if isinstance(x, list | tuple):
        return any(_holds_clip(v) for v in x)
    return False


def _tool_call_ids(call: ModelCall, tokenizer: Any, eot: int) -> _Ids:
    """Rebuilt ids of a completion that called tools (module docstring), checked against
    `usage.completion_tokens`."""
    calls = [{"id": t.get("id", ""), "type": "function",
              "function": {"name": t.get("name", ""), "arguments": t.get("arguments", "")}}
             for t in call.tool_calls or ()]  # fmt: skip
    reply = {"role": "assistant", "content": call.text, "tool_calls": calls}
    try:
        prompt = _render(tokenizer, call.messages, call.tools, generation_prompt=True)
        full = _render(tokenizer, [*call.messages, reply], call.tools, generation_prompt=False)
    except Exception as e:  # a template that raises on these messages (jinja error)
        return None, f"chat template failed: {type(e).__name__}: {e}"
    if not full.startswith(prompt):
        return None, "the chat template renders the tool-call reply apart from its prompt"
    ids = _encode(tokenizer, full[len(prompt) :])
    if eot not in ids:
        return None, "the chat template does not end the tool-call reply's turn"
    ids = ids[: len(ids) - ids[::-1].index(eot)]  # up to the turn's end; the rest is layout
    counted = call.usage.get("completion_tokens")
    if counted is not None and counted not in (len(ids) - 1, len(ids)):
        return None, (
            f"template mismatch: the tool call as the chat template writes it is "
            f"{len(ids) - 1} tokens (+ end of turn), the backend counted {counted}"
        )
    return ids, None


def _completion_ids(call: ModelCall, tokenizer: Any, eot: int) -> _Ids:
    """Rebuilt completion ids from the text, checked against `usage.completion_tokens`."""
    if call.finish_reason not in ("stop", "length"):
        return None, (
            f"finish reason {call.finish_reason!r} without recorded token ids: the completion "
            "is not all in the recorded text"
        )
    ids = list(tokenizer(call.text, add_special_tokens=False)["input_ids"])
    counted = call.usage.get("completion_tokens")
    if call.finish_reason == "length":
        if counted is not None and counted != len(ids):
            return None, (
                f"template mismatch: completion text is {len(ids)} tokens, the backend "
                f"counted {counted}"
            )
        return ids, None
    stop_strings = bool(call.params.get("stop"))
    if counted is None:
        # A stop string or the end-of-turn token, and nothing tells which: the text alone is
        # what was sampled either way (the end-of-turn token may be left out).
        return (ids if stop_strings else [*ids, eot]), None
    if stop_strings:
        if counted == len(ids):
            return [*ids, eot], None  # llama.cpp: the end-of-turn token is not counted
        if counted > len(ids):
            return ids, None  # stopped on a stop string: the text is a prefix of the sample
    elif counted in (len(ids), len(ids) + 1):
        return [*ids, eot], None
    return None, (
        f"template mismatch: completion text is {len(ids)} tokens (+ end of turn), the "
        f"backend counted {counted}"
    )


def call_example(call: ModelCall, tokenizer: Any, source: str, max_len: int) -> Example | Skip:
    """The example of one model call, or a Skip saying why it cannot be trained on."""
    if call.error is not None or call.finish_reason == "error":
        return Skip(source, f"call failed: {call.error or 'finish reason error'}")
    if call.prompt_token_ids is not None:
        prompt = list(call.prompt_token_ids)
    else:
        if _clipped(call):
            return Skip(source, "record clipped by the trajectory size cap")
        try:
            prompt = template_ids(tokenizer, call.messages, call.tools)
        except Exception as e:  # a template that raises on these messages (jinja error)
            return Skip(source, f"chat template failed: {type(e).__name__}: {e}")
        counted = call.usage.get("prompt_tokens")
        if counted is not None and counted != len(prompt):
            return Skip(
                source,
                f"template mismatch: prompt is {len(prompt)} tokens by the chat template, the "
                f"backend counted {counted}",
            )
    if call.token_ids is not None:
        completion = list(call.token_ids)
    else:
        if _holds_clip([call.text, call.tool_calls, call.raw_text]):
            return Skip(source, "record clipped by the trajectory size cap")
        eot = end_of_turn_id(tokenizer)
        if call.raw_text is not None:  # whale read the call out of this text: train on it
            written = dataclasses.replace(call, text=call.raw_text, finish_reason="stop")
            ids, why = _completion_ids(written, tokenizer, eot)
        elif call.tool_calls:
            ids, why = _tool_call_ids(call, tokenizer, eot)
        else:
            ids, why = _completion_ids(call, tokenizer, eot)
        if ids is None:
            return Skip(source, str(why))
        completion = ids
    eot = end_of_turn_id(tokenizer)
    if not completion or completion == [eot]:
        return Skip(source, "empty completion")
    n = len(prompt) + len(completion)
    if n > max_len:
        return Skip(source, f"{n} tokens is over max_len {max_len}")
    return Example(
        input_ids=prompt + completion,
        labels=[IGNORE] * len(prompt) + completion,
        source=source,
    )


def trajectory_examples(
    traj: Trajectory, tokenizer: Any, max_len: int = 4096, calls: Collection[int] | None = None
) -> tuple[list[Example], list[Skip]]:
    """One example per model call of an (accepted) trajectory, in call order, and a Skip for
    each call that cannot be trained on. Whether the trajectory was accepted is the caller's
    decision (the verifier's), not checked here. `calls`: the indices of the model calls that
    may be trained on (those carrying the answer's provenance, `whale.train.provenance`); any
    other call is a Skip "no answer provenance". None: every call."""
    examples: list[Example] = []
    skips: list[Skip] = []
    for i, call in enumerate(traj.model_calls()):
        source = f"{traj.question_id}#{i}"
        if calls is not None and i not in calls:
            skips.append(Skip(source, f"{NO_PROVENANCE}: the answer is not in this completion "
                                      "nor in the output of code it wrote"))  # fmt: skip
            continue
        r = call_example(call, tokenizer, source, max_len)
        (examples if isinstance(r, Example) else skips).append(r)  # type: ignore[arg-type]
    return examples, skips


def dataset_examples(
    trajectories: Sequence[Trajectory], tokenizer: Any, max_len: int = 4096
) -> tuple[list[Example], list[Skip]]:
    """`trajectory_examples` over many trajectories, concatenated."""
    examples: list[Example] = []
    skips: list[Skip] = []
    for t in trajectories:
        e, s = trajectory_examples(t, tokenizer, max_len)
        examples += e
        skips += s
    return examples, skips
