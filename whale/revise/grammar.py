"""A GBNF grammar that forces the proposer's answer into the edit format, for llama.cpp.

Asked plainly (no grammar), the embedded 1.5B gave few applicable edits (docs/measurements.md):
it wrote fenced rewrites, invented markers, or SEARCHed for lines the harness does not have.
Under this grammar the answer is one explanation line and then 1 to `max_blocks`
SEARCH/REPLACE blocks, and every SEARCH is a contiguous run of the parent's own whole lines
(split on "\n" only, as Apply splits them), so it is found under Apply's whole-line rule (it
can still match twice, if the parent repeats lines). A parent line that reads as a block marker
(`=======` in a string, say) cannot be part of a SEARCH, since Apply would read it as a marker:
runs stop before it. What the REPLACE says is left to the model.

For a harness of several files (a bundle, `whale/harness/bundle.py`) each block's SEARCH line
names one of its files (`<<<<<<< SEARCH util.py`) and the SEARCH is a run of that file's lines;
a file with no line a SEARCH could start at (an empty `__init__.py`) is not offered.
"""

from __future__ import annotations

from typing import Literal

from whale.harness.bundle import BundleError, files_of, is_bundle
from whale.revise.edits import SEARCH, is_marker

# When a proposer's answer is decoded under the edit grammar: "auto" (llama.cpp backends, the
# embedded default), "on" (always), "off" (never). The revision loop's and the search agent's.
GrammarUse = Literal["auto", "on", "off"]


def _literal(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    out = out.replace("\r", "\\r")
    return f'"{out}"'


# What a REPLACE may hold: lines that cannot be read as a block marker.
REPLACE_RULES = ("replace ::= rline*", 'rline ::= [^<=>\\n] [^\\n]* "\\n" | "\\n"')


def search_rules(source: str, prefix: str = "") -> list[str]:
    """GBNF rules whose start symbol `{prefix}search` matches a contiguous run of `source`'s
    whole lines (see the module docstring); rule names carry `prefix`, so that the rules of
    several sources can live in one grammar (the search agent's submit). GBNF names allow
    letters, digits and '-' only."""
    lines = [line + "\n" for line in source.rstrip("\n").split("\n")]
    n = len(lines)
    usable = [not is_marker(line) for line in lines]
    starts = [f"{prefix}s{i}" for i in range(n) if lines[i].strip() and usable[i]]
    rules = [f"{prefix}search ::= " + " | ".join(starts)]
    for i, line in enumerate(lines):
        rules.append(f"{prefix}l{i} ::= {_literal(line)}")
        if usable[i]:
            more = f" {prefix}s{i + 1}?" if i + 1 < n and usable[i + 1] else ""
            rules.append(f"{prefix}s{i} ::= {prefix}l{i}{more}")
    return rules


def searched(source: str, prefix: str = "") -> tuple[str, list[str]]:
    """A GBNF expression for a block's SEARCH marker line and its SEARCH lines, and the rules
    it needs: for one file, the marker and a run of the file's lines (`search_rules`); for a
    bundle, a marker naming one of its files and a run of that file's lines."""
    try:
        files = files_of(source)
    except BundleError:  # not a valid bundle (no run accepts it): its text as one file
        files = {}
    if not files or not is_bundle(source):
        return f"{_literal(SEARCH + chr(10))} {prefix}search", search_rules(source, prefix)
    alternatives, rules = [], []
    for k, (path, text) in enumerate(files.items()):
        if not any(line.strip() and not is_marker(line) for line in text.split("\n")):
            continue  # nothing a SEARCH could copy (an empty file)
        alternatives.append(f"{_literal(f'{SEARCH} {path}' + chr(10))} {prefix}f{k}-search")
        rules += search_rules(text, f"{prefix}f{k}-")
    return "(" + " | ".join(alternatives) + ")", rules


def edit_grammar(source: str, max_blocks: int = 3) -> str:
    marked, rules = searched(source)
    return "\n".join([
        "root ::= expl block" + " block?" * (max(1, max_blocks) - 1),
        # A bounded explanation: an unbounded one can eat the token budget before any block.
        'expl ::= [^<\\n] [^\\n]{0,300} "\\n"',
        f'block ::= {marked} "=======\\n" replace ">>>>>>> REPLACE\\n"',
        *REPLACE_RULES,
        *rules,
    ]) + "\n"  # fmt: skip
