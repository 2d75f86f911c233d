"""The proposer agent: a tool-calling session over the archive that ends in one submission.

Each step the model makes one call, as an OpenAI function call (`function_call`) or in the text
protocol (`tools.parse_call`); `AgentConfig.protocol` "auto" gives the embedded llama.cpp
models the text protocol, constrained by `call_grammar` (their server has no function-calling
template), and any other backend function calling. Read-only calls are answered from
`ArchiveTools` (cut to a character budget), a malformed reply is answered
with what was wrong, and `submit` ends the session with a candidate: SEARCH/REPLACE edits
against a named base candidate, or a whole harness in a fenced block, made into source by
`whale.revise.edits.apply_edits` (the same Apply as the revision loop). The session has a step
budget and a completion-token budget; past either it ends with no submission, and says so.
Every session (messages, calls, arguments, outputs, tokens) is written as JSON: training data.
The history keeps a function call as its text form, so any server can read it back.

A call is untrusted input: whatever it is, the agent gets an `error:` reply and the session
goes on. Each call is reported to `on_step` before it runs (its output None) and again with
its output, so a resumed session finds a call that was running when whale stopped (a crash, a
kill) and answers it with an error instead of running it again: no call can end every resume.
When the history outgrows the proposer's context (`ContextOverflow`), the oldest tool results
are trimmed from what is sent, one at a time, keeping the system prompt, the brief and the
latest result; the session keeps them all. When even that does not fit, the session ends,
"context overflow", and its candidate with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from whale.config import at_least, at_most, check_choices
from whale.harness.tools.spec import ToolSpec, describe_tools
from whale.metaharness.archive import ArchiveError
from whale.metaharness.tools import (
    PROTOCOL_HELP,
    TOOL_NAMES,
    ArchiveTools,
    ToolCall,
    ToolRefused,
    load_args,
    parse_call,
    valid_text,
)
from whale.models import ChatModel, Completion, ContextOverflow, ModelError, Sampling
from whale.models.base import MAX_TEMPERATURE
from whale.records import record_dir, write_atomic
from whale.revise.edits import apply_edits
from whale.revise.grammar import REPLACE_RULES, GrammarUse, searched

# One optional line of thought, then the CALL line with flat JSON arguments (strings and
# integers). Only submit takes a body, and under the grammar it is one SEARCH/REPLACE block whose
# SEARCH is a run of whole lines of the named base's harness (as the revision loop's grammar
# does for its parent), for each of the bases offered. Without the base's lines in the grammar
# the embedded 1.5B's submissions searched for lines the base does not have, mostly copied
# from the prompt's format example (docs/measurements.md).
_LOOK = r"""
root ::= (thought "\n")? (look | submit)
thought ::= [^C\n] [^\n]{0,300}
look ::= "CALL " tool " " obj
tool ::= TOOLS
obj ::= "{}" | "{" pair (", " pair){0,3} "}"
pair ::= str ": " (str | int)
str ::= "\"" [^"\\\n]{0,200} "\""
int ::= [0-9]{1,6}
""".replace("TOOLS", " | ".join(f'"{t}"' for t in TOOL_NAMES if t != "submit")).lstrip()


def call_grammar(bases: dict[str, str]) -> str:
    """The GBNF of one reply: a read-only call, or a submit against one of `bases` (id ->
    source) whose SEARCH copies a run of that base's own lines."""
    rules = [_LOOK.rstrip("\n"), "submit ::= " + " | ".join(f"sub{k}" for k in range(len(bases)))]
    for k, (cid, source) in enumerate(bases.items()):
        head = _literal_gbnf(f'CALL submit {{"base": "{cid}", "hypothesis": ')
        marked, searches = searched(source, prefix=f"b{k}-")  # a bundle's blocks name a file
        rules.append(f'sub{k} ::= {head} str "}}\\n" {marked} '
                     '"=======\\n" replace ">>>>>>> REPLACE\\n"')  # fmt: skip
        rules += searches
    rules += REPLACE_RULES
    return "\n".join(rules) + "\n"


def _fn(name: str, doc: str, **props: str) -> dict[str, Any]:
    types = {"k": "integer", "n": "integer", "start": "integer", "end": "integer"}
    return {"type": "function", "function": {"name": name, "description": doc, "parameters": {
        "type": "object", "required": [p for p in props if p in ("base", "hypothesis", "edits",
                                                                    "path", "pattern", "a", "b",
                                                                    "id")],
        "properties": {p: {"type": types.get(p, "string"), "description": d}
                       for p, d in props.items()}}}}  # fmt: skip


# The same tools as the text protocol, as OpenAI function definitions.
TOOL_SCHEMAS = json.dumps([
    _fn("list", "List a folder of the archive.", path="folder, relative to the archive"),
    _fn("read", "Read a file, or a line range of it.", path="file", start="first line",
        end="last line"),
    _fn("grep", "Find a fixed text (case-insensitive) in the archive's files.",
        pattern="the text", path="folder or file (default: all)"),
    _fn("diff", "Unified diff of two candidates' harness.py.", a="candidate id", b="candidate id"),
    _fn("top", "The best candidates by accuracy under the current weights.", k="how many"),
    _fn("failures", "Failing examples of a candidate with trajectory excerpts.",
        id="candidate id", n="how many"),
    _fn("task", "The task description."),
    _fn("submit", "Submit one new candidate; ends the session.", base="candidate id to edit",
        hypothesis="one line: what it changes and why",
        edits="SEARCH/REPLACE blocks against the base's harness.py"),
])  # fmt: skip


def _literal_gbnf(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


ToolProtocol = Literal["auto", "text", "functions"]  # AgentConfig.protocol
Example = Literal["default", "hinted"]  # the keys of EXAMPLES (below)


@dataclass(frozen=True)
class AgentConfig:
    max_steps: int = 8  # model replies per session
    max_tokens: int = 6000  # completion tokens per session
    step_tokens: int = 1024  # completion tokens per reply
    temperature: float = 0.7
    tool_chars: int = 3000  # each tool output is cut to this
    # "text": the CALL line protocol; "functions": OpenAI-style function calling (the reply's
    # tool_calls; a text CALL line is still read); "auto": text for the embedded llama.cpp
    # backends (their server has no function-calling template by default), functions else.
    protocol: ToolProtocol = "auto"
    grammar: GrammarUse = "auto"  # "auto": constrain llama.cpp backends (embedded:*), "on", "off"
    grammar_bases: int = 3  # under the grammar, submit may name one of the top-k candidates
    # The submit example of the system prompt: "default" (placeholders only, no change
    # suggested), "hinted" (a worked edit: a human prior).
    example: Example = "default"

    def validate(self) -> None:
        """Ranges; the temperature's is Sampling's (a value no server gets is refused here)."""
        at_least(self, 1, "max_steps", "max_tokens", "step_tokens", "tool_chars",
                 "grammar_bases")  # fmt: skip
        at_least(self, 0.0, "temperature")
        at_most(self, MAX_TEMPERATURE, "temperature")
        check_choices(self)


@dataclass
class Submission:
    hypothesis: str
    base: str | None
    text: str  # the submit body: edits or a fenced harness
    source: str | None  # the candidate's source when Apply made one
    valid: bool
    reason: str = ""
    mode: str = "none"


@dataclass
class Session:
    iteration: int
    index: int
    seed: int
    messages: list[dict[str, str]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    # "submitted", "step budget", "token budget", "model error: ...", "context overflow: ...",
    # "failed: ..." (a failure whale does not know: it ends this candidate, not the search)
    ended: str = ""
    submission: Submission | None = None
    trimmed: int = 0  # the oldest tool results left out of what is sent (context overflow)

    def save(self, path: Path) -> None:
        """Whole or not at all. Saved after every step, so shallow and unindented: a deep copy
        (`asdict`) and an indented dump put the search's own time over its target
        (benchmarks/search_overhead.py; docs/measurements.md)."""
        record_dir(path.parent)  # never through a linked sessions/ folder
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.submission is not None:
            record["submission"] = asdict(self.submission)
        write_atomic(path, json.dumps(record))


SYSTEM = """You improve a harness: a Python program `run(question, env) -> str` that uses a \
solver model to answer questions of one task. In the harness, `env.llm(messages, \
max_tokens=None, temperature=None, stop=None)` calls the solver and returns its reply (a str \
with `.text`); `env.tools.python(code, timeout=10)` runs Python code in a sandbox and returns \
what it printed (`.stdout`){retrieve}. The harness may use {imports}.

Earlier candidates are in an archive you can read; each folder cNNNN/ holds harness.py, \
meta.json (accuracy on the search questions, parent, hypothesis), outcomes.jsonl (each \
question: answer, correct, score, status, error) and trajectories.jsonl (the solver's prompts \
and replies).

Tools (read-only, paths relative to the archive):
- list {"path": "."}   - read {"path": "c0000/harness.py", "start": 1, "end": 40}
- grep {"pattern": "fixed text", "path": "."}   - diff {"a": "c0000", "b": "c0001"}
- top {"k": 5}   - failures {"id": "c0000", "n": 3}   - task {}
- submit {"base": "cNNNN", "hypothesis": "one line"}, then on the next lines SEARCH/REPLACE \
blocks against that candidate's harness.py (SEARCH copies whole lines exactly).

{protocol} You have {steps} replies in all; the last one must be a submit. The form of a \
submit, with placeholders in capitals:

{example}"""

# The default submit example shows the form only, with placeholders: a small proposer copies
# the code it is shown (with the worked example below as the only one, the 1.5B agent's edits
# were answer clean-ups like it: docs/commands/search.md). "hinted" is that example, a human
# prior a user names.
EXAMPLES: dict[Example, str] = {
    "default": """CALL submit {"base": "BASE_ID", "hypothesis": "ONE LINE: WHAT IT CHANGES AND WHY"}
<<<<<<< SEARCH
LINES COPIED FROM THE BASE HARNESS
=======
THE NEW LINES
>>>>>>> REPLACE
""",
    "hinted": 'CALL submit {"base": "c0003", "hypothesis": "answers end with a period the '
    'grader rejects"}\n' """<<<<<<< SEARCH
    return answer
=======
    return answer.rstrip(".")
>>>>>>> REPLACE
""",
}


def function_call(calls: list[dict[str, str]]) -> ToolCall:
    """The first function call of a reply as a ToolCall (submit's `edits` become its body), or
    ToolRefused saying what is wrong."""
    first = calls[0]
    if not isinstance(first, dict):
        raise ToolRefused("a function call must be an object with a name and arguments")
    name = valid_text(str(first.get("name") or ""))
    if name not in TOOL_NAMES:
        raise ToolRefused(f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}")
    args = load_args(name, first.get("arguments") or "{}")
    body = str(args.pop("edits", "")) if name == "submit" else ""
    return ToolCall(name, args, body)


def _read_call(c: Completion, text: str) -> tuple[ToolCall | None, str]:
    """The reply's call, or None and the error the agent reads; never raises (a reply is
    untrusted input, and one that raised ended the search)."""
    try:
        return (function_call(c.tool_calls) if c.tool_calls else parse_call(text)), ""
    except ToolRefused as e:
        return None, f"error: {e}"
    except Exception as e:  # not foreseen: the agent reads it, the session goes on
        return None, f"error: the call could not be read ({type(e).__name__}: {str(e)[:300]})"


def trimmed_view(messages: list[dict[str, str]], n: int) -> list[dict[str, str]]:
    """`messages` with the `n` oldest tool results (user messages after the brief) replaced by
    a short note: what is sent when the whole history does not fit the proposer's context."""
    out, left = [], n
    for k, m in enumerate(messages):
        if left > 0 and k >= 2 and m["role"] == "user":
            left -= 1
            note = (f"RESULT:\n[older result trimmed to fit the context ({len(m['content'])} "
                    "chars); call the tool again to see it]")  # fmt: skip
            if len(note) < len(m["content"]):  # a short result is kept: the note is no shorter
                m = {"role": "user", "content": note}
        out.append(m)
    return out


def _trimmable(messages: list[dict[str, str]]) -> int:
    """How many tool results may be trimmed: all but the latest (the brief, messages[1], never)."""
    return max(0, sum(m["role"] == "user" for m in messages[2:]) - 1)


PENDING = ("error: whale stopped while this call was running (a crash or a kill), so it is not "
           "run again")


def imports(packages: Sequence[str]) -> str:
    """What the system prompt says a harness may import."""
    if not packages:
        return "the standard library only"
    return f"the standard library and these packages only: {', '.join(packages)}"


class ProposerAgent:
    def __init__(self, model: ChatModel, tools: ArchiveTools, cfg: AgentConfig = AgentConfig(),
                 retrieval: bool = False, user_tools: Sequence[ToolSpec] = (),
                 packages: Sequence[str] = ()) -> None:  # fmt: skip
        self.model, self.tools, self.cfg, self.retrieval = model, tools, cfg, retrieval
        # The user's tools (runtime.tools): the `task` tool lists them after the description,
        # in the proposer's words (ToolSpec.describe); the system prompt is left as it is.
        self.user_tools = tuple(user_tools)
        # The allowed packages (runtime.packages, `Runtime.package_names()`): named where the
        # system prompt says what a harness may import; without them it is as it was.
        self.packages = tuple(packages)

    def task_text(self, reply: str) -> str:
        """What the `task` tool answers: the description, then the user's tools if any."""
        if not self.user_tools:
            return reply
        return (f"{reply}\n\nTools of this task a harness may call, beside env.llm and "
                f"env.tools.python:\n{describe_tools(self.user_tools)}")  # fmt: skip

    def uses_grammar(self) -> bool:
        if self.uses_functions():
            return False
        if self.cfg.grammar == "auto":
            return self.model.name.startswith("embedded:")
        return self.cfg.grammar == "on"

    def uses_functions(self) -> bool:
        if self.cfg.protocol == "auto":
            return not self.model.name.startswith("embedded:")
        return self.cfg.protocol == "functions"

    def run(self, iteration: int, index: int, seed: int, brief: str,
            resume: Session | None = None,
            on_step: Callable[[Session], None] | None = None) -> Session:  # fmt: skip
        """One session; `brief` says where the search stands (the top candidates). `on_step`
        is called before each call runs and after every step (the loop saves the session
        there), and `resume`, such a saved session, goes on from its last step, so a killed
        session pays again at most the reply that was in flight, and runs no call twice."""
        if resume is not None:
            if resume.calls and resume.calls[-1].get("output") is None:
                # The call in flight when whale stopped may be what stopped it: answered, not
                # run again, so that no call can end every resume.
                resume.calls[-1]["output"] = PENDING
                self._answer(resume, len(resume.calls) - 1, PENDING, on_step)
            return self._steps(resume, len(resume.calls), seed, on_step)
        s = Session(iteration, index, seed)
        retrieve = (", and `env.tools.retrieve(query, k=5)` returns passages {id, title, text}"
                    if self.retrieval else "")  # fmt: skip
        functions = self.uses_functions()
        protocol = "Call exactly one tool per reply." if functions else PROTOCOL_HELP
        system = (SYSTEM.replace("{protocol}", protocol)
                  .replace("{steps}", str(self.cfg.max_steps)).replace("{retrieve}", retrieve)
                  .replace("{imports}", imports(self.packages))
                  .replace("{example}", EXAMPLES[self.cfg.example]))
        s.messages = [{"role": "system", "content": system},
                      {"role": "user", "content": brief}]  # fmt: skip
        return self._steps(s, 0, seed, on_step)

    def _steps(self, s: Session, start: int, seed: int,
               on_step: Callable[[Session], None] | None) -> Session:  # fmt: skip
        functions = self.uses_functions()
        grammar = None
        if self.uses_grammar():
            top = self.tools.archive.top(self.cfg.grammar_bases)
            grammar = call_grammar({m.id: self.tools.archive.source(m.id) for m in top})
        for step in range(start, self.cfg.max_steps):
            left = self.cfg.max_tokens - s.tokens
            if left <= 0:
                s.ended = "token budget"
                return s
            sampling = Sampling(max_tokens=min(self.cfg.step_tokens, left),
                                temperature=self.cfg.temperature, seed=seed + step,
                                grammar=grammar,
                                tools=TOOL_SCHEMAS if functions else None)  # fmt: skip
            c = self._chat(s, sampling)
            if c is None:
                return s
            s.tokens += c.charged_tokens(sampling.max_tokens)
            text = valid_text(c.text)
            call, reply = _read_call(c, text)
            if call is not None and c.tool_calls:
                # The history holds a function call as its text form, so that any server can
                # read it back (no tool-call ids to keep consistent across backends).
                text = f"CALL {call.name} {json.dumps(call.args)}"
                text += f"\n{call.body}" if call.body else ""
            s.messages.append({"role": "assistant", "content": text})
            name, args = (call.name, call.args) if call is not None else (None, {})
            s.calls.append({"step": step, "name": name, "args": args, "output": None})
            if call is not None:
                if on_step is not None:  # recorded before it runs: see the module docstring
                    on_step(s)
                if call.name == "submit":
                    s.submission = self._submit(call.args, call.body)
                    s.calls[-1]["output"] = s.submission.reason or "accepted"
                    s.ended = "submitted"
                    return s
                reply = self.tools.call(call)
                if call.name == "task":
                    reply = self.task_text(reply)
            s.calls[-1]["output"] = reply
            self._answer(s, step, reply, on_step)
        s.ended = "step budget"
        return s

    def _chat(self, s: Session, sampling: Sampling) -> Completion | None:
        """The model's reply to the session's history, trimmed as far as it must be to fit the
        context; None, with `s.ended` saying why, when there is none."""
        while True:
            try:
                return self.model.chat(trimmed_view(s.messages, s.trimmed), sampling)
            except ContextOverflow as e:
                if s.trimmed >= _trimmable(s.messages):
                    s.ended = (f"context overflow: the brief and the latest step do not fit the "
                               f"proposer's context ({str(e)[:300]})")  # fmt: skip
                    return None
                s.trimmed += 1
            except ModelError as e:
                s.ended = f"model error: {type(e).__name__}: {e}"
                return None

    def _answer(self, s: Session, step: int, reply: str,
                on_step: Callable[[Session], None] | None) -> None:  # fmt: skip
        remaining = self.cfg.max_steps - step - 1
        note = "\n(Your next reply is the last: it must be a submit.)" if remaining == 1 else ""
        s.messages.append({"role": "user", "content": f"RESULT:\n{reply}{note}"})
        if on_step is not None:
            on_step(s)

    def _submit(self, args: dict[str, Any], body: str) -> Submission:
        hypothesis = str(args.get("hypothesis", "")).strip().split("\n")[0][:300]
        base = args.get("base")
        if not isinstance(base, str):
            return Submission(hypothesis, None, body, None, False, "submit needs a base id")
        try:
            parent = self.tools.archive.source(base)
        except ArchiveError as e:
            return Submission(hypothesis, base, body, None, False, f"submit: {e}")
        try:
            res = apply_edits(parent, body)
        except Exception as e:  # not foreseen: an invalid candidate with its reason
            why = f"submit failed ({type(e).__name__}: {str(e)[:300]})"
            return Submission(hypothesis, base, body, None, False, why)
        if not res.ok:
            return Submission(hypothesis, base, body, None, False, res.reason, res.mode)
        return Submission(hypothesis, base, body, res.source, True, "", res.mode)
