"""The proposer's default prompt is the paper's x_t: the task description, the harness source,
the execution report, the `env` API and the edit format shown with placeholders. No hint of
which fix to make, no worked fix; the hinted template is an option a user names."""

from __future__ import annotations

import dataclasses
import re

import pytest

from whale.config import ConfigError
from whale.harness import Budget
from whale.metaharness.agent import EXAMPLES, SYSTEM, AgentConfig
from whale.revise.proposer import (
    TEMPLATES,
    ProposerConfig,
    api_section,
    load_template,
    render,
)
from whale.revise.run import AdaptConfig
from whale.train.proposer.contexts import ContextSettings

DESCRIPTION = "<<DESCRIPTION SENTINEL>>"
SOURCE = "def run(question, env):\n    return '<<SOURCE SENTINEL>>'"
REPORT = "<<REPORT SENTINEL>>"
BUNDLE = ("# === whale file: harness.py ===\nimport util\n\ndef run(question, env):\n"
          "    return util.F\n# === whale file: util.py ===\nF = '<<SOURCE SENTINEL>>'\n")  # fmt: skip

# Every line the default template adds around the four inserted parts, as the paper's x_t has
# them. A line added to the template (a hint, an example) makes this test fail.
SKELETON = [
    "You revise a harness: a Python program that uses a language model (the solver) to answer "
    "the questions of one task. You are given the task, the current harness and the report of "
    "running it. Write an edit of the harness so that more of its answers are right.",
    "# The harness contract",
    "The harness is one Python file that defines `run(question, env) -> str`, returning the "
    "final answer as a string. It may use the Python standard library. It runs in a sandbox "
    "with no network and no files but its own. `env` offers exactly:",
    "# The task",
    "# The current harness",
    "```python",
    "```",
    "# Execution report",
    "# How to answer",
    "First write one or two sentences saying what your edit changes. Then give the edit as one "
    "or more SEARCH/REPLACE blocks. The SEARCH part must copy lines of the current harness "
    "exactly (same indentation), and it must match one place only. The REPLACE part is the new "
    "text for those lines. The format, with placeholders in capitals:",
    "SENTENCES SAYING WHAT THE EDIT CHANGES",
    "<<<<<<< SEARCH",
    "LINES COPIED FROM THE CURRENT HARNESS",
    "=======",
    "THE NEW LINES",
    ">>>>>>> REPLACE",
    "Write only the explanation and the blocks.",
]


def _rendered(name: str, tools: tuple[str, ...] = ("python",)) -> str:
    return render(load_template(name), DESCRIPTION, SOURCE, REPORT, Budget(), tools)


@pytest.mark.parametrize("tools", [("python",), ("python", "retrieve")])
def test_the_default_prompt_holds_only_x_t_the_api_and_the_format(tools):
    text = _rendered(ProposerConfig().template, tools)
    for part in (DESCRIPTION, SOURCE, REPORT, api_section(tools, Budget())):
        assert text.count(part) == 1
        text = text.replace(part, "")
    assert [line for line in text.splitlines() if line.strip()] == SKELETON


@pytest.mark.parametrize("source", [SOURCE, BUNDLE])
def test_the_default_format_example_holds_no_code(source):
    """Between the markers there are placeholders only: no line a proposer could copy."""
    text = render(load_template("default"), DESCRIPTION, source, REPORT, Budget()).split(
        "# How to answer")[1]  # fmt: skip
    blocks = re.findall(r"<<<<<<< SEARCH[^\n]*\n(.*?)=======\n(.*?)>>>>>>> REPLACE", text, re.S)
    assert blocks
    for block in blocks:
        for line in "".join(block).splitlines():
            assert line == line.upper() and "(" not in line and "=" not in line, line


def test_the_hinted_template_is_the_human_prior_and_is_still_offered():
    hinted = _rendered("hinted")
    assert "env.tools.python" in hinted.split("# The task")[0].split("offers exactly:")[1]
    assert "result = env.tools.python(code)" in hinted  # the worked interpreter-loop fix
    default = _rendered("default")
    assert "result = env.tools.python(code)" not in default
    assert "arithmetic slips" not in default and "arithmetic slips" in hinted


def test_no_command_defaults_to_the_hinted_template():
    assert ProposerConfig().template == "default"
    assert AdaptConfig().propose.template == "default"
    # the training contexts (teacher, GRPO, evaluate) render the default x_t too
    assert load_template(ContextSettings().template) == load_template("default")
    assert AgentConfig().example == "default"
    hinted = {TEMPLATES["hinted"], "hinted"}
    for cls in (ProposerConfig, ContextSettings):
        for f in dataclasses.fields(cls):
            if f.name == "template":
                assert f.default not in hinted


def test_an_unknown_template_is_refused_on_load():
    with pytest.raises(ConfigError, match="template"):
        ProposerConfig(template="no-such-template").validate()
    ProposerConfig(template="hinted").validate()


def test_the_search_agents_default_example_shows_the_form_only():
    system = SYSTEM.replace("{example}", EXAMPLES[AgentConfig().example])
    assert 'rstrip(".")' not in system and "period" not in system
    body = EXAMPLES["default"].split("<<<<<<< SEARCH\n")[1]
    for line in body.replace(">>>>>>> REPLACE", "").replace("=======", "").splitlines():
        assert line == line.upper(), line
    assert 'rstrip(".")' in EXAMPLES["hinted"]
    with pytest.raises(ValueError, match="example"):
        AgentConfig(example="clever").validate()


# The API section, word for word: a sentence added to it (a hint about what small solvers get
# wrong, a suggested tool) makes this fail. Budget numbers are the only variables.
API_LINES = [
    '- `env.llm(messages, max_tokens=None, temperature=None, stop=None)`: calls the solver. '
    '`messages` is a list of {"role": "system"|"user"|"assistant", "content": str} (or one '
    'string). Returns a reply that IS a str (the text) and also has `.text` and '
    '`.finish_reason` ("stop" or "length").',
    "- `env.tools.python(code, timeout=10)`: runs Python code in a fresh sandbox; returns a str "
    "of what it printed (stdout, then stderr and any error), with `.stdout`, `.stderr`, "
    "`.error`.",
    "- `env.tools.retrieve(query, k=5)`: searches the task's passage corpus (BM25) and returns "
    'a list of at most k (capped at 50) passages, best first, each a dict {"id", "title", '
    '"text", "score"}. An empty query returns [] and costs nothing.',
    "- `env.budget`: what is left: `.model_calls`, `.tool_calls`, `.retrievals`, `.seconds`.",
    "Nothing else exists on `env`. Budget per question: 7 model calls, 5 python calls, 3 "
    "retrievals; a call past the budget ends the run.",
]


def test_the_api_section_describes_the_api_and_nothing_else():
    budget = Budget(model_calls=7, tool_calls=5, retrievals=3)
    assert api_section(("python", "retrieve"), budget).splitlines() == API_LINES


# The search agent's system prompt, word for word, but for its placeholders.
AGENT_SYSTEM = """You improve a harness: a Python program `run(question, env) -> str` that uses \
a solver model to answer questions of one task. In the harness, `env.llm(messages, \
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


def test_the_search_agents_system_prompt_holds_no_hint():
    """A sentence added to it (what small solvers get wrong, a fix to try) makes this fail."""
    assert SYSTEM == AGENT_SYSTEM
