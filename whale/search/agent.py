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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from whale.models import ChatModel, ModelError, Sampling
from whale.records import write_atomic
from whale.revise.edits import apply_edits
from whale.revise.grammar import REPLACE_RULES, search_rules
from whale.search.archive import ArchiveError
from whale.search.tools import (
    PROTOCOL_HELP,
    TOOL_NAMES,
    ArchiveTools,
    ToolCall,
    ToolRefused,
    parse_call,
)

# One optional line of thought, then the CALL line with flat JSON arguments (strings and
# integers). Only submit takes a body, and under the grammar it is one SEARCH/REPLACE block whose
# SEARCH is a run of whole lines of the named base's harness (as the revision loop's grammar
# does for its parent), for each of the bases offered. Measured on the embedded 1.5B without
# the base's lines in the grammar: 6 of 6 submissions searched for lines the base does not have
# (3 iterations, M = 2, rg:basic_arithmetic), mostly copied from the prompt's format example.
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
        rules.append(f'sub{k} ::= {head} str "}}\\n" "<<<<<<< SEARCH\\n" b{k}-search '
                     '"=======\\n" replace ">>>>>>> REPLACE\\n"')  # fmt: skip
        rules += search_rules(source, prefix=f"b{k}-")
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
    _fn("top", "The best candidates by score.", k="how many"),
    _fn("failures", "Failing examples of a candidate with trajectory excerpts.",
        id="candidate id", n="how many"),
    _fn("task", "The task description."),
    _fn("submit", "Submit one new candidate; ends the session.", base="candidate id to edit",
        hypothesis="one line: what it changes and why",
        edits="SEARCH/REPLACE blocks against the base's harness.py"),
])  # fmt: skip


def valid_text(text: str) -> str:
    """A model's reply with lone surrogates (valid JSON escapes, not encodable text) replaced,
    so that the session, the archive and the harness files it may become can be written."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _literal_gbnf(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
    protocol: str = "auto"
    grammar: str = "auto"  # "auto": constrain llama.cpp backends (embedded:*), "on", "off"
    grammar_bases: int = 3  # under the grammar, submit may name one of the top-k candidates


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
    ended: str = ""  # "submitted", "step budget", "token budget", "model error: ..."
    submission: Submission | None = None

    def save(self, path: Path) -> None:
        """Whole or not at all. Saved after every step, so shallow and unindented: a deep copy
        (`asdict`) and an indented dump made the search's own time 5.7% of wall, over its 5%
        target (benchmarks/search_overhead.py)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.submission is not None:
            record["submission"] = asdict(self.submission)
        write_atomic(path, json.dumps(record))


SYSTEM = """You improve a harness: a Python program `run(question, env) -> str` that uses a \
small solver model to answer questions of one task. In the harness, `env.llm(messages, \
max_tokens=None, temperature=None, stop=None)` calls the solver and returns its reply (a str \
with `.text`); `env.tools.python(code, timeout=10)` runs Python code in a sandbox and returns \
what it printed (`.stdout`){retrieve}. The harness may use the standard library only.

Earlier candidates are in an archive you can read; each folder cNNNN/ holds harness.py, \
meta.json (score on the search questions, parent, hypothesis), outcomes.jsonl (each question: \
answer, score, status, error) and trajectories.jsonl (the solver's prompts and replies).

Tools (read-only, paths relative to the archive):
- list {"path": "."}   - read {"path": "c0000/harness.py", "start": 1, "end": 40}
- grep {"pattern": "fixed text", "path": "."}   - diff {"a": "c0000", "b": "c0001"}
- top {"k": 5}   - failures {"id": "c0000", "n": 3}   - task {}
- submit {"base": "cNNNN", "hypothesis": "one line"}, then on the next lines SEARCH/REPLACE \
blocks against that candidate's harness.py (SEARCH copies whole lines exactly).
The example below only shows the format; find your own change from the archive.

{protocol} You have {steps} replies in all; the last one must be a submit. An example of a \
submit, for some other harness:

CALL submit {"base": "c0003", "hypothesis": "answers end with a period the grader rejects"}
<<<<<<< SEARCH
    return answer
=======
    return answer.rstrip(".")
>>>>>>> REPLACE
"""


