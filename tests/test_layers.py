"""No import cycle in `whale/`, and no import up the layer list of docs/layers.md.

Every `import` and `from ... import` of every module is counted, at module level or inside a
function or `if TYPE_CHECKING:` block: an import that runs late is still a dependency, and a
cycle hidden in a function is still a cycle. `whale/__init__.py` (the facade over `whale.api`)
is left out, as the docs say.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "whale"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}


def imported(name: str, source: str, is_pkg: bool, known: dict[str, Path]) -> set[str]:
    """The whale modules `name` imports: `import` and `from ... import` anywhere (a name
    imported from a package counts as its submodule when it is one, else as the package), and
    `importlib.import_module("...")` / `__import__("...")` of a literal name. The facade
    `whale` stands for `whale.api`, whose names it re-exports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            targets = subs + ([mod] if len(subs) < len(node.names) else [])
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in DYNAMIC and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):  # fmt: skip
            targets = [node.args[0].value]
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            t = "whale.api" if t == "whale" else t
            if t in known and t != name:
                found.add(t)
    return found


DYNAMIC = {"importlib.import_module", "import_module", "__import__"}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        n: imported(n, p.read_text(), p.name == "__init__.py", known)
        for n, p in known.items()
        if n != "whale"
    }


def layers() -> list[list[str]]:
    text = (ROOT / "docs" / "layers.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block is not None, "docs/layers.md has no ```layers block"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def layer_of(module: str, table: list[list[str]]) -> int | None:
    best: tuple[int, int] | None = None  # (layer, length of the longest matching name)
    for i, names in enumerate(table):
        for n in names:
            if (module == n or module.startswith(n + ".")) and (best is None or len(n) > best[1]):
                best = (i, len(n))
    return None if best is None else best[0]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_in_whale() -> None:
    assert cycles(graph()) == []


def test_every_module_has_a_layer() -> None:
    table = layers()
    assert [m for m in sorted(graph()) if layer_of(m, table) is None] == []


def test_no_import_points_up_the_layer_list() -> None:
    table = layers()
    up = [
        f"{m} (layer {layer_of(m, table)}) imports {t} (layer {layer_of(t, table)})"
        for m, targets in sorted(graph().items())
        for t in sorted(targets)
        if (layer_of(t, table) or 0) > (layer_of(m, table) or 0)
    ]
    assert up == []


def test_the_check_sees_a_cycle_and_an_upward_import() -> None:
    """The walker itself: a two-module circle is found, and so is an import made inside a
    function."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    src = "def f():\n    from whale.cli import app\n"
    assert imported("whale.tasks.base", src, False, modules()) == {"whale.cli"}
    up_one = "from .. import config\n"  # relative: whale.tasks.base -> whale.config
    assert imported("whale.tasks.base", up_one, False, modules()) == {"whale.config"}
    hidden = ("from whale import adapt\n", "import whale\n",
              "import importlib\nimportlib.import_module('whale.api')\n", "__import__('whale.api')\n")
    for src in hidden:  # the facade, and imports by name, are imports of the API
        assert imported("whale.tasks.base", src, False, modules()) == {"whale.api"}, src
