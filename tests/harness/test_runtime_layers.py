"""The modules of whale/harness import each other in one direction: no cycle, and the Runtime
never imports its executors (they take a Runtime; `settings.make_runtime` joins the two).

Every import counts, as tests/test_layers.py counts them: at module level, inside a function,
under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

from tests.test_layers import cycles, graph, imported, modules

PKG = "whale.harness"


def harness_graph() -> dict[str, set[str]]:
    """The import graph of whale/harness's modules (the package's own `__init__` included),
    walked as tests/test_layers.py walks the whole package."""
    inside = {n for n in modules() if n == PKG or n.startswith(PKG + ".")}
    whole = graph()
    whole[PKG] = imported(PKG, (modules()[PKG]).read_text(), True, modules())
    return {n: whole[n] & inside for n in inside}


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_no_import_cycle_among_the_harness_modules():
    assert cycles(harness_graph()) == []


def test_the_runtime_imports_none_of_its_executors_nor_their_factory():
    graph = harness_graph()
    above = {f"{PKG}.executor", f"{PKG}.ray_executor", f"{PKG}.ray_specs", f"{PKG}.settings",
             PKG}  # fmt: skip
    assert reaches(graph, f"{PKG}.runtime") & above == set()
    assert reaches(graph, f"{PKG}.broker") & (above | {f"{PKG}.runtime"}) == set()


def test_the_executors_take_a_runtime_and_the_factory_sits_above_both():
    graph = harness_graph()
    assert f"{PKG}.runtime" in graph[f"{PKG}.executor"]
    assert f"{PKG}.runtime" in graph[f"{PKG}.ray_executor"]
    assert {f"{PKG}.runtime", f"{PKG}.executor"} <= graph[f"{PKG}.settings"]


def test_the_walk_sees_imports_inside_functions_and_type_checking_blocks():
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from whale.harness.executor import LocalPool\n"
        "def f():\n    from whale.harness import settings\n"
    )
    got = imported(f"{PKG}.runtime", src, False, modules())
    assert got == {f"{PKG}.executor", f"{PKG}.settings"}


def test_callers_still_find_the_names_where_they_were():
    from whale.harness import Executor, ExecutorUnavailable, Rollout, Runtime, make_runtime
    from whale.harness import executor as ex
    from whale.harness.runtime import Runtime as Defined

    assert Runtime is Defined and callable(make_runtime)
    assert (ex.Executor, ex.ExecutorUnavailable, ex.Rollout) == (
        Executor, ExecutorUnavailable, Rollout)  # fmt: skip
