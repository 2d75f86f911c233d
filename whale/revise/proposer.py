"""The proposer: any chat model, asked G times (concurrently) for an edit of the harness.

The prompt is the paper's x_t: the task description, the harness source and the execution
report, with the exact `env` API and the edit format. The default template
(`prompts/proposer.txt`, `template = "default"`) shows the block format with placeholders, not
code, and says nothing about which change to make: small proposers copy whatever example they
are shown (measured here: with an example that only renamed a variable, the embedded 1.5B
proposed that rename). `template = "hinted"` (`prompts/proposer_hinted.txt`) is a human prior a
user names: it says that small solvers wrap answers in prose and slip in arithmetic, and shows
a worked interpreter-loop edit; no command defaults to it. The API section
(`{api}` in the template) is built from the tools the task really hands a run (`task_tools`:
python always, retrieve when the task has a retriever) and the budget numbers, so that a QA
harness's proposer learns of `env.tools.retrieve` and an RG one is not told of a tool it lacks.
The user's own tools (`runtime.tools`: callables and MCP servers) are listed too, each from
its signature and first docstring paragraph with its budget (`ToolSpec.describe`), and the
allowed packages (`runtime.packages`) by name, in one line; without them the section is word
for word what it was. A custom template without `{api}` gets no API
section.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

from whale.config import ConfigError, at_least, at_most, check_choices
from whale.errors import WhaleError
from whale.harness import Budget
from whale.harness.bundle import ENTRY, BundleError, files_of, is_bundle
from whale.harness.tools.spec import ToolSpec
from whale.models import ChatModel, ModelError, Sampling
from whale.models.base import (
    MAX_TEMPERATURE,
    Completion,
    ContextOverflow,
    PartialBatch,
    chat_n,
    failure_cause,
    shares_prompt,
)
from whale.revise.edits import SEARCH
from whale.revise.grammar import GrammarUse, edit_grammar


@dataclass(frozen=True)
class ProposerConfig:
    temperature: float = 0.7
    max_tokens: int = 1024
    # "default" (the paper's x_t, no hint), "hinted" (a human prior: a hint and a worked
    # fix), another file in whale/revise/prompts, or a path (any name with a "/").
    template: str = "default"
    concurrency: int = 4
    # Constrain the answer to the edit format with a grammar (see grammar.py): "auto" does so
    # for llama.cpp backends (the embedded default), "on" always, "off" never.
    grammar: GrammarUse = "auto"
    # Blocks the grammar allows. Under a 3-block grammar the 1.5B often wrote overlapping
    # blocks (docs/measurements.md).
    grammar_blocks: int = 1

    def validate(self) -> None:
        """Ranges; the temperature's is Sampling's (a value no server gets is refused here)."""
        at_least(self, 0.0, "temperature")
        at_most(self, MAX_TEMPERATURE, "temperature")
        at_least(self, 1, "max_tokens", "concurrency", "grammar_blocks")
        check_choices(self)
        try:
            load_template(self.template)
        except (OSError, ValueError) as e:
            raise ConfigError(f"template: {self.template!r} is neither a name of "
                              f"{', '.join(TEMPLATES)} nor a readable file ({e})") from None


TEMPLATES = {"default": "proposer.txt", "hinted": "proposer_hinted.txt"}


def load_template(name: str) -> str:
    """A named template (`TEMPLATES`), a file of whale/revise/prompts, or a path."""
    name = TEMPLATES.get(name, name)
    if "/" in name:
        with open(name, encoding="utf-8") as f:
            return f.read()
    return resources.files("whale.revise").joinpath("prompts", name).read_text(encoding="utf-8")


Tool = str | ToolSpec  # whale's own tools by name; the user's by their spec


def task_tools(task: Any, runtime: Any = None) -> tuple[Tool, ...]:
    """The tools a run of `task` gets, as the evaluator hands them out (evaluate.py passes the
    task's `retriever`, when it has one, to every run): python always, retrieve when the task
    has a retriever, then the user tools of `runtime` (a Runtime: `tool_specs()`). Reading
    `task.retriever` may build (and cache) the task's index; the feedback run that precedes
    the prompt has already done so (and started the tools process)."""
    own: tuple[Tool, ...] = ("python", "retrieve") if task.retriever is not None else ("python",)
    specs = runtime.tool_specs() if runtime is not None else ()
    return own + tuple(specs)


def api_section(tools: Sequence[Tool], budget: Budget, packages: Sequence[str] = ()) -> str:
    """The `env` API a harness of a task with `tools` may use, with its budget per question,
    and the packages it may import beside the standard library (`Runtime.package_names()`)."""
    retrieve = "retrieve" in tools
    user = [t for t in tools if isinstance(t, ToolSpec)]
    lines = [
        "- `env.llm(messages, max_tokens=None, temperature=None, stop=None)`: calls the solver. "
        '`messages` is a list of {"role": "system"|"user"|"assistant", "content": str} (or one '
        "string). Returns a reply that IS a str (the text) and also has `.text` and "
        '`.finish_reason` ("stop" or "length").',
        "- `env.tools.python(code, timeout=10)`: runs Python code in a fresh sandbox; returns a "
        "str of what it printed (stdout, then stderr and any error), with `.stdout`, `.stderr`, "
        "`.error`.",
    ]
    if retrieve:
        lines.append(
            "- `env.tools.retrieve(query, k=5)`: searches the task's passage corpus (BM25) and "
            'returns a list of at most k (capped at 50) passages, best first, each a dict {"id", '
            '"title", "text", "score"}. An empty query returns [] and costs nothing.'
        )
    lines += [t.describe() for t in user]
    left = ["`.model_calls`", "`.tool_calls`"] + (["`.retrievals`"] if retrieve else [])
    if user:
        left.append("`.tools` (a dict: calls left of each tool above, by its name)")
    lines.append(f"- `env.budget`: what is left: {', '.join(left)}, `.seconds`.")
    spend = [f"{budget.model_calls} model calls", f"{budget.tool_calls} python calls"]
    if retrieve:
        spend.append(f"{budget.retrievals} retrievals")
    if user:
        spend.append("the calls listed for each tool above")
    lines.append(
        f"Nothing else exists on `env`. Budget per question: {', '.join(spend)}; a call past "
        "the budget ends the run."
    )
    if packages:
        lines.append("Packages the harness may import beside the standard library: "
                     f"{', '.join(packages)}.")  # fmt: skip
    return "\n".join(lines)


def render(
    template: str,
    description: str,
    source: str,
    report: str,
    budget: Budget,
    tools: Sequence[Tool] = ("python",),
    packages: Sequence[str] = (),
) -> str:
    """The prompt: each `{name}` of the template replaced by its part, in one pass, so that a
    harness, description or report holding "{report}" or "{api}" is shown as it is. A harness
    of several files is shown file by file, each under its name (`{harness}`), with the rule
    that a block names its file (`{file_rule}`, `{search_line}`); for one file these read as
    the template always did. `{source}` is the harness's text as it is (a bundle with its
    header lines), for templates of your own."""
    values = {
        "api": api_section(tools, budget, packages),
        "description": description,
        "source": source.rstrip(),
        "report": report,
        "model_calls": str(budget.model_calls),
        "tool_calls": str(budget.tool_calls),
        "retrievals": str(budget.retrievals),
        **harness_parts(source),
    }
    pattern = "|".join(re.escape("{" + k + "}") for k in values)
    return re.sub(pattern, lambda m: values[m.group(0)[1:-1]], template)


def harness_parts(source: str) -> dict[str, str]:
    """How the template's harness placeholders read for `source`: one file, or a bundle (a
    bundle that is not valid, which no run accepts, is shown as the text it is)."""
    try:
        files = files_of(source) if is_bundle(source) else {}
    except BundleError:
        files = {}
    if not files:
        return {"harness_is": "The harness is one Python file that defines",
                "harness": f"```python\n{source.rstrip()}\n```", "file_rule": "",
                "search_line": SEARCH}  # fmt: skip
    shown = "\n\n".join(f"File {path}:\n```python\n{text.rstrip()}\n```"
                         for path, text in files.items())  # fmt: skip
    return {
        "harness_is": (
            "The harness is a folder of Python files, shown below file by file. Its entry file, "
            f"{ENTRY}, imports the others as modules by their names (`import util` for util.py, "
            "`from helpers import text` for helpers/text.py) and defines"
        ),
        "harness": shown,
        "file_rule": (
            " Each block names the file it edits after SEARCH on its first line, "
            f"`{SEARCH} FILE_NAME` (a block that names none edits {ENTRY})."
        ),
        "search_line": f"{SEARCH} FILE_NAME",
    }


@dataclass
class Proposal:
    text: str
    seed: int
    finish_reason: str
    error: str | None = None
    tokens: int = 0


def the_proposers_own(error: str) -> bool:
    """Whether a failed proposal (its error as text, "Type: message") is an outcome of the
    proposer on this prompt, which a reading counts as an edit that made no harness: the
    prompt does not fit its context (ContextOverflow), and asking again would fail the same
    way. Any other failure (a timeout, an unreachable server, a missing model, a server error)
    is the machinery's, which must not be read as the proposer's."""
    return error.split(":", 1)[0] == ContextOverflow.__name__


class ProposalsFailed(WhaleError):
    """Proposals whose calls failed (a timeout, an unreachable server: not `the_proposers_own`)
    where a reading must not count them as rejected edits; its `__cause__` is `failure_cause`
    of their errors, so an unattended runner resumes a transient one."""

    @classmethod
    def of(
        cls, where: str, errors: Sequence[str], asked: int, rerun: str = "the command"
    ) -> ProposalsFailed:
        """`errors`: those of the failed proposals (at least one), of `asked`; `where`: what
        asked for them ("round 3", "teacher", "evaluate sft on ctx"); `rerun`: what to run
        again to ask for them."""
        e = cls(f"{where}: {len(errors)} of {asked} proposal(s) failed (first: {errors[0]}); "
                f"run {rerun} again to ask for them")  # fmt: skip
        e.__cause__ = failure_cause(errors)
        return e


class Proposer:
    def __init__(self, model: ChatModel, cfg: ProposerConfig = ProposerConfig()) -> None:
        self.model, self.cfg = model, cfg
        self.template = load_template(cfg.template)

    def prompt(
        self,
        description: str,
        source: str,
        report: str,
        budget: Budget,
        tools: Sequence[Tool] = ("python",),
        packages: Sequence[str] = (),
    ) -> str:
        """`tools`: what a run of the task gets (`task_tools(task, runtime)`); `packages`:
        what it may import beside the standard library (`runtime.package_names()`)."""
        return render(self.template, description, source, report, budget, tools, packages)

    def uses_grammar(self) -> bool:
        if self.cfg.grammar == "auto":
            return self.model.name.startswith("embedded:")
        return self.cfg.grammar == "on"

    def shares_prompt(self) -> bool:
        """Whether G proposals are asked for in one request (see `propose`)."""
        return shares_prompt(self.model, self._sampling(0, None))

    def _sampling(self, seed: int, grammar: str | None) -> Sampling:
        return Sampling(max_tokens=self.cfg.max_tokens, temperature=self.cfg.temperature,
                        seed=seed, grammar=grammar)  # fmt: skip

    def propose(self, prompt: str, g: int, seed: int, parent: str | None = None) -> list[Proposal]:
        """G samples with seeds seed, seed+1, ...; a failed call is a Proposal with its error.
        With a grammar, `parent` (the harness source) fixes what SEARCH may copy. Where the
        model shares the prompt among samples (`models.base.shares_prompt`: the embedded
        native server, for sampled calls) the G are one request, the prompt processed once
        (`concurrency` is then the server's slots); else `concurrency` calls at a time."""
        grammar = None
        if parent is not None and self.uses_grammar():
            grammar = edit_grammar(parent, max_blocks=self.cfg.grammar_blocks)

        messages = [{"role": "user", "content": prompt}]

        def sampling(i: int) -> Sampling:
            return self._sampling(seed + i, grammar)

        def made(i: int, c: Completion) -> Proposal:
            return Proposal(
                c.text.encode("utf-8", "replace").decode("utf-8"),  # no lone surrogates
                seed + i, c.finish_reason, None, int(c.usage.get("completion_tokens", 0))
            )  # fmt: skip

        if g > 1 and shares_prompt(self.model, sampling(0)):
            # One request for all G (the backend processes the prompt once): proposal i is
            # still the sample of seed + i, cached under that seed; a failure fails all G.
            try:
                done = chat_n(self.model, messages, sampling(0), g)
            except ModelError as e:  # the ones a partial failure returned are kept
                kept = e.done if isinstance(e, PartialBatch) else []
                # named by what failed (a timeout), not by the batches that carried it (the
                # response cache wraps the backend's PartialBatch in its own)
                cause: BaseException = e
                while isinstance(cause, PartialBatch) and isinstance(cause.__cause__, ModelError):
                    cause = cause.__cause__
                return [made(i, c) for i, c in enumerate(kept)] + [
                    Proposal("", seed + i, "error", f"{type(cause).__name__}: {e}")
                    for i in range(len(kept), g)]  # fmt: skip
            return [made(i, c) for i, c in enumerate(done)]

        def one(i: int) -> Proposal:
            try:
                c = self.model.chat(messages, sampling(i))
            except ModelError as e:
                return Proposal("", seed + i, "error", f"{type(e).__name__}: {e}")
            return made(i, c)

        with ThreadPoolExecutor(max_workers=max(1, min(g, self.cfg.concurrency))) as pool:
            return list(pool.map(one, range(g)))

    def ask_missing(self, prompt: str, missing: Sequence[int], seed: int,
                    parent: str | None = None) -> dict[int, Proposal]:  # fmt: skip
        """Proposals for the indices `missing` (ascending) of a set whose proposal i has seed
        `seed + i`: where the backend shares the prompt among samples (`shares_prompt`), each
        run of consecutive indices in one `propose`, the runs side by side; else one call per
        index, `concurrency` at a time. What a resumed round or context asks for."""
        runs: list[list[int]] = []
        for i in missing:
            if runs and runs[-1][-1] == i - 1 and self.shares_prompt():
                runs[-1].append(i)
            else:
                runs.append([i])

        def some(run: list[int]) -> list[Proposal]:
            return self.propose(prompt, len(run), seed + run[0], parent)

        with ThreadPoolExecutor(max_workers=max(1, min(len(runs), self.cfg.concurrency))) as pool:
            asked = [p for made in pool.map(some, runs) for p in made]
        return dict(zip(missing, asked, strict=True))
