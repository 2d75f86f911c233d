"""Edits and Apply: turn a proposer's answer into a candidate harness, or say exactly why not.

A proposal is an explanation plus one or more blocks

    <<<<<<< SEARCH
    exact lines of the parent
    =======
    their replacement
    >>>>>>> REPLACE

Each SEARCH must match the parent exactly once and no two may overlap; then all apply. A SEARCH
matches whole lines only: its lines must equal a run of complete, consecutive lines of the parent
(`x = 1` does not match inside `x = 10`). Lines are split on "\n" only (a "\r" before it is
dropped), trailing whitespace (space, tab, \r, \f, \v) is ignored on both sides when comparing,
indentation is not, and a missing final newline in the parent or the SEARCH changes nothing (the
candidate keeps the parent's convention). Blank lines inside or at the edges of a SEARCH are lines
like any other and must match blank lines of the parent. The matched lines are replaced by the
REPLACE lines as written. This is the rule `grammar.py` enforces at decoding time. Small models
often answer with a whole new harness in one fenced python block instead: that is accepted as
a full rewrite (recorded as mode "rewrite") under the same checks; and two fenced snippets
joined by "replace with" are read as one pair (mode "fenced-pair"), under the same whole-line
rule. The result must parse, must still define `run(question, env)`, and must differ from the
parent. Every failure names the block and the fault; nothing is skipped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from whale.harness.contract import NO_RUN, run_contract_fault

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
_MARKER = re.compile(r"^(<{5,9} ?SEARCH|={5,9}|>{5,9} ?REPLACE)[ \t]*$")
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

Mode = Literal["blocks", "fenced-pair", "rewrite", "none"]


def is_marker(line: str) -> bool:
    """Whether Apply reads `line` as a block marker (so it cannot be part of a SEARCH)."""
    return bool(_MARKER.match(line.strip()))


@dataclass(frozen=True)
class Edit:
    """`search` and `replace` are text of whole lines (see `lines`): parse_blocks ends every line
    with "\n", so that an empty REPLACE ("", delete the lines) differs from a blank one ("\n")."""

    search: str
    replace: str


def lines(text: str) -> list[str]:
    """`text` as a list of lines, split on "\n" only (never on \r, \f or \u2028, which may sit
    inside a harness's string literals); a final "\n" ends the last line, it does not start an
    empty one. "" has no lines, "\n" one blank line."""
    if not text:
        return []
    out = text.split("\n")
    if out[-1] == "":
        out.pop()
    return out


_TRAILING = " \t\r\f\v"


def _key(line: str) -> str:
    """What a line is compared by: trailing whitespace dropped (models and editors drop or add
    it), indentation kept (it is Python syntax)."""
    return line.rstrip(_TRAILING)


def find_lines(parent: str, search: str) -> list[int]:
    """Every line index of `parent` where the lines of `search` begin as a run of whole lines."""
    keys, want = [_key(x) for x in lines(parent)], [_key(x) for x in lines(search)]
    m = len(want)
    if m == 0:
        return []
    return [i for i in range(len(keys) - m + 1) if keys[i] == want[0] and keys[i : i + m] == want]


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
    for line in text.split("\n"):
        line = line.removesuffix("\r")
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
                edits.append(
                    Edit("".join(x + "\n" for x in search), "".join(x + "\n" for x in replace))
                )
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
    when the first snippet is a run of whole lines of the harness (mode "fenced-pair")."""
    fences = list(_FENCE.finditer(text))
    for a, b in zip(fences, fences[1:], strict=False):
        between = text[a.end() : b.start()].lower()
        first = a.group(1).rstrip("\n")
        if "replace" in between and first.strip() and find_lines(source, first):
            return Edit(first, b.group(1).rstrip("\n"))
    return None


def check_harness(source: str) -> str | None:
    """Why `source` is not a valid harness, or None: the runtime's own check
    (whale/harness/contract.py), so Apply and the worker give one verdict."""
    fault = run_contract_fault(source)
    if fault is None:
        return None
    return "result drops run(question, env)" if fault == NO_RUN else f"result {fault}"


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
    """Every SEARCH is located in the parent as a run of whole lines (exactly once, no two
    overlapping), then all replacements are made at once. A block repeated word for word counts
    once."""
    edits = list(dict.fromkeys(edits))
    if not edits:
        return ApplyResult(False, source, "no complete SEARCH/REPLACE block", "blocks")
    spans: list[tuple[int, int, int]] = []  # (first line, end line, block number)
    for i, e in enumerate(edits, 1):
        fail = None
        at = find_lines(source, e.search)
        if not e.search.strip():
            fail = f"block {i}: empty SEARCH"
        elif not at:
            hint = _not_found_hint(source, e.search)
            fail = f"block {i}: SEARCH text not found in the harness{hint}"
        elif len(at) > 1:
            fail = (
                f"block {i}: SEARCH text matches {len(at)} places; "
                "include more lines to make it unique"
            )
        if fail is not None:
            return ApplyResult(False, source, fail, "blocks", True, len(edits))
        spans.append((at[0], at[0] + len(lines(e.search)), i))
    spans.sort()
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a:
            reason = f"block {max(a, b)}: its SEARCH overlaps block {min(a, b)}"
            return ApplyResult(False, source, reason, "blocks", True, len(edits))
    out = lines(source)
    for start, end, i in reversed(spans):
        out[start:end] = lines(edits[i - 1].replace)
    text = "\n".join(out) + ("\n" if out and source.endswith("\n") else "")
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


def _not_found_hint(text: str, search: str) -> str:
    """Why a SEARCH that is not a run of whole lines came close, for the proposer's next try."""
    body = "\n".join(_key(x) for x in lines(search)).strip("\n")
    if body and body in "\n".join(_key(x) for x in lines(text)):
        return " (it occurs only inside longer lines: SEARCH must copy whole lines)"
    squash = re.compile(r"\s+")
    if squash.sub(" ", search).strip() in squash.sub(" ", text):
        return " (it matches only if whitespace is ignored: copy the lines exactly)"
    return ""
