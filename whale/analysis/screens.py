"""Screens on any candidate harness and on any dataset of edits, each with its evidence.

`screen_source` runs, on one harness source:

- "interface": `whale.revise.code_screens.interface_violations` (the `run` contract, forbidden
  imports, escape builtins, interpreter internals), against the parent when one is known;
- "oracle_access": what would let a harness read the answer instead of computing it, as
  "line N: <kind>: <what>": imports of the task's generator or dataset packages
  (`TASK_PACKAGES`, plus any the caller names), file access (`FILE_MODULES`, any name or
  attribute in `FILE_ATTRS`: `open`, `codecs.open`, `from codecs import open as rd`,
  `.read_text`, `.load_module`), modules that run code from text or load modules
  (`EXEC_MODULES`: `timeit.Timer("import reasoning_gym")`, `imp`), the environment
  (`environ`, `getenv`, `argv`), the network (`NETWORK_MODULES`), and the ways to build any of
  these at run time: `getattr`-like calls with a computed name, dunder names, string
  constants holding "__" or naming a task package or an `import` (see `oracle_access`).
  Imports are read with code_screens' own import reader (static, `__import__("m")`,
  `importlib.import_module("m")`), so both screens agree on them;
- "answer_echo": `whale.revise.screens.AnswerEchoScreen` (reference answers or question
  literals of the dev questions), when the caller has the dev questions;
- "duplicate": `whale.revise.code_screens.DuplicateScreen` against an archive the caller fills.

`screen_archive` runs them over a sequence of candidates in order, each checked for duplicates
against the ones before it. `edit_rows` and `screen_edit_rows` do the same for a dataset of
edits (a train-proposer `teacher/candidates.jsonl` or `kept.jsonl`, or any JSONL whose rows hold
a proposal text and a parent harness hash): each row's proposal is applied to its parent
(`whale.revise.edits.apply_edits`, which never executes anything), and the result is screened.

Hostile input is a recorded outcome: a source that does not parse fails "interface" (the
contract fault says why) and "oracle_access" ("not checked: does not parse"); a garbage line of
a dataset is a row with evidence "line N: not a JSON object". Nothing here executes a harness.
Datasets of edits are read with `whale.records.read_untrusted` (no link out of the run, no
FIFO, `MAX_DATASET_BYTES`); the echo screen loads no dataset file from outside the run
(`dev_echo_screen`).
Not covered: everything code_screens and the echo screen do not cover (answers computed at run
time); strings built without any piece holding "__" or a module name (`chr(95) * 2`), which
`oracle_access` misses unless another of its signs (a computed `getattr`, a dunder) is there.
"""

from __future__ import annotations

import ast
import json
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale.harness import harness_hash
from whale.harness.bundle import syntax_tree
from whale.harness.contract import MAX_SOURCE_CHARS
from whale.records import UnsafeRead, read_untrusted
from whale.revise.code_screens import DuplicateScreen, _imports, interface_violations
from whale.revise.edits import apply_edits
from whale.revise.screens import AnswerEchoScreen

SCREENS = ("interface", "oracle_access", "answer_echo", "duplicate")
TASK_PACKAGES = frozenset(
    "reasoning_gym datasets whale huggingface_hub bm25s sympy_gym gsm8k hotpotqa".split()
)
FILE_MODULES = frozenset(
    """os io pathlib shutil glob tempfile fileinput linecache shelve dbm sqlite3 zipfile tarfile
    mmap pickle marshal csv codecs tokenize""".split()
)
# modules that run code given as text or load a module from a file: a way around every static
# import check (`timeit.Timer("import reasoning_gym")`, `imp.load_module`, `runpy.run_path`)
EXEC_MODULES = frozenset(
    "imp importlib timeit profile cProfile pdb trace runpy code codeop ctypes zipimport".split()
)
NETWORK_MODULES = frozenset(
    "socket urllib http requests httpx ftplib smtplib telnetlib xmlrpc ssl webbrowser".split()
)
# attribute or imported names that open files or load modules, whatever object they hang on
FILE_ATTRS = frozenset(
    "open read_text read_bytes write_text write_bytes iterdir load_module exec_module".split()
)
_ENV_NAMES = frozenset({"environ", "environb", "getenv", "putenv", "argv"})
_DYNAMIC_ATTR = frozenset({"getattr", "setattr", "delattr", "attrgetter", "methodcaller"})
_HARMLESS_DUNDER = frozenset({"__name__"})
_IMPORT_IN_TEXT = re.compile(r"\b(?:import|from)\s+([A-Za-z_]\w*)")
MAX_ROW_BYTES = 4_000_000  # a dataset line longer than this is refused, not parsed
MAX_DATASET_BYTES = 64_000_000  # a dataset of edits larger than this is not read
MAX_ECHO_SIZE = 10_000  # the echo screen loads at most this many questions of a task
_FILE_TASKS = ("hotpotqa", "musique", "2wiki", "searchqa", "math")  # ids "<kind>:<path>"


