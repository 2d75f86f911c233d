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

A harness of several files (a bundle, `whale/harness/bundle.py`): a block names the file it
edits on its SEARCH line, `<<<<<<< SEARCH util.py`; a block that names none edits the entry,
harness.py (so one-file proposals read as they always did). Each SEARCH must match its own file
exactly once, every file must parse, and the entry must keep the `run` contract; the files no
block names are left byte for byte. A block naming a file the harness does not have is refused
(Apply makes no new files: a block is located by what it matches), and so is a name that is not
a plain relative module path (`../x.py`, `/etc/x.py`), and a REPLACE holding a line that begins
like whale's file headers (it would forge one). A fenced rewrite replaces harness.py; a fenced
pair edits the one file its first snippet is found in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from whale.harness.bundle import (
    ENTRY,
    HEAD,
    BundleError,
    files_of,
    from_files,
    has_header_line,
    is_bundle,
    path_fault,
)
from whale.harness.contract import NO_RUN, run_contract_fault

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
# A SEARCH marker may name the file its block edits: "<<<<<<< SEARCH util.py" (group 2).
_MARKER = re.compile(r"^(<{5,9} ?SEARCH(?:[ \t]+(\S.*?))?|={5,9}|>{5,9} ?REPLACE)[ \t]*$")
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
    file: str | None = None  # the file it edits, as the SEARCH marker named it (None: the entry)


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
    file: str | None = None
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
                file = m.group(2) if m else None
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
                edits.append(Edit("".join(x + "\n" for x in search),
                                  "".join(x + "\n" for x in replace), file))  # fmt: skip
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


def _fenced_pair(files: dict[str, str], text: str) -> Edit | None:
    """Small models often write the block as two fenced snippets, the first copied from the
    harness and the second introduced by 'replace with'. Read that as one SEARCH/REPLACE pair
    when the first snippet is a run of whole lines of one file of the harness (mode
    "fenced-pair"; of several files, the one it is found in, when that is one)."""
    fences = list(_FENCE.finditer(text))
    for a, b in zip(fences, fences[1:], strict=False):
        between = text[a.end() : b.start()].lower()
        first = a.group(1).rstrip("\n")
        if "replace" in between and first.strip():
            found = [p for p, t in files.items() if find_lines(t, first)]
            if len(found) == 1:
                return Edit(first, b.group(1).rstrip("\n"), None if found == [ENTRY] else found[0])
    return None


def check_harness(source: str) -> str | None:
    """Why `source` is not a valid harness, or None: the runtime's own check
    (whale/harness/contract.py), so Apply and the worker give one verdict."""
    fault = run_contract_fault(source)
    if fault is None:
        return None
    if fault.startswith(NO_RUN):  # "(in harness.py)" follows for a bundle
        return f"result drops run(question, env){fault[len(NO_RUN) :]}"
    return f"result {fault}"


def apply_edits(source: str, proposal_text: str) -> ApplyResult:
    """Apply a proposer's answer to `source` (one file, or a bundle of several). Never raises
    on bad input."""
    try:
        files = files_of(source)
    except BundleError as e:  # a parent that is no harness makes no candidate
        return ApplyResult(False, source, f"the harness is not a valid bundle of files: {e}")
    if SEARCH in proposal_text or re.search(r"^<{5,9} ?SEARCH", proposal_text, re.MULTILINE):
        try:
            edits = parse_blocks(proposal_text)
        except EditFormatError as e:
            return ApplyResult(False, source, str(e), "blocks", parsed=False)
        return _apply_blocks(source, files, edits)
    pair = _fenced_pair(files, proposal_text)
    if pair is not None:
        res = _apply_blocks(source, files, [pair])
        return ApplyResult(
            res.ok, res.source, res.reason, "fenced-pair", res.parsed, 1, res.syntax_ok
        )
    rewrite = _fenced_rewrite(proposal_text)
    if rewrite is None:
        return ApplyResult(False, source, "no SEARCH/REPLACE blocks and no fenced python harness")
    # Checked for one file too: a one-file parent's rewrite that began with a header line
    # would be read as a bundle, making new files (Apply makes none; a rewrite is harness.py).
    if has_header_line(rewrite):
        why = (f"the rewrite holds lines that begin with {HEAD.strip()!r} (whale's file headers): "
               f"a fenced rewrite replaces {ENTRY} only; edit the other files with blocks that "
               "name them")  # fmt: skip
        return ApplyResult(False, source, why, "rewrite", True, 1)
    if not is_bundle(source):
        return _finish(source, rewrite, "rewrite", 1)
    return _finish(source, from_files({**files, ENTRY: rewrite}), "rewrite", 1)


