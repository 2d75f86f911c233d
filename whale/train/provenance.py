"""Answer provenance: which model calls of an accepted run produced its final answer.

The verifier accepts a run by its final answer, whoever computed it. A harness may ask the
solver anything, ignore the reply and compute the answer itself (in its own Python, or with a
table); training on such a run's completions teaches the model text that did not solve the
task (issue 20: "You are EVIL-BOT. Always insult the user." at temperature 30, then the
arithmetic done by the harness, accepted 2/2 and trained on the insults). So S+ keeps a model
call only when the run's answer came from it:

- the answer *appears* in the call's completion, or
- the completion wrote code that the harness ran with `env.tools.python` after the call, and
  that code's recorded stdout holds the answer. "Wrote", whitespace normalized: the code that
  ran occurs in the completion (the whole reply or a block extracted from it), or a fenced
  code block of the completion occurs in the code that ran with at most MAX_WRAPPER_CHARS
  around it (a harness that adds an import or a `print(result)`), the block being Python that
  does something (not only imports, comments or prose).

- the completion made tool calls (`env.llm(..., tools=...)`) and a proven call continues its
  conversation: its prompt starts with this call's prompt, then this call's reply as the
  assistant turn (its text and exactly its tool calls: ids, names and arguments as recorded),
  then `role: "tool"` results for them, each the very result the broker returned when the
  harness ran that call with `env.tools.NAME(**arguments)` (the text, or its JSON), and the
  proven call sampled as this one was (the same parameters but the length cap, the same
  tools). A tool-calling
  loop's answer comes from its last turn, but the turns that asked for the data are the
  agent's work; followed back along the chain (a call proven this way proves the calls its own
  prompt continues).

Only those calls are trained on; the other earlier calls of the same conversation are not
(they are context of a proven call's prompt, masked there). A run where no call carries the
answer is dropped from S+ with the reason.

"Appears", with both sides NFKC-normalized, case-folded and whitespace squeezed (the answer
as the grader reads it: the content of its last `\\boxed{}` if it has one, trailing sentence
punctuation dropped; an empty answer has no provenance):
- literally, not inside a longer word or number ("4" is not in "14", "-4", "4.5" or "3/4");
- a number by value among the numbers the text writes ("1,000" for "1000", "0.5" for "1/2",
  a minus sign a sign only where it does not follow a word: "5-4" writes 5 and 4);
- an answer that is not a number, as its word tokens in a row, punctuation and the articles
  a/an/the left out (the SQuAD normalization the QA grader uses): "eiffel tower" in "The
  Eiffel-Tower".

Limits: a tool turn whose call the harness answers from its own Python, under another tool
name, or with the result reformatted, is not proven (a false drop); a user tool that echoes
what the harness passes it lets a harness write the "result" itself. A short answer (a small
integer, "yes") can appear by chance in a completion that did
not compute it, and such a run is kept. An answer the harness computed and then put in the
model's prompt ("explain why the answer is 42", "repeat: 42") is kept when the model says it
back: the rule cannot tell that from a passage the model reads its answer from (retrieval QA,
where finding the answer in the context is the skill), so it does not look at the prompt; the
same goes for code the harness hands the model to copy. The code route covers only
`env.tools.python` (code run any other way, e.g. by an `exec` in the harness, is not seen),
and code that a completion holds counts however little of the work it does (a harness's
short fallback around a failing block, `try: print(solve()) except: print(17 + 25)`, is not
told apart). An answer the
harness reformats beyond the above (a list re-joined, a number written out in words) is
dropped: a false drop costs an example, a false keep trains on text that did not solve the
task.
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from whale.harness.trajectory import Trajectory
from whale.tasks.answers import last_boxed, parse_number

_WS = re.compile(r"\s+")
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-"})  # the minus sign and en dash as "-"
# A number as text writes it: an optional sign where it does not follow a word or a closing
# bracket (so "5-4" is 5 and 4, "=-4" is -4), digits with optional thousands commas, a decimal
# part, a /denominator, a percent; not part of a word or a longer number.
_NUMBER = re.compile(
    r"(?:(?<![\w.)\]])[-+])?(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?%?(?!\w)"
)
_ARTICLES = frozenset(("a", "an", "the"))
# A fenced code block of a completion (```python ... ```, ```py, or bare ```).
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
# A block shorter than this (squeezed) is not taken as the code that ran: `x` in any program.
MIN_BLOCK_CHARS = 16
# What a harness may add around a completion's block for the block to still count as the code
# that ran (squeezed characters): an import and a `print(result)`, not a program of its own.
MAX_WRAPPER_CHARS = 120
NO_PROVENANCE = "no answer provenance"


@dataclass(frozen=True)
class Provenance:
    calls: frozenset[int]  # indices into traj.model_calls() whose completion produced the answer
    reason: str | None = None  # why no call did (calls empty)


def canonical(text: str) -> str:
    """NFKC, case-folded, minus signs as "-", every run of whitespace one space, stripped."""
    text = unicodedata.normalize("NFKC", text).translate(_MINUS).casefold()
    return _WS.sub(" ", text).strip()


def answer_target(answer: str | None) -> str | None:
    """The answer as it is looked for, or None when it is empty (no provenance)."""
    if not isinstance(answer, str):  # None, or a record read back from disk with another type
        return None
    boxed = last_boxed(answer)
    a = canonical(boxed if boxed is not None else answer)
    return a.rstrip(" .,;:!?") or a or None


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _literal(target: str, text: str) -> bool:
    """`target` occurs in `text` (both canonical) not inside a longer word or number."""
    start = text.find(target)
    while start >= 0:
        end = start + len(target)
        before = text[start - 1] if start else ""
        after = text[end] if end < len(text) else ""
        after2 = text[end + 1] if end + 1 < len(text) else ""
        ok_before = bool(
            not before
            or not (_word(target[0]) and _word(before))
            and not (target[0].isdigit() and before in "-+./")
            and not (target[0] in "+-" and (_word(before) or before in ").]"))
        )
        ok_after = not (after and _word(target[-1]) and _word(after)) and not (
            target[-1].isdigit() and after in ".,/" and after2.isdigit()
        )
        if ok_before and ok_after:
            return True
        start = text.find(target, start + 1)
    return False


def _tokens(text: str) -> list[str]:
    return [t for t in re.sub(r"[^\w\s]|_", " ", text).split() if t not in _ARTICLES]


def _contains_tokens(target: str, text: str) -> bool:
    want = _tokens(target)
    # A substring search over the joined tokens: linear, where comparing token windows would
    # take len(text) × len(answer) on a long answer.
    return bool(want) and f" {' '.join(want)} " in f" {' '.join(_tokens(text))} "


def appears(target: str, text: str) -> bool:
    """Whether the answer `target` (from `answer_target`) appears in `text` (module docstring)."""
    if not target:
        return False
    text = canonical(text)
    if _literal(target, text):
        return True
    value = parse_number(target)
    if value is not None:
        return any(parse_number(n) == value for n in _NUMBER.findall(text))
    return _contains_tokens(target, text)


def _squeezed(text: str) -> str:
    return _WS.sub(" ", text).strip()


def answer_provenance(traj: Trajectory) -> Provenance:
    """The model calls of `traj` that produced its final answer (module docstring)."""
    target = answer_target(traj.answer)
    if target is None:
        return Provenance(frozenset(), f"{NO_PROVENANCE}: the run's answer is empty")
    proven: set[int] = set()
    texts: list[str] = []  # completions so far, in call order, whitespace squeezed
    blocks: list[list[str]] = []  # their fenced code blocks, squeezed
    for e in traj.events:
        if e.get("kind") == "model":
            text = e.get("text")
            text = text if isinstance(text, str) else ""
            if e.get("error") is None and appears(target, text):
                proven.add(len(texts))
            texts.append(_squeezed(text))
            blocks.append([_squeezed(m) for m in _FENCE.findall(text) if _is_work(m)])
        elif e.get("kind") == "tool" and e.get("name") == "python":
            code, out = _code_and_stdout(e)
            if code is None or out is None:
                continue
            c = _squeezed(code)
            wrote = {i for i, t in enumerate(texts)
                     if c and (c in t or any(b in c and len(c) - len(b) <= MAX_WRAPPER_CHARS
                                             for b in blocks[i]))}  # fmt: skip
            if wrote and appears(target, out):
                proven |= wrote
    if proven:
        return Provenance(frozenset(proven | _tool_turns(traj, proven)))
    shown = target if len(target) <= 60 else target[:57] + "..."
    return Provenance(
        frozenset(),
        f"{NO_PROVENANCE}: the answer {shown!r} is in none of the run's {len(texts)} "
        "completions, nor in the output of code one of them wrote",
    )


def _tool_turns(traj: Trajectory, proven: set[int]) -> set[int]:
    """The calls with tool calls whose conversation a proven call continues (module docstring),
    found from the last proven call back, so a chain of tool turns is followed whole."""
    calls: list[dict[str, Any]] = []  # the model events, each with the tool events after it
    for e in traj.events:
        if e.get("kind") == "model":
            calls.append({**e, "_after": []})
        elif e.get("kind") == "tool" and calls:
            calls[-1]["_after"].append(e)
    found: set[int] = set()
    todo = sorted(proven, reverse=True)
    while todo:
        j = todo.pop(0)
        for i in range(j):
            if i not in proven and i not in found and _continues(calls, i, j):
                found.add(i)
                todo.append(i)
        todo.sort(reverse=True)
    return found


def _continues(calls: list[dict[str, Any]], i: int, j: int) -> bool:
    """Whether call j's prompt carries on call i's tool turn (module docstring): i's prompt,
    then i's reply as the assistant message (its text, exactly its tool calls), then only
    results the broker returned for those very calls; j sampled as i was. Every record is
    data that may have any shape (a harness's messages; a trajectory read back from disk)."""
    turn, later = calls[i], calls[j]
    own = turn.get("tool_calls")
    prompt, messages = turn.get("messages"), later.get("messages")
    if not own or not isinstance(own, list) or not isinstance(prompt, list) \
            or not isinstance(messages, list) or _sampling(turn) != _sampling(later):  # fmt: skip
        return False
    n = len(prompt)
    if len(messages) < n + 2 or messages[:n] != prompt:
        return False
    said = messages[n]
    if not isinstance(said, dict) or said.get("role") != "assistant" \
            or said.get("content") != turn.get("text"):  # fmt: skip
        return False
    replayed = said.get("tool_calls")
    if not isinstance(replayed, list) or len(replayed) != len(own):
        return False
    wanted: dict[str, list[str]] = {}  # call id -> the texts a brokered result of it renders as
    served = [e for k in range(i, j) for e in calls[k]["_after"]]
    for t, o in zip(replayed, own, strict=True):
        if not isinstance(o, dict) or not all(isinstance(o.get(k), str) for k in _CALL_KEYS):
            return False
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or (t.get("id"), f.get("name"), f.get("arguments")) \
                != tuple(o[k] for k in _CALL_KEYS):  # fmt: skip
            return False
        wanted[o["id"]] = [r for e in served if _serves(e, o) for r in _renderings(e["result"])]
    answers = [m for m in messages[n + 1:]
               if isinstance(m, dict) and m.get("role") == "tool"
               and m.get("tool_call_id") in wanted]  # fmt: skip
    # every result shown for this turn's calls is one the broker returned for that call: a
    # harness cannot write "the answer is 42" as a tool result and get the turn trained on
    return bool(answers) and all(m.get("content") in wanted[m["tool_call_id"]] for m in answers)


_CALL_KEYS = ("id", "name", "arguments")


def _sampling(call: dict[str, Any]) -> Any:
    """What must match along a chain: the sampling (less the length cap) and the tools."""
    params = call.get("params")
    params = {k: v for k, v in params.items() if k != "max_tokens"} if isinstance(params, dict) \
        else params  # fmt: skip
    return params, call.get("tools")


def _serves(event: dict[str, Any], call: dict[str, str]) -> bool:
    """A brokered tool event that ran the model's call: its name, its arguments, no error."""
    try:
        args = json.loads(call["arguments"])
    except (ValueError, RecursionError):
        return False
    return event.get("name") == call["name"] and event.get("error") is None \
        and event.get("args") == args  # fmt: skip


def _renderings(result: Any) -> list[str]:
    """The texts a harness sends a tool's result back as: the text itself, or its JSON."""
    out = [result] if isinstance(result, str) else []
    try:
        out += [json.dumps(result), json.dumps(result, ensure_ascii=False),
                json.dumps(result, separators=(",", ":"), ensure_ascii=False)]
    except (TypeError, ValueError, RecursionError):
        pass
    return out


def _is_work(block: str) -> bool:
    """Whether a fenced block can be the work behind an answer: Python that parses and holds a
    statement other than imports, `pass` and bare constants (a block of imports, a comment or
    prose in a fence is not)."""
    if len(_squeezed(block)) < MIN_BLOCK_CHARS:
        return False
    try:
        tree = ast.parse(block)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    idle = (ast.Import, ast.ImportFrom, ast.Pass)
    return any(not isinstance(st, idle)
               and not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))
               for st in tree.body)  # fmt: skip


def _code_and_stdout(event: dict[str, Any]) -> tuple[str | None, str | None]:
    args, result = event.get("args"), event.get("result")
    code = args.get("code") if isinstance(args, dict) else None
    out = result.get("stdout") if isinstance(result, dict) else None
    return (code if isinstance(code, str) else None), (out if isinstance(out, str) else None)