@dataclass
class ScreenResult:
    """One screen's verdict on one candidate (`key`: its hash, or the dataset row it came
    from); `evidence` says what was found, and where."""

    key: str
    screen: str
    passed: bool
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"hash": self.key, "screen": self.screen, "passed": self.passed,
                "evidence": list(self.evidence)}  # fmt: skip


def _tree(source: str) -> ast.Module | None:
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        return None
    try:
        return syntax_tree(source)  # a bundle's files as one module, at their bundle lines
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def oracle_access(source: str, task_packages: Iterable[str] = ()) -> list[str] | None:
    """Evidence of oracle access in `source` ("line N: kind: what"), [] when none, None when
    the source does not parse (or is over the size limit) and could not be checked.

    Flagged: imports (static or dynamic, as code_screens reads them, and `import X` written
    inside a string) of task packages, `FILE_MODULES`, `EXEC_MODULES`, `NETWORK_MODULES`; any
    name, attribute or imported name in `FILE_ATTRS` (`codecs.open`, `from codecs import open
    as rd`, `tokenize.open`, `imp.load_module`); the environment; `getattr`/`setattr`/
    `delattr`/`attrgetter`/`methodcaller` with a name that is not a constant (or any use of
    them other than a call); dunder names and attributes (but `__name__`); every string
    constant holding "__" or naming a task package (docstrings excepted), since it is, or is a
    piece of, a dunder or module name. A pass means none of these occurs. Over-flags on
    purpose: a harness has no business with any of them."""
    tree = _tree(source)
    if tree is None:
        return None
    packages = TASK_PACKAGES | set(task_packages)
    found: dict[tuple[int, str], list[str]] = {}

    def flag(line: int, kind: str, what: str) -> None:
        items = found.setdefault((line, kind), [])
        if what not in items:
            items.append(what)

    def module_kind(module: str) -> str | None:
        if module in packages:
            return "task package import"
        if module in FILE_MODULES:
            return "file access import"
        if module in EXEC_MODULES:
            return "code execution import"
        return "network import" if module in NETWORK_MODULES else None

    for line, module, how in _imports(tree):
        if kind := module_kind(module):
            flag(line, kind, how)
    try:
        nodes = list(ast.walk(tree))
    except RecursionError:  # pragma: no cover - ast.walk is iterative; kept for safety
        nodes = []
    docstrings = _docstrings(nodes)
    called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name):
            if node.id in FILE_ATTRS:
                flag(line, "file read", node.id)
            elif node.id in _ENV_NAMES:
                flag(line, "environment", node.id)
            elif node.id in _DYNAMIC_ATTR and id(node) not in called:
                flag(line, "dynamic attribute access", f"{node.id} used as a value")
            elif _dunder(node.id):
                flag(line, "interpreter internals", node.id)
        elif isinstance(node, ast.Attribute):
            if node.attr in _ENV_NAMES:
                flag(line, "environment", node.attr)
            elif node.attr in FILE_ATTRS:
                flag(line, "file read", f".{node.attr}")
            elif node.attr in _DYNAMIC_ATTR and id(node) not in called:
                flag(line, "dynamic attribute access", f".{node.attr} used as a value")
            elif _dunder(node.attr):
                flag(line, "interpreter internals", f".{node.attr}")
        elif isinstance(node, ast.alias):
            for name in {node.name.rsplit(".", 1)[-1], node.asname or ""} & FILE_ATTRS:
                flag(line, "file read", f"imported name {name}")
        elif isinstance(node, ast.Call):
            _dynamic_call(node, flag)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):  # fmt: skip
            text = node.value
            if "__" in text:
                flag(line, "dunder string", repr(text[:40]))
            if text.split(".", 1)[0] in packages:
                flag(line, "task package named in a string", repr(text[:40]))
            for m in _IMPORT_IN_TEXT.finditer(text[:100_000]):
                if kind := module_kind(m.group(1)):
                    flag(line, f"{kind} in a string", m.group(0))
    return [f"line {ln}: {kind}: {', '.join(items)}" for (ln, kind), items in sorted(found.items())]


