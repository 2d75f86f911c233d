"""Code screens for harness candidates: what a kept edit must not do, read off its syntax tree.

Teacher data (issue 11) keeps a teacher's edit only if the candidate passes `screen_candidate`;
the same screens apply to any candidate. Each returns evidence (what was found, and on which
line) or nothing:

- `interface_violations`: the `run` contract (`whale.harness.contract`), a `run` whose
  parameters differ from the parent's, forbidden imports (`FORBIDDEN_MODULES`, by `import`,
  `from`, `__import__(...)` or `importlib`; an import the parent had does not count), builtins
  that reach files, code or namespaces (`ESCAPE_BUILTINS`: any occurrence of the name, except
  `input`, `help` and `locals` when the harness binds them itself),
  interpreter internals (`DUNDER_ATTRS`, dunder names, `getattr(x, "__...__")`, frame
  attributes, `"{0.__class__}".format`), modules reached through attributes (`random._os`,
  `re.enum.sys`, private attributes of imported modules) and the environment or network
  (`environ`, `getenv`, `socket`). `threading`, `_thread` and `concurrent` are forbidden too:
  `env` is one request/reply pipe with no lock (`whale/harness/worker.py`), so threads that
  call it interleave frames, and `concurrent.futures` also spawns processes.
  String constants are never read as code: the code a harness hands to `env.tools.python`
  runs in the nested sandbox, which is the sanctioned tool.
- `DuplicateScreen`: a candidate that copies a kept one up to formatting, comments,
  docstrings, the names of its variables, the order of its top-level functions, the order of
  dict-literal keys, and functions `run` never reaches (dead code padding).
- `ReviewerScreen` (`whale/revise/reviewer.py`): a model reads the candidate and the task and
  says whether it reaches oracle information instead of computing the answer; advisory.

Not covered (the checks are static): code assembled from strings at run time, attribute names
computed at run time (`getattr(x, name)`), `env`'s private attributes (every call still crosses
the broker). These screens filter data; the worker's jail is the security boundary.
"""

from __future__ import annotations

import ast
import bisect
import difflib
import hashlib
import math
import re
from collections.abc import Callable

from whale.harness.bundle import flat_tree, own_modules, syntax_tree, top_modules
from whale.harness.contract import MAX_SOURCE_CHARS, run_contract_fault
from whale.revise.reviewer import ReviewerScreen
from whale.revise.screens import AnswerEchoScreen

__all__ = ["DuplicateScreen", "ReviewerScreen", "interface_violations", "screen_candidate"]

