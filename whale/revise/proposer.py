"""The proposer: any chat model, asked G times (concurrently) for an edit of the harness.

The prompt template is a file in the package (`prompts/proposer.txt`) and carries the exact
`env` API and a worked example of the block format, because small models asked plainly write
fenced rewrites and invent APIs (measured here on the embedded 0.5B and 1.5B).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources

from whale.harness import Budget
from whale.models import ChatModel, ModelError, Sampling
from whale.revise.grammar import edit_grammar


@dataclass(frozen=True)
class ProposerConfig:
    temperature: float = 0.7
    max_tokens: int = 1024
    template: str = "proposer.txt"  # a file in whale/revise/prompts, or a path
    concurrency: int = 4
    # Constrain the answer to the edit format with a grammar (see grammar.py): "auto" does so
    # for llama.cpp backends (the embedded default), "on" always, "off" never.
    grammar: str = "auto"
    # Blocks the grammar allows. Measured here, the 1.5B under a 3-block grammar wrote
    # overlapping blocks in 6 of 12 proposals (3 rounds on rg:basic_arithmetic).
    grammar_blocks: int = 1


def load_template(name: str) -> str:
    if "/" in name:
        with open(name, encoding="utf-8") as f:
            return f.read()
    return resources.files("whale.revise").joinpath("prompts", name).read_text(encoding="utf-8")


def render(template: str, description: str, source: str, report: str, budget: Budget) -> str:
    # str.replace, not str.format: harness sources are full of braces.
    values = {
        "{description}": description,
        "{source}": source.rstrip(),
        "{report}": report,
        "{model_calls}": str(budget.model_calls),
        "{tool_calls}": str(budget.tool_calls),
    }
    for key, value in values.items():
        template = template.replace(key, value)
    return template


@dataclass
class Proposal:
    text: str
    seed: int
    finish_reason: str
    error: str | None = None
    tokens: int = 0


class Proposer:
    def __init__(self, model: ChatModel, cfg: ProposerConfig = ProposerConfig()) -> None:
        self.model, self.cfg = model, cfg
        self.template = load_template(cfg.template)

    def prompt(self, description: str, source: str, report: str, budget: Budget) -> str:
        return render(self.template, description, source, report, budget)

    def uses_grammar(self) -> bool:
        if self.cfg.grammar == "auto":
            return self.model.name.startswith("embedded:")
        return self.cfg.grammar == "on"

    def propose(self, prompt: str, g: int, seed: int, parent: str | None = None) -> list[Proposal]:
        """G samples with seeds seed, seed+1, ...; a failed call is a Proposal with its error.
        With a grammar, `parent` (the harness source) fixes what SEARCH may copy."""
        grammar = None
        if parent is not None and self.uses_grammar():
            grammar = edit_grammar(parent, max_blocks=self.cfg.grammar_blocks)

        def one(i: int) -> Proposal:
            sampling = Sampling(
                max_tokens=self.cfg.max_tokens,
                temperature=self.cfg.temperature,
                seed=seed + i,
                grammar=grammar,
            )
            try:
                c = self.model.chat([{"role": "user", "content": prompt}], sampling)
            except ModelError as e:
                return Proposal("", seed + i, "error", f"{type(e).__name__}: {e}")
            return Proposal(
                c.text, seed + i, c.finish_reason, None, int(c.usage.get("completion_tokens", 0))
            )

        with ThreadPoolExecutor(max_workers=max(1, min(g, self.cfg.concurrency))) as pool:
            return list(pool.map(one, range(g)))
