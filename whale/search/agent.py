"""The proposer agent: a tool-calling session over the archive that ends in one submission.

Each step the model writes one call in the text protocol (`tools.parse_call`); read-only calls
are answered from `ArchiveTools` (cut to a character budget), a malformed reply is answered
with what was wrong, and `submit` ends the session with a candidate: SEARCH/REPLACE edits
against a named base candidate, or a whole harness in a fenced block, made into source by
`whale.revise.edits.apply_edits` (the same Apply as the revision loop). The session has a step
budget and a completion-token budget; past either it ends with no submission, and says so.
Every session (messages, calls, arguments, outputs, tokens) is written as JSON: training data.

Function calling for backends that support it is not wired yet: every backend gets the text
protocol, which the embedded llama.cpp models need anyway (constrained by `CALL_GRAMMAR`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale.models import ChatModel, ModelError, Sampling
from whale.revise.edits import apply_edits
from whale.search.archive import ArchiveError
from whale.search.tools import PROTOCOL_HELP, TOOL_NAMES, ArchiveTools, ToolRefused, parse_call

# One optional line of thought, then the CALL line with flat JSON arguments (strings and
# integers); only submit takes a body: SEARCH/REPLACE blocks or a fenced harness. Measured on the
# embedded 1.5B with a looser grammar (any text inside the braces), 2 of 4 replies put code
# with triple quotes in the arguments and ran to the token limit.
CALL_GRAMMAR = r"""
root ::= (thought "\n")? (look | submit)
thought ::= [^C\n] [^\n]{0,300}
look ::= "CALL " tool " " obj
tool ::= TOOLS
obj ::= "{}" | "{" pair (", " pair){0,3} "}"
pair ::= str ": " (str | int)
str ::= "\"" [^"\\\n]{0,200} "\""
int ::= [0-9]{1,6}
submit ::= "CALL submit {\"base\": \"c" [0-9]{4} "\", \"hypothesis\": " str "}\n" body
body ::= block block? | fence
block ::= "<<<<<<< SEARCH\n" line+ "=======\n" line* ">>>>>>> REPLACE\n"
fence ::= "```python\n" line+ "```\n"
line ::= [^<=>`\n] [^\n]* "\n" | "\n"
""".replace("TOOLS", " | ".join(f'"{t}"' for t in TOOL_NAMES if t != "submit")).lstrip()


@dataclass(frozen=True)
class AgentConfig:
    max_steps: int = 8  # model replies per session
    max_tokens: int = 6000  # completion tokens per session
    step_tokens: int = 1024  # completion tokens per reply
    temperature: float = 0.7
    tool_chars: int = 3000  # each tool output is cut to this
    grammar: str = "auto"  # "auto": constrain llama.cpp backends (embedded:*), "on", "off"


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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)


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


class ProposerAgent:
    def __init__(self, model: ChatModel, tools: ArchiveTools, cfg: AgentConfig = AgentConfig(),
                 retrieval: bool = False) -> None:  # fmt: skip
        self.model, self.tools, self.cfg, self.retrieval = model, tools, cfg, retrieval

    def uses_grammar(self) -> bool:
        if self.cfg.grammar == "auto":
            return self.model.name.startswith("embedded:")
        return self.cfg.grammar == "on"

    def run(self, iteration: int, index: int, seed: int, brief: str) -> Session:
        """One session; `brief` says where the search stands (the top candidates)."""
        s = Session(iteration, index, seed)
        retrieve = (", and `env.tools.retrieve(query, k=5)` returns passages {id, title, text}"
                    if self.retrieval else "")  # fmt: skip
        system = (SYSTEM.replace("{protocol}", PROTOCOL_HELP)
                  .replace("{steps}", str(self.cfg.max_steps)).replace("{retrieve}", retrieve))
        s.messages = [{"role": "system", "content": system},
                      {"role": "user", "content": brief}]  # fmt: skip
        grammar = CALL_GRAMMAR if self.uses_grammar() else None
        for step in range(self.cfg.max_steps):
            left = self.cfg.max_tokens - s.tokens
            if left <= 0:
                s.ended = "token budget"
                return s
            sampling = Sampling(max_tokens=min(self.cfg.step_tokens, left),
                                temperature=self.cfg.temperature, seed=seed + step,
                                grammar=grammar)  # fmt: skip
            try:
                c = self.model.chat(list(s.messages), sampling)
            except ModelError as e:
                s.ended = f"model error: {type(e).__name__}: {e}"
                return s
            s.tokens += int(c.usage.get("completion_tokens", 0))
            s.messages.append({"role": "assistant", "content": c.text})
            try:
                call = parse_call(c.text)
            except ToolRefused as e:
                reply = f"error: {e}"
                s.calls.append({"step": step, "name": None, "args": {}, "output": reply})
            else:
                if call.name == "submit":
                    s.submission = self._submit(call.args, call.body)
                    s.calls.append({"step": step, "name": "submit", "args": call.args,
                                    "output": s.submission.reason or "accepted"})  # fmt: skip
                    s.ended = "submitted"
                    return s
                reply = self.tools.call(call)
                s.calls.append({"step": step, "name": call.name, "args": call.args,
                                "output": reply})  # fmt: skip
            remaining = self.cfg.max_steps - step - 1
            note = "\n(Your next reply is the last: it must be a submit.)" if remaining == 1 else ""
            s.messages.append({"role": "user", "content": f"RESULT:\n{reply}{note}"})
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
