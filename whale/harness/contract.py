"""The `run` contract of a harness: the one check used by Apply (`whale/revise/edits.py`) and
by the broker before it starts a worker, so that both give the same verdict.

A harness is a Python module (at most `MAX_SOURCE_CHARS` characters) that

- parses;
- binds the name `run` exactly once at module level, by a top-level `def run(...)` statement:
  not async, no decorators; not by assignment (`run = make()`), import (`from m import run`),
  class, `global run`, `del run`, a `def run` nested in an `if`/`try` block, or a
  `from m import *` after the def (which may rebind it);
- has a signature that binds `run(question, env)`: two positional parameters, or `*args`, no
  more than two without defaults, and no keyword-only parameter without a default.

Not covered (the check is static): a module that rebinds `run` at run time (`globals()[...]`,
`exec`, `setattr` on its module). The worker still checks that `run` is callable, and a `run`
that fails to bind its arguments fails at the call, as a harness `error`.

A harness of several files (a bundle, `whale/harness/bundle.py`) must be a well-formed bundle,
every file must parse, and its entry file, harness.py, must keep the contract above; its faults
name the file ("does not parse: util.py: SyntaxError: ...").

Safe on hostile input: a size cap before parsing, RecursionError and MemoryError from the
parser are verdicts, and the walk over the tree is iterative.
"""

from __future__ import annotations

import ast
import functools

from whale.harness.bundle import ENTRY, MAX_CHARS, BundleError, is_bundle, parse

MAX_SOURCE_CHARS = MAX_CHARS

# The verdict for a module with no binding of `run` at all (Apply words it as "drops run").
NO_RUN = "defines no callable run(question, env)"
_SIGNATURE = "has a run() that cannot be called as run(question, env)"


def run_contract_fault(source: str) -> str | None:
    """Why `source` breaks the contract above, as a phrase whose subject is the harness
    ("does not parse: ...", "defines no callable run(question, env)"), or None."""
    if not isinstance(source, str):
        return f"is a {type(source).__name__}, not source text"
    if len(source) > MAX_SOURCE_CHARS:
        return f"is {len(source)} characters long, over the limit of {MAX_SOURCE_CHARS}"
    if is_bundle(source):
        return _bundle_fault(source)
    return _fault(source)


@functools.lru_cache(maxsize=32)
def _bundle_fault(source: str) -> str | None:
    try:
        files = parse(source)
    except BundleError as e:
        return f"is not a valid bundle of files: {e}"
    for path, text in files.items():
        if path != ENTRY and (why := _parsed(text)[1]):
            return f"{_PARSE}{path}: {why}"
    fault = _fault(files[ENTRY])
    if fault is None:
        return None
    if fault.startswith(_PARSE):
        return f"{_PARSE}{ENTRY}: {fault[len(_PARSE) :]}"
    return f"{fault} (in {ENTRY})"


_PARSE = "does not parse: "


def _parsed(text: str) -> tuple[ast.Module | None, str]:
    """`text`'s syntax tree, or None and why it does not parse."""
    try:
        return ast.parse(text), ""
    except SyntaxError as e:  # also IndentationError, and NUL bytes on 3.11.7
        where = f" (line {e.lineno})" if e.lineno else ""
        return None, f"{type(e).__name__}: {e.msg}{where}"
    except (RecursionError, MemoryError) as e:
        return None, f"nested too deeply for the parser ({type(e).__name__})"
    except ValueError as e:  # NUL bytes on older 3.11 releases
        return None, str(e)


@functools.lru_cache(maxsize=32)  # the broker checks the same harness on every question
def _fault(source: str) -> str | None:
    tree, why = _parsed(source)
    if tree is None:
        return f"{_PARSE}{why}"
    defs = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "run"
    ]
    others = [line for node, line in _module_bindings(tree) if node not in defs]
    if not defs:
        if others:
            return (
                f"binds run other than by a top-level def (line {others[0]}); "
                "define it as def run(question, env)"
            )
        return NO_RUN
    if len(defs) > 1:
        return f"defines run more than once (lines {', '.join(str(d.lineno) for d in defs)})"
    fn = defs[0]
    rebinds = [line for line in others if line != fn.lineno]
    stars = _star_imports_after(tree, fn.lineno)
    if rebinds or stars:
        return f"rebinds run after its def (line {(rebinds or stars)[0]}); bind it only once"
    if isinstance(fn, ast.AsyncFunctionDef):
        return "defines run() as async; it must be a plain function"
    if fn.decorator_list:
        return "decorates run(); it must be a plain def run(question, env)"
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    if not (positional >= 2 or a.vararg) or required > 2:
        return _SIGNATURE
    kw_required = [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    if kw_required:
        return f"{_SIGNATURE}: keyword-only parameter {kw_required[0]} has no default"
    return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _module_bindings(tree: ast.Module) -> list[tuple[ast.AST, int]]:
    """Every node that binds (or deletes) the name `run` in the module's namespace, with its
    line. Iterative: the tree may be as deep as the parser allows."""
    found: list[tuple[ast.AST, int]] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, True)]  # (node, in the module's scope)
    while stack:
        node, module_scope = stack.pop()
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Global) and "run" in node.names:
            found.append((node, line))  # a function that rebinds the module's run
        if module_scope:
            if (
                isinstance(node, ast.Name)
                and node.id == "run"
                and not isinstance(node.ctx, ast.Load)
            ):
                found.append((node, line))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name == "run":
                    found.append((node, line))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name.split(".")[0]) == "run":
                        found.append((node, line))
            elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
                if node.name == "run":
                    found.append((node, line))
            elif isinstance(node, ast.MatchMapping) and node.rest == "run":
                found.append((node, line))
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if not isinstance(child, ast.AST):
                    continue
                inner = module_scope
                if isinstance(node, _SCOPES) and field == "body":
                    inner = False  # a function's or class's own namespace (not its defaults)
                elif isinstance(node, ast.comprehension) and field == "target":
                    inner = False  # comprehension variables are local to it
                stack.append((child, inner))
    # A walrus in a comprehension binds in the enclosing scope; it is walked as module scope
    # above (the comprehension's own node is not a scope here), which is what Python does.
    return found


def _star_imports_after(tree: ast.Module, line: int) -> list[int]:
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.lineno > line and any(a.name == "*" for a in n.names)
    ]
