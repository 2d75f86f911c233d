"""Edits and Apply: turn a proposer's answer into a candidate harness, or say exactly why not.

A proposal is an explanation plus one or more blocks

    <<<<<<< SEARCH
    exact lines of the parent
    =======
    their replacement
    >>>>>>> REPLACE

Each SEARCH must match the parent exactly once and no two may overlap; then all apply. Small models
often answer with a whole new harness in one fenced python block instead: that is accepted as
a full rewrite (recorded as mode "rewrite") under the same checks; and two fenced snippets
joined by "replace with" are read as one pair (mode "fenced-pair"). The result must parse, must
still define `run(question, env)`, and must differ from the parent. Every failure names the
block and the fault; nothing is skipped silently.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Literal

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
_MARKER = re.compile(r"^(<{5,9} ?SEARCH|={5,9}|>{5,9} ?REPLACE)[ \t]*$")
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

Mode = Literal["blocks", "fenced-pair", "rewrite", "none"]


@dataclass(frozen=True)
class Edit:
    search: str
    replace: str


@dataclass(frozen=True)
class ApplyResult:
    """`parsed`: the proposal had an edit format we could read (blocks or a fenced rewrite).
    `syntax_ok`: the edits applied and the resulting program parses as Python.
    `ok`: Apply produced a valid candidate; then `source` is the candidate, else the parent."""

    ok: bool
    source: str
    reason: str = ""
    mode: Mode = "none"
    parsed: bool = False
    n_edits: int = 0
    syntax_ok: bool = False


class EditFormatError(ValueError):
    pass


def parse_blocks(text: str) -> list[Edit]:
    """The SEARCH/REPLACE blocks of `text`; EditFormatError names a malformed block."""
    edits: list[Edit] = []
    state, search, replace = "out", [], []  # type: ignore[var-annotated]
    block = 0
    for line in text.splitlines():
        m = _MARKER.match(line.strip()) if line.strip()[:1] in "<=>" else None
        kind = None
        if m:
            kind = (
                "search"
                if "SEARCH" in m.group(1)
                else "replace"
                if "REPLACE" in m.group(1)
                else "div"
            )
        if state == "out":
            if kind == "search":
                block += 1
                state, search, replace = "search", [], []
            elif kind in ("div", "replace"):
                raise EditFormatError(f"block {block + 1}: '{line.strip()}' before {SEARCH}")
        elif state == "search":
            if kind == "div":
                state = "replace"
            elif kind == "search":
                raise EditFormatError(f"block {block}: second {SEARCH} before {DIVIDER}")
            elif kind == "replace":
                raise EditFormatError(f"block {block}: {REPLACE} before {DIVIDER}")
            else:
                search.append(line)
        elif state == "replace":
            if kind == "replace":
                edits.append(Edit("\n".join(search), "\n".join(replace)))
                state = "out"
            elif kind == "search":
                raise EditFormatError(
                    f"block {block}: unclosed (no {REPLACE} before the next block)"
                )
            elif kind == "div":
                raise EditFormatError(f"block {block}: a second {DIVIDER}")
            else:
                replace.append(line)
    if state != "out":
        missing = DIVIDER if state == "search" else REPLACE
        raise EditFormatError(f"block {block}: unclosed (no {missing})")
    return edits


def _fenced_rewrite(text: str) -> str | None:
    """The last fenced python block that defines `run`, if any."""
    for body in reversed(_FENCE.findall(text)):
        if re.search(r"^def run\s*\(", body, re.MULTILINE):
            return str(body).rstrip() + "\n"
    return None


def _fenced_pair(source: str, text: str) -> Edit | None:
    """Small models often write the block as two fenced snippets, the first copied from the
    harness and the second introduced by 'replace with'. Read that as one SEARCH/REPLACE pair
    when the first snippet occurs in the harness (mode "fenced-pair")."""
    fences = list(_FENCE.finditer(text))
    for a, b in zip(fences, fences[1:], strict=False):
        between = text[a.end() : b.start()].lower()
        first = a.group(1).rstrip("\n")
        if "replace" in between and first.strip() and first in source:
            return Edit(first, b.group(1).rstrip("\n"))
    return None


def check_harness(source: str) -> str | None:
    """Why `source` is not a valid harness, or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"result does not parse: SyntaxError: {e.msg} (line {e.lineno})"
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "run":
            if isinstance(node, ast.AsyncFunctionDef):
                return "result defines run() as async; it must be a plain function"
            a = node.args
            positional = len(a.posonlyargs) + len(a.args)
            required = positional - len(a.defaults)
            if (positional >= 2 or a.vararg) and required <= 2:
                return None
            return "result's run() cannot be called as run(question, env)"
    return "result drops run(question, env)"