def _dunder(name: str) -> bool:
    return name.startswith("__") and name not in _HARMLESS_DUNDER


def _docstrings(nodes: list[ast.AST]) -> set[int]:
    """ids of the docstring constants of the module, classes and functions in `nodes`."""
    out: set[int] = set()
    for n in nodes:
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = n.body[0] if n.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):  # fmt: skip
                out.add(id(first.value))
    return out


def _dynamic_call(node: ast.Call, flag: Any) -> None:
    """getattr(x, name) and friends with a name that is not a constant, or a constant that is
    itself a file opener or a dunder."""
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if name not in _DYNAMIC_ATTR:
        return
    at = 0 if name in ("attrgetter", "methodcaller") else 1
    arg = node.args[at] if len(node.args) > at else None
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        flag(node.lineno, "dynamic attribute access", f"{name}() with a computed name")
    elif arg.value in FILE_ATTRS or _dunder(arg.value):
        flag(node.lineno, "dynamic attribute access", f"{name}(..., {arg.value!r})")


def screen_source(
    key: str,
    source: str,
    *,
    parent: str | None = None,
    echo: AnswerEchoScreen | None = None,
    duplicates: DuplicateScreen | None = None,
    task_packages: Iterable[str] = (),
) -> list[ScreenResult]:
    """Every screen on one source, in the order of `SCREENS` (echo and duplicate only when
    given). The duplicate screen only checks; the caller adds the source to it."""
    out = [ScreenResult(key, "interface", True)]
    try:
        violations = interface_violations(source, parent)
    except (RecursionError, MemoryError) as e:  # a tree too deep for code_screens' rewrites
        violations = [f"not checked: {type(e).__name__}"]
    out[0].passed, out[0].evidence = not violations, violations
    oracle = oracle_access(source, task_packages)
    if oracle is None:
        out.append(ScreenResult(key, "oracle_access", False, ["not checked: does not parse"]))
    else:
        out.append(ScreenResult(key, "oracle_access", not oracle, oracle))
    if echo is not None:
        why = echo.check(source)
        out.append(ScreenResult(key, "answer_echo", why is None, [why] if why else []))
    if duplicates is not None:
        why = duplicates.check(source)
        out.append(ScreenResult(key, "duplicate", why is None, [why] if why else []))
    return out


def screen_archive(
    candidates: Sequence[tuple[str, str, str | None]],
    *,
    echo: AnswerEchoScreen | None = None,
    threshold: float = 0.95,
    task_packages: Iterable[str] = (),
) -> list[ScreenResult]:
    """Screens over (key, source, parent source or None) in order; each is a duplicate when it
    copies an earlier one up to formatting and names (an exact repeat of a key already seen
    is skipped: the same harness is screened once)."""
    dup = DuplicateScreen(threshold)
    seen: set[str] = set()
    out: list[ScreenResult] = []
    for key, source, parent in candidates:
        if key in seen:
            continue
        seen.add(key)
        out += screen_source(key, source, parent=parent, echo=echo, duplicates=dup,
                             task_packages=task_packages)  # fmt: skip
        if _tree(source) is not None:
            dup.add(key, source)
    return out