FORBIDDEN_MODULES = frozenset(
    """os sys subprocess socket shutil pathlib io ctypes multiprocessing signal pickle marshal
    importlib builtins urllib http requests httpx ftplib asyncio threading _thread concurrent
    glob tempfile inspect gc posix nt posixpath ntpath genericpath pty fcntl mmap resource
    select selectors ssl socketserver xmlrpc smtplib telnetlib webbrowser runpy code codeop
    zipimport pkgutil pydoc linecache fileinput shelve dbm sqlite3 zipfile tarfile platform
    sysconfig site faulthandler _io _posixsubprocess _socket _signal _ctypes _pickle
    reasoning_gym datasets whale huggingface_hub bm25s""".split()
)
ESCAPE_BUILTINS = frozenset(
    "open exec eval compile globals vars locals __import__ breakpoint input help".split()
)
DUNDER_ATTRS = frozenset(
    """__builtins__ __globals__ __subclasses__ __class__ __bases__ __base__ __mro__ __import__
    __loader__ __spec__ __code__ __closure__ __dict__ __getattribute__ __reduce__
    __reduce_ex__ __self__ __func__ __file__ __builtin__""".split()
)
FRAME_ATTRS = frozenset(
    "f_globals f_locals f_builtins f_back f_code tb_frame gi_frame cr_frame co_code".split()
)
ENVIRONMENT_NAMES = frozenset({"environ", "environb", "getenv", "putenv", "socket"})
_ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__doc__"})
# Escape builtins a harness may use as its own names (a parameter `input`, a `help` text);
# the others are flagged wherever they occur.
_REBINDABLE = frozenset({"input", "help", "locals"})
_GETATTR = frozenset({"getattr", "setattr", "delattr", "hasattr", "attrgetter", "methodcaller"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_FORMAT_DUNDER = re.compile(r"\{[^{}]*\.\s*_")


def _parse(source: str | None,
           tree: Callable[[str], ast.Module] = syntax_tree) -> ast.Module | None:  # fmt: skip
    if source is None or not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        return None
    try:
        return tree(source)  # a bundle's files as one module, at their bundle lines
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _imports(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, module root, how) for every static and dynamic import in `tree`."""
    out: list[tuple[int, str, str]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name.split(".")[0], f"import {a.name}") for a in n.names]
        elif isinstance(n, ast.ImportFrom) and not n.level:
            out.append((n.lineno, (n.module or "").split(".")[0], f"from {n.module} import ..."))
        elif isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant):
            name = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            if name in ("__import__", "import_module") and isinstance(n.args[0].value, str):
                out.append(
                    (n.lineno, n.args[0].value.split(".")[0], f"{name}({n.args[0].value!r})")
                )
    return out


def _run_def(tree: ast.Module | None) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for n in tree.body if tree else []:
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "run":
            return n
    return None


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    names += [f"*{a.vararg.arg}"] if a.vararg else []
    names += [p.arg for p in a.kwonlyargs]
    return names + ([f"**{a.kwarg.arg}"] if a.kwarg else [])


def _bindings(node: ast.AST) -> list[str]:
    """Names `node` binds in the scope it stands in (its own scope for parameters)."""
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return [node.id]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
        return [node.name]
    return []


def _scoped(tree: ast.Module) -> tuple[list[tuple[ast.AST, tuple[int, ...]]], dict[int, set[str]]]:
    """Every node with its chain of enclosing scopes (module, then functions), and the names
    bound in each scope. Iterative; comprehensions count as their enclosing scope."""
    nodes: list[tuple[ast.AST, tuple[int, ...]]] = []
    bound: dict[int, set[str]] = {id(tree): set()}
    stack: list[tuple[ast.AST, tuple[int, ...]]] = [(tree, (id(tree),))]
    while stack:
        node, chain = stack.pop()
        nodes.append((node, chain))
        bound.setdefault(chain[-1], set()).update(_bindings(node))
        for fname, value in ast.iter_fields(node):
            inner = chain
            if isinstance(node, _FUNCTIONS) and fname in ("body", "args"):
                inner = (*chain, id(node))
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    stack.append((child, inner))
    return nodes, bound


def _internal(name: str) -> bool:
    """Whether an attribute name (or a dotted path of them) reaches interpreter internals."""
    return any(p in DUNDER_ATTRS or p in FRAME_ATTRS for p in name.split("."))


def _check_call(node: ast.Call, flag: Callable[[ast.AST, str, str], None]) -> None:
    """getattr-like calls with a constant internal name, and str.format reading attributes."""
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    args = node.args if name in ("attrgetter", "methodcaller") else node.args[1:2]
    for v in [a.value for a in args if isinstance(a, ast.Constant)] if name in _GETATTR else []:
        if isinstance(v, str) and _internal(v):
            flag(node, "interpreter internals", f"{name}(..., {v!r})")
    s = f.value.value if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Constant) else 0
    if name in ("format", "format_map") and isinstance(s, str) and _FORMAT_DUNDER.search(s):
        flag(node, "interpreter internals", "a format string that reads private attributes")


def interface_violations(source: str, parent: str | None = None) -> list[str]:
    """Every violation in `source` (see the module docstring), as "line N: kind: what", or
    the contract fault; empty when it is clean. Imports `parent` already had do not count."""
    fault = run_contract_fault(source)
    out = [f"run contract: harness {fault}"] if fault else []
    tree = _parse(source)
    if tree is None:
        return out
    parent_tree = _parse(parent)
    old, new = _run_def(parent_tree), _run_def(tree)
    if old is not None and new is not None and _params(old) != _params(new):
        out.append(f"line {new.lineno}: run signature changed: run({', '.join(_params(old))}) "
                   f"became run({', '.join(_params(new))})")  # fmt: skip
    had = {m for _, m, _ in _imports(parent_tree)} if parent_tree else set()
    own = own_modules(source)  # a harness's own files: imports of them are no escape
    # but only by the names that import them: helpers/os.py made `import os` (the real os)
    # "own" too. (A top-level os.py is refused by the worker: os is loaded before it.)
    had |= top_modules(source)
    found: dict[tuple[int, str], list[str]] = {}

    def flag(node: ast.AST, kind: str, what: str) -> None:
        items = found.setdefault((getattr(node, "lineno", 0), kind), [])
        if what not in items:
            items.append(what)

    for line, module, how in _imports(tree):
        if module in FORBIDDEN_MODULES and module not in had:
            found.setdefault((line, "forbidden import"), []).append(how)
    nodes, bound = _scoped(tree)
    modules = {b for n, _ in nodes if isinstance(n, ast.Import | ast.ImportFrom)
               for b in _bindings(n)} - own  # fmt: skip
    for node, chain in nodes:
        if isinstance(node, ast.Name):
            if node.id in ESCAPE_BUILTINS and node.id not in _REBINDABLE:
                # any use, even of a "rebound" name: `open = open`, `except E as open`, a
                # comprehension target or a default `open=open` all keep the builtin in reach
                flag(node, "builtin escape", node.id)
            elif node.id in _REBINDABLE and not any(node.id in bound.get(s, ()) for s in chain):
                if node.id != "locals" or len(chain) == 1:  # locals() in a function is its own
                    flag(node, "builtin escape", node.id)
            elif node.id.startswith("__") and node.id not in _ALLOWED_DUNDER_NAMES:
                flag(node, "interpreter internals", node.id)
            if node.id in ENVIRONMENT_NAMES:
                flag(node, "environment/network", node.id)
        elif isinstance(node, ast.Attribute):
            a = node.attr
            if _internal(a):
                flag(node, "interpreter internals", a)
            if a in ENVIRONMENT_NAMES:
                flag(node, "environment/network", a)
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules and not _internal(a):
                if a in FORBIDDEN_MODULES or (a[:1] == "_" and a not in _ALLOWED_DUNDER_NAMES):
                    path = f"{root.id}.{a}" if node.value is root else f"{root.id}...{a}"
                    flag(node, "module internals reached through an attribute", path)
        elif isinstance(node, ast.alias) and node.name in ENVIRONMENT_NAMES:
            flag(node, "environment/network", node.name)
        elif isinstance(node, ast.Call):
            _check_call(node, flag)
    for (line, kind), items in sorted(found.items()):
        out.append(f"line {line}: {kind}: {', '.join(items)}")
    return out


# --- duplicates ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\w+|[^\w\s]")


class _Canonical(ast.NodeTransformer):
    """Drops docstrings (every statement that is a bare constant) and renames every name the
    module binds (but `run` and imports) to v0, v1, ... in order of first appearance, so
    that two copies that differ only in names become equal."""

    def __init__(self, bound: set[str]) -> None:
        self.bound = bound
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        if name not in self.bound:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        return None if isinstance(node.value, ast.Constant) else self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.Name):
            node.id = self._name(node.id)
        elif isinstance(node, ast.arg):
            node.arg = self._name(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            node.name = self._name(node.name)
        return super().generic_visit(node)


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Top-level statements that only bind names: reached through a reference, or not at all. Any
# other statement (a call, an `if`, a `try`) may act when the module loads, so it is a root.
_BINDERS = (*_DEFS, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Import,
            ast.ImportFrom)  # fmt: skip


def _preorder(node: ast.AST) -> list[ast.AST]:
    """`node` and everything under it, parents first, children in field order (iterative)."""
    out: list[ast.AST] = []
    stack = [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(list(ast.iter_child_nodes(n))))
    return out


def _names(stmt: ast.stmt, load: bool) -> list[str]:
    """Names `stmt` reads (load), in traversal order without repeats, or the module-level
    names it binds (for a def or a class: its own name only)."""
    if not load and isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [stmt.name]
    if not load and isinstance(stmt, ast.Import | ast.ImportFrom):
        return _bindings(stmt)
    found = [n.id for n in _preorder(stmt)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) == load]  # fmt: skip
    return list(dict.fromkeys(found))


def _reached(tree: ast.Module) -> list[int] | None:
    """Indices of the top-level statements reached from `run` by name references, taken
    transitively through defs and assignments, in the order a depth-first walk from `run`
    meets them (then the other roots: statements that may act at load time, then decorated
    defs); None for a module without `run`."""
    body = tree.body
    runs = [i for i, s in enumerate(body) if isinstance(s, _DEFS) and s.name == "run"]
    if not runs:
        return None
    binders: dict[str, list[int]] = {}
    for i, s in enumerate(body):  # a name bound twice reaches both statements
        for name in _names(s, load=False):
            binders.setdefault(name, []).append(i)
    effects = [i for i, s in enumerate(body) if not isinstance(s, _BINDERS)]
    decorated = [i for i, s in enumerate(body) if isinstance(s, _DEFS) and s.decorator_list]
    refs = {i: _names(s, load=True) for i, s in enumerate(body)}
    order: list[int] = []
    seen: set[int] = set()
    for root in runs + effects + decorated:
        if root in seen:
            continue
        seen.add(root)
        order.append(root)
        stack = [iter(refs[root])]
        while stack:
            ref = next(stack[-1], None)
            if ref is None:
                stack.pop()
                continue
            for t in binders.get(ref, ()):
                if t not in seen:
                    seen.add(t)
                    order.append(t)
                    stack.append(iter(refs[t]))
    return order


def _canonical_order(tree: ast.Module) -> None:
    """Drops the top-level defs `run` does not reach (by name, transitively) and puts the
    others after every other top-level statement, in the order a walk from `run` reaches
    them. Not by sorting their text: an edit inside one function would then move it past the
    others and read as a large change to the near-duplicate ratio. A module without `run`
    keeps its order."""
    order = _reached(tree)
    if order is None:
        return
    body = tree.body
    defs = [body[i] for i in order if isinstance(body[i], _DEFS)]
    tree.body = [s for s in body if not isinstance(s, _DEFS)] + defs


def _sort_dicts(tree: ast.Module, names: set[str]) -> None:
    """Sorts the entries of every dict literal by the shape of its key (then of its value,
    for a key that is not a constant), innermost dicts first; the shape is a digest of the
    subtree with every name in `names` read as one placeholder, so the order does not depend
    on what the variables are called. A dict with `**` entries keeps its order (a later key
    overrides), and so, by a stable sort, do repeated constant keys. One post-order pass: each
    node's digest is built from its children's."""
    digest: dict[int, bytes] = {}
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in ast.iter_child_nodes(node))
            continue
        if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
            keys = [k for k in node.keys if k is not None]

            def rank(e: tuple[ast.expr, ast.expr]) -> tuple[bytes, bytes]:
                k, v = e
                return digest[id(k)], b"" if isinstance(k, ast.Constant) else digest[id(v)]

            pairs = sorted(zip(keys, node.values, strict=True), key=rank)
            node.keys, node.values = [k for k, _ in pairs], [v for _, v in pairs]
        parts = [type(node).__name__]
        for fname, value in ast.iter_fields(node):
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, ast.AST):
                    parts.append(digest[id(v)].hex())
                elif fname in ("id", "arg", "name") and v in names:
                    parts.append("v")
                else:
                    parts.append(repr(v))
        h = hashlib.blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=16)
        digest[id(node)] = h.digest()


def normalized_tokens(source: str) -> tuple[list[str], set[str]]:
    """The token list of `source` after normalization (see `DuplicateScreen`) and the
    canonical names in it; the raw text's tokens for a source that does not parse or is too
    deep to rewrite."""
    tree = _parse(source, flat_tree)  # calls across a bundle's files reach their functions
    if tree is not None:
        try:
            _canonical_order(tree)
            nodes, bound = _scoped(tree)
            names = set().union(*bound.values()) - {"run"}
            names -= {b for n, _ in nodes if isinstance(n, ast.Import | ast.ImportFrom)
                      for b in _bindings(n)}  # fmt: skip
            _sort_dicts(tree, names)
            canon = _Canonical(names)
            text = ast.unparse(canon.visit(tree))
            return _TOKEN.findall(text), set(canon.names.values())
        except (RecursionError, ValueError):
            pass
    return _TOKEN.findall(source), set()


def _forms(source: str) -> tuple[str, list[str]]:
    """(hash of the numbered form, the tokens compared, every renamed name as one "v"): the
    numbers tell `a = b` from `b = a` for the exact match, while one placeholder keeps a new
    variable early on from renumbering, and so changing, every later name."""
    tokens, canon = normalized_tokens(source)
    digest = hashlib.sha256("\x00".join(tokens).encode("utf-8", "surrogatepass")).hexdigest()
    return digest, ["v" if t in canon else t for t in tokens]


class DuplicateScreen:
    """Refuses a candidate whose normalized form (the AST unparsed: no comments, formatting or
    docstrings; top-level functions `run` does not reach by name, transitively, dropped and
    the others put in the order a walk from `run` reaches them; dict-literal entries sorted by
    key; bound names renamed canonically, imported module names kept) is at least
    `threshold` similar to a source already added. Similarity is `difflib.SequenceMatcher`'s
    ratio on token lists: edits are local insertions and replacements, which its matching
    blocks count directly, and token-level comparison keeps a changed prompt word from
    weighing like a changed statement. Fast: an exact hash of the normalized form first,
    then only the sources whose token count could reach the threshold (a sorted index), and
    SequenceMatcher's cheap upper bounds before the full ratio. Not covered: a copy rewritten
    into equivalent code (a comprehension for a loop, statements reordered inside a function,
    keyword arguments reordered) and a dead function named in a branch of `run` that never
    runs (reached by name, so kept)."""

    def __init__(self, threshold: float = 0.95) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self._hashes: dict[str, str] = {}
        self._entries: list[tuple[str, list[str]]] = []  # (key, normalized tokens)
        self._lengths: list[tuple[int, int]] = []  # (token count, entry index), sorted

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: str, source: str) -> None:
        digest, tokens = _forms(source)
        self._hashes.setdefault(digest, key)
        bisect.insort(self._lengths, (len(tokens), len(self._entries)))
        self._entries.append((key, tokens))

    def check(self, source: str) -> str | None:
        """Says "duplicate of <key> (similarity 0.97)" for a kept source at or over the
        threshold (an exact match first, then the nearest in size), or None."""
        digest, tokens = _forms(source)
        if (key := self._hashes.get(digest)) is not None:
            return f"duplicate of {key} (similarity 1.00)"
        n, t = len(tokens), self.threshold
        lo = bisect.bisect_left(self._lengths, (int(n * t / (2 - t)), -1))
        hi = bisect.bisect_right(self._lengths, (int(n * (2 - t) / t) + 1, len(self._entries)))
        matcher = difflib.SequenceMatcher(None, autojunk=False)
        matcher.set_seq2(tokens)
        for _, i in sorted(self._lengths[lo:hi], key=lambda e: abs(e[0] - n)):  # nearest first
            matcher.set_seq1(self._entries[i][1])
            if matcher.real_quick_ratio() >= t and matcher.quick_ratio() >= t:
                if (r := matcher.ratio()) >= t:  # the first found: enough to refuse
                    shown = math.floor(r * 100) / 100  # never "1.00" for a copy not exact
                    return f"duplicate of {self._entries[i][0]} (similarity {shown:.2f})"
        return None


# --- reviewer --------------------------------------------------------------------------------

# --- all screens -----------------------------------------------------------------------------


def screen_candidate(
    source: str,
    parent: str | None,
    *,
    echo: AnswerEchoScreen | None = None,
    duplicates: DuplicateScreen | None = None,
    reviewer: ReviewerScreen | None = None,
    description: str = "",
) -> list[tuple[str, str]]:
    """(screen, evidence) pairs for every screen `source` fails, in order "interface" (one pair
    per violation), "answer_echo" (against the echo screen's baseline, the seed, so that a
    chain of candidates cannot launder an echo), "duplicate", and "reviewer", which costs a
    model call and runs only when the others pass. An empty list means the candidate passes."""
    out = [("interface", v) for v in interface_violations(source, parent)]
    if echo is not None and (why := echo.check(source)) is not None:
        out.append(("answer_echo", why))
    if duplicates is not None and (why := duplicates.check(source)) is not None:
        out.append(("duplicate", why))
    if not out and reviewer is not None and (why := reviewer.check(source, description)):
        out.append(("reviewer", why))
    return out