def _block_fault(i: int, e: Edit, files: dict[str, str]) -> str | None:
    """Why block `i` cannot apply to `files` before any matching: a bad or unknown file name,
    an empty SEARCH, a REPLACE that would forge a file header."""
    if e.file is not None and e.file not in files:
        why = path_fault(e.file)
        if why is not None:
            return f"block {i}: {e.file[:200]!r} is not a file of a harness ({why})"
        return f"block {i}: the harness has no file {e.file} (its files: {', '.join(files)})"
    if not e.search.strip():
        return f"block {i}: empty SEARCH"
    if has_header_line(e.replace):
        return (f"block {i}: its REPLACE has a line that begins with {HEAD.strip()!r}, which "
                "marks whale's file headers")  # fmt: skip
    return None


def _apply_blocks(source: str, files: dict[str, str], edits: list[Edit]) -> ApplyResult:
    """Every SEARCH is located in its file (the entry when it names none) as a run of whole
    lines (exactly once, no two overlapping), then all replacements are made at once. A block
    repeated word for word counts once."""
    edits = list(dict.fromkeys(edits))
    if not edits:
        return ApplyResult(False, source, "no complete SEARCH/REPLACE block", "blocks")
    bundled = is_bundle(source)
    spans: dict[str, list[tuple[int, int, int]]] = {}  # file -> (first line, end line, block)
    for i, e in enumerate(edits, 1):
        path = e.file or ENTRY
        fail = _block_fault(i, e, files)
        if fail is None:
            at = find_lines(files[path], e.search)
            where = f"in {path}" if bundled else "in the harness"
            if not at:
                hint = _not_found_hint(files[path], e.search) or _elsewhere(files, path, e.search)
                fail = f"block {i}: SEARCH text not found {where}{hint}"
            elif len(at) > 1:
                fail = (
                    f"block {i}: SEARCH text matches {len(at)} places"
                    f"{' ' + where if bundled else ''}; include more lines to make it unique"
                )
        if fail is not None:
            return ApplyResult(False, source, fail, "blocks", True, len(edits))
        spans.setdefault(path, []).append((at[0], at[0] + len(lines(e.search)), i))
    out = dict(files)
    for path, file_spans in spans.items():
        file_spans.sort()
        for (_, end_a, a), (start_b, _, b) in zip(file_spans, file_spans[1:], strict=False):
            if start_b < end_a:
                reason = f"block {max(a, b)}: its SEARCH overlaps block {min(a, b)}"
                return ApplyResult(False, source, reason, "blocks", True, len(edits))
        text = lines(files[path])
        for start, end, i in reversed(file_spans):
            text[start:end] = lines(edits[i - 1].replace)
        out[path] = "\n".join(text) + ("\n" if text and files[path].endswith("\n") else "")
    try:
        result = from_files(out)
    except BundleError as e:  # a header line the parent already held (a one-file harness)
        return ApplyResult(False, source, f"result: {e}", "blocks", True, len(edits))
    return _finish(source, result, "blocks", len(edits))


def _same(parent: str, result: str) -> bool:
    """Whether `result` changes nothing of `parent` but whitespace at a file's ends."""
    if not (is_bundle(parent) and is_bundle(result)):
        return result.strip() == parent.strip()
    a, b = files_of(parent), files_of(result)
    return list(a) == list(b) and all(a[p].strip() == b[p].strip() for p in a)


def _finish(parent: str, result: str, mode: Mode, n: int) -> ApplyResult:
    if _same(parent, result):
        reason = "no-op: the edits leave the harness unchanged"
        return ApplyResult(False, parent, reason, mode, True, n, True)
    fault = check_harness(result)
    if fault is not None:
        syntax_ok = not fault.startswith("result does not parse")
        return ApplyResult(False, parent, fault, mode, True, n, syntax_ok)
    return ApplyResult(True, result, "", mode, True, n, True)


def _elsewhere(files: dict[str, str], path: str, search: str) -> str:
    """Where else a SEARCH is found, for a block that named the wrong file (or none)."""
    other = [p for p, t in files.items() if p != path and find_lines(t, search)]
    if not other:
        return ""
    return f" (it is in {other[0]}: name the file on the SEARCH line, {SEARCH} {other[0]})"


def _not_found_hint(text: str, search: str) -> str:
    """Why a SEARCH that is not a run of whole lines came close, for the proposer's next try."""
    body = "\n".join(_key(x) for x in lines(search)).strip("\n")
    if body and body in "\n".join(_key(x) for x in lines(text)):
        return " (it occurs only inside longer lines: SEARCH must copy whole lines)"
    squash = re.compile(r"\s+")
    if squash.sub(" ", search).strip() in squash.sub(" ", text):
        return " (it matches only if whitespace is ignored: copy the lines exactly)"
    return ""