@dataclass
class EditRow:
    """One row of a dataset of edits: where it is (`where`: "file:line"), its family, the
    parent harness hash, the proposal text, the candidate hash the dataset recorded (if any)
    and why the row could not be read (`error`)."""

    where: str
    family: str = ""
    parent_hash: str | None = None
    text: str = ""
    candidate_hash: str | None = None
    error: str | None = None


def _proposal_text(row: dict[str, Any]) -> str | None:
    if isinstance(row.get("text"), str):
        return str(row["text"])
    comp = row.get("completion")
    if isinstance(comp, str):
        return comp
    if isinstance(comp, list):
        parts = [m.get("content") for m in comp if isinstance(m, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


def edit_rows(path: Path, max_rows: int = 100_000, root: Path | None = None) -> Iterator[EditRow]:
    """The rows of a JSONL dataset of edits. The parent hash is the row's `parent_hash`, or the
    second field of its train-proposer `context` ("family/parent hash/seed.i"). Never raises on
    content; the file is read with `whale.records.read_untrusted` inside `root` (default: its
    own folder; at most `MAX_DATASET_BYTES`), and a missing, unreadable or refused file (a link
    out of `root`, a FIFO) is one row with the error."""
    try:
        data = read_untrusted(path, root if root is not None else path.parent, MAX_DATASET_BYTES)
    except OSError as e:
        why = e if isinstance(e, UnsafeRead) else e.strerror or e
        yield EditRow(str(path), error=f"cannot read: {why}")
        return
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    for n, raw in enumerate(lines, 1):
        if n > max_rows:
            yield EditRow(f"{path}:{n}", error=f"not read: over {max_rows} rows")
            return
        where = f"{path}:{n}"
        if len(raw) > MAX_ROW_BYTES:
            yield EditRow(where, error=f"line of {len(raw)} bytes over {MAX_ROW_BYTES}")
            continue
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict):
            yield EditRow(where, error=f"line {n}: not a JSON object")
            continue
        context = row.get("context") if isinstance(row.get("context"), str) else ""
        parts = str(context).split("/")
        parent = row.get("parent_hash")
        if not isinstance(parent, str):
            parent = parts[1] if len(parts) >= 3 else None
        res = row.get("result")
        result: dict[str, Any] = res if isinstance(res, dict) else {}
        cand = result.get("hash") if isinstance(result.get("hash"), str) else None
        family = row.get("family")
        text = _proposal_text(row)
        yield EditRow(where, str(family) if isinstance(family, str) else parts[0], parent,
                      text or "", cand,
                      None if text is not None else "no proposal text")  # fmt: skip


def screen_edit_rows(
    rows: Iterable[EditRow],
    sources: Mapping[str, str],
    *,
    echo: Mapping[str, AnswerEchoScreen] | None = None,
    threshold: float = 0.95,
) -> list[ScreenResult]:
    """Apply each row's edits to its parent (`sources`: harness hash -> source) and screen the
    result (`echo`: family -> echo screen). A row whose parent is unknown, or whose edits do
    not apply, gets one failed "interface" result naming why; duplicates are judged per family
    against the rows before it."""
    dups: dict[str, DuplicateScreen] = {}
    parents: set[tuple[str, str | None]] = set()
    out: list[ScreenResult] = []
    for row in rows:
        if row.error is not None:
            out.append(ScreenResult(row.where, "interface", False, [row.error]))
            continue
        parent = sources.get(row.parent_hash or "")
        if parent is None:
            why = f"parent harness {row.parent_hash!r} not found in the run"
            out.append(ScreenResult(row.where, "interface", False, [why]))
            continue
        applied = apply_edits(parent, row.text)
        if not applied.ok:
            why = f"edits do not apply: {applied.reason[:300]}"
            out.append(ScreenResult(row.where, "interface", False, [why]))
            continue
        key = f"{harness_hash(applied.source)} ({row.where})"
        dup = dups.get(row.family)
        if dup is None:
            dup = dups[row.family] = DuplicateScreen(threshold)
        if (row.family, row.parent_hash) not in parents:  # a rename-only edit copies it
            parents.add((row.family, row.parent_hash))
            dup.add(f"parent {row.parent_hash}", parent)
        out += screen_source(key, applied.source, parent=parent,
                             echo=(echo or {}).get(row.family), duplicates=dup)  # fmt: skip
        dup.add(key, applied.source)
    return out


def dev_echo_screen(
    family: str,
    question_ids: Iterable[str],
    task_config: Mapping[str, Any] | None = None,
    run_dir: Path | None = None,
) -> tuple[AnswerEchoScreen | None, str]:
    """The answer-echo screen over the dev questions a run scored (`question_ids`, of the form
    "<family>:<seed>:<index>"; the "@..." suffix of a weight phase's copy is dropped): the task
    is loaded (`whale.tasks.load_task`, with the run's `[task]` config) large enough to hold
    them, at most `MAX_ECHO_SIZE` questions. (None, why) when that cannot be done.

    `run_dir`: the family and config come from a run someone else wrote. Then only generated
    tasks (`rg:*`, `mhqa`) load as named; a dataset-file family ("hotpotqa:<path>", ...) loads
    only when its path, and any `abstracts` file, is a regular file inside `run_dir`, so that
    a hostile config.toml cannot make the audit read (or say whether there is) a file
    elsewhere; a `judge` entry is dropped (the screen needs no judge). Not covered: an `rg:*`
    config whose generator parameters make generating slow."""
    from whale.tasks import load_task

    ids = {q.split("@", 1)[0] for q in question_ids}  # "...:0:3@w3.1": a weight-phase copy
    if not ids:
        return None, "the run holds no dev question ids"
    seeds, top = set(), 0
    for q in ids:
        parts = q.rsplit(":", 2)
        if len(parts) != 3 or parts[0] != family or not (parts[1] + parts[2]).isdigit():
            return None, f"question id {q!r} is not of the form {family}:<seed>:<index>"
        seeds.add(int(parts[1]))
        top = max(top, int(parts[2]))
    if len(seeds) != 1 or top >= MAX_ECHO_SIZE:
        return None, f"question ids span seeds {sorted(seeds)[:5]} or index {top}"
    config = {k: v for k, v in (task_config or {}).items() if k not in ("id", "seed", "size")}
    extra = config.pop("config", {})
    extra = dict(extra) if isinstance(extra, dict) else {}
    if run_dir is not None:
        why = _untrusted_task(family, extra, run_dir)
        if why:
            return None, why
    try:
        variant = str(config.get("variant", "canonical"))  # the words the run's harness saw
        task = load_task(family, size=top + 1, seed=seeds.pop(), config=extra, variant=variant)
        dev = [q for q in task.questions() if q.id in ids]
    except Exception as e:  # noqa: BLE001 - any task that fails to load is a note, not a crash
        return None, f"task {family} did not load: {type(e).__name__}: {e}"[:300]
    if not dev:
        return None, f"none of the {len(ids)} dev ids is a question of {family}"
    return AnswerEchoScreen(task, dev), ""


def _untrusted_task(family: str, extra: dict[str, Any], run_dir: Path) -> str:
    """Why `family` (with its config `extra`, edited in place) is not loaded from a run's own
    config, or "" when it may be (see `dev_echo_screen`)."""
    kind, _, rest = family.partition(":")
    if (kind == "rg" and rest) or family == "mhqa":
        return ""
    if kind not in _FILE_TASKS or not rest:
        return f"task {family!r} is neither generated nor a dataset file: not loaded"
    extra.pop("judge", None)
    for what, p in (("dataset", rest), ("abstracts", extra.get("abstracts"))):
        if p is None:
            continue
        if not isinstance(p, str) or not _inside(Path(p), run_dir):
            return f"the {what} file of task {family!r} is not a file inside the run: not loaded"
    return ""


def _inside(path: Path, run_dir: Path) -> bool:
    """Whether `path`, as the task loader will open it (a relative path from the working
    folder), resolves to a regular file inside `run_dir`."""
    try:
        root = run_dir.resolve(strict=True)
        real = path.resolve(strict=True)
        return real.is_relative_to(root) and stat.S_ISREG(real.stat().st_mode)
    except (OSError, RuntimeError, ValueError):
        return False