def function_call(calls: list[dict[str, str]]) -> ToolCall:
    """The first function call of a reply as a ToolCall (submit's `edits` become its body), or
    ToolRefused saying what is wrong."""
    first = calls[0]
    name = valid_text(first.get("name", ""))
    if name not in TOOL_NAMES:
        raise ToolRefused(f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}")
    try:
        args = json.loads(first.get("arguments") or "{}")
    except ValueError as e:
        raise ToolRefused(f"the arguments of {name} are not valid JSON ({e})") from None
    if not isinstance(args, dict):
        raise ToolRefused(f"the arguments of {name} must be a JSON object")
    body = str(args.pop("edits", "")) if name == "submit" else ""
    return ToolCall(name, args, valid_text(body))


class ProposerAgent:
    def __init__(self, model: ChatModel, tools: ArchiveTools, cfg: AgentConfig = AgentConfig(),
                 retrieval: bool = False) -> None:  # fmt: skip
        self.model, self.tools, self.cfg, self.retrieval = model, tools, cfg, retrieval

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
        is called after every step (the loop saves the session there), and `resume`, such a
        saved session, goes on from its last finished step, so a killed session pays again
        at most the reply that was in flight."""
        if resume is not None:
            return self._steps(resume, len(resume.calls), seed, on_step)
        s = Session(iteration, index, seed)
        retrieve = (", and `env.tools.retrieve(query, k=5)` returns passages {id, title, text}"
                    if self.retrieval else "")  # fmt: skip
        functions = self.uses_functions()
        protocol = "Call exactly one tool per reply." if functions else PROTOCOL_HELP
        system = (SYSTEM.replace("{protocol}", protocol)
                  .replace("{steps}", str(self.cfg.max_steps)).replace("{retrieve}", retrieve))
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
            try:
                c = self.model.chat(list(s.messages), sampling)
            except ModelError as e:
                s.ended = f"model error: {type(e).__name__}: {e}"
                return s
            s.tokens += int(c.usage.get("completion_tokens", 0))
            text = valid_text(c.text)
            call: ToolCall | None = None
            try:
                call = function_call(c.tool_calls) if c.tool_calls else parse_call(text)
            except ToolRefused as e:
                reply = f"error: {e}"
            if call is not None and c.tool_calls:
                # The history holds a function call as its text form, so that any server can
                # read it back (no tool-call ids to keep consistent across backends).
                text = f"CALL {call.name} {json.dumps(call.args)}"
                text += f"\n{call.body}" if call.body else ""
            s.messages.append({"role": "assistant", "content": text})
            if call is None:
                s.calls.append({"step": step, "name": None, "args": {}, "output": reply})
            elif call.name == "submit":
                s.submission = self._submit(call.args, call.body)
                s.calls.append({"step": step, "name": "submit", "args": call.args,
                                "output": s.submission.reason or "accepted"})  # fmt: skip
                s.ended = "submitted"
                return s
            else:
                reply = self.tools.call(call)
                s.calls.append({"step": step, "name": call.name, "args": call.args,
                                "output": reply})  # fmt: skip
            remaining = self.cfg.max_steps - step - 1
            note = "\n(Your next reply is the last: it must be a submit.)" if remaining == 1 else ""
            s.messages.append({"role": "user", "content": f"RESULT:\n{reply}{note}"})
            if on_step is not None:
                on_step(s)
        s.ended = "step budget"
        return s

    def _submit(self, args: dict[str, Any], body: str) -> Submission:
        hypothesis = str(args.get("hypothesis", "")).strip().split("\n")[0][:300]
        base = args.get("base")
        if not isinstance(base, str):
            return Submission(hypothesis, None, body, None, False, "submit needs a base id")
        try:
            parent = self.tools.archive.source(base)
        except ArchiveError as e:
            return Submission(hypothesis, base, body, None, False, f"submit: {e}")
        res = apply_edits(parent, body)
        if not res.ok:
            return Submission(hypothesis, base, body, None, False, res.reason, res.mode)
        return Submission(hypothesis, base, body, res.source, True, "", res.mode)