def apply_edits(source: str, proposal_text: str) -> ApplyResult:
    """Apply a proposer's answer to `source`. Never raises on bad input."""
    if SEARCH in proposal_text or re.search(r"^<{5,9} ?SEARCH", proposal_text, re.MULTILINE):
        try:
            edits = parse_blocks(proposal_text)
        except EditFormatError as e:
            return ApplyResult(False, source, str(e), "blocks", parsed=False)
        return _apply_blocks(source, edits)
    pair = _fenced_pair(source, proposal_text)
    if pair is not None:
        res = _apply_blocks(source, [pair])
        return ApplyResult(
            res.ok, res.source, res.reason, "fenced-pair", res.parsed, 1, res.syntax_ok
        )
    rewrite = _fenced_rewrite(proposal_text)
    if rewrite is None:
        return ApplyResult(False, source, "no SEARCH/REPLACE blocks and no fenced python harness")
    return _finish(source, rewrite, "rewrite", 1)


def _apply_blocks(source: str, edits: list[Edit]) -> ApplyResult:
    """Every SEARCH is located in the parent (exactly once, no two overlapping), then all
    replacements are made at once. A block repeated word for word counts once."""
    edits = list(dict.fromkeys(edits))
    if not edits:
        return ApplyResult(False, source, "no complete SEARCH/REPLACE block", "blocks")
    spans: list[tuple[int, int, int]] = []  # (start, end, block number)
    for i, e in enumerate(edits, 1):
        fail = None
        if not e.search.strip():
            fail = f"block {i}: empty SEARCH"
        elif (n := source.count(e.search)) == 0:
            hint = _whitespace_hint(source, e.search)
            fail = f"block {i}: SEARCH text not found in the harness{hint}"
        elif n > 1:
            fail = (
                f"block {i}: SEARCH text matches {n} places; include more lines to make it unique"
            )
        if fail is not None:
            return ApplyResult(False, source, fail, "blocks", True, len(edits))
        start = source.index(e.search)
        spans.append((start, start + len(e.search), i))
    spans.sort()
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a:
            reason = f"block {max(a, b)}: its SEARCH overlaps block {min(a, b)}"
            return ApplyResult(False, source, reason, "blocks", True, len(edits))
    text = source
    for start, end, i in reversed(spans):
        text = text[:start] + edits[i - 1].replace + text[end:]
    return _finish(source, text, "blocks", len(edits))


def _finish(parent: str, result: str, mode: Mode, n: int) -> ApplyResult:
    if result.strip() == parent.strip():
        reason = "no-op: the edits leave the harness unchanged"
        return ApplyResult(False, parent, reason, mode, True, n, True)
    fault = check_harness(result)
    if fault is not None:
        syntax_ok = not fault.startswith("result does not parse")
        return ApplyResult(False, parent, fault, mode, True, n, syntax_ok)
    return ApplyResult(True, result, "", mode, True, n, True)


def _whitespace_hint(text: str, search: str) -> str:
    squash = re.compile(r"\s+")
    if squash.sub(" ", search).strip() in squash.sub(" ", text):
        return " (it matches only if whitespace is ignored: copy the lines exactly)"
    return ""
