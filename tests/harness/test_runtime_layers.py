"""The modules of whale/harness import each other in one direction: no cycle, and the Runtime
never imports its executors (they take a Runtime; `settings.make_runtime` joins the two).

Every import counts: at module level, inside a function, under `if TYPE_CHECKING:`. A name
imported from a package counts as its submodule where there is one, and also as the package
itself (whose `__init__` imports the modules back), as tests/test_layers.py counts them.
"""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "whale" / "harness"
PKG = "whale.harness"


def harness_modules() -> dict[str, Path]:
    found = {}
    for p in HARNESS.rglob("*.py"):
        if "__pycache__" in p.parts:
            continue
        parts = list(p.relative_to(HARNESS).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([PKG, *parts])] = p
    return found


def imports_of(name: str, source: str, known: set[str], is_pkg: bool = False) -> set[str]:
    """The modules of `known` that `source` (module `name`) imports, anywhere in its body."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                out.add(t)
    return out


def harness_graph() -> dict[str, set[str]]:
    mods = harness_modules()
    return {n: imports_of(n, p.read_text(), set(mods), p.name == "__init__.py")
            for n, p in mods.items()}  # fmt: skip


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that returns to its start, or None (depth-first)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w) :] + [w]
            if w not in state and (found := visit(w)) is not None:
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)) is not None:
            return found
    return None


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_no_import_cycle_among_the_harness_modules():
    assert find_cycle(harness_graph()) is None


def test_the_runtime_imports_none_of_its_executors_nor_their_factory():
    graph = harness_graph()
    above = {f"{PKG}.executor", f"{PKG}.ray_executor", f"{PKG}.settings", PKG}
    assert reaches(graph, f"{PKG}.runtime") & above == set()
    assert reaches(graph, f"{PKG}.broker") & (above | {f"{PKG}.runtime"}) == set()


def test_the_executors_take_a_runtime_and_the_factory_sits_above_both():
    graph = harness_graph()
    assert f"{PKG}.runtime" in graph[f"{PKG}.executor"]
    assert f"{PKG}.runtime" in graph[f"{PKG}.ray_executor"]
    assert {f"{PKG}.runtime", f"{PKG}.executor"} <= graph[f"{PKG}.settings"]


def test_the_walk_sees_imports_inside_functions_and_type_checking_blocks():
    known = {f"{PKG}.a", f"{PKG}.b", f"{PKG}.c", PKG}
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from whale.harness.b import B\n"
        "def f():\n    from whale.harness import c\n"
    )
    assert imports_of(f"{PKG}.a", src, known) == {f"{PKG}.b", f"{PKG}.c", PKG}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_callers_still_find_the_names_where_they_were():
    from whale.harness import Executor, ExecutorUnavailable, Rollout, Runtime, make_runtime
    from whale.harness import executor as ex
    from whale.harness.runtime import Runtime as Defined

    assert Runtime is Defined and callable(make_runtime)
    assert (ex.Executor, ex.ExecutorUnavailable, ex.Rollout) == (
        Executor, ExecutorUnavailable, Rollout)  # fmt: skip
