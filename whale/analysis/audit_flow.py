"""The abstract interpreter of the structural audit (`whale.analysis.audit`, whose docstring
says what it follows and what it does not): `Flow(tree)` walks `run(question, env)` of a parsed
harness, stepping into the module's own functions up to `MAX_DEPTH` deep and at most
`MAX_STEPS` nodes, and records each sink (a model or tool call) with the labels of its
arguments and the loops around it. Nothing is executed."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 12
MAX_STEPS = 200_000
_MUTATORS = frozenset({"append", "extend", "insert", "update", "add", "setdefault", "appendleft"})
_OUTPUT = frozenset({"llm", "py", "ret", "summary"})
_Loops = tuple[int, ...]


@dataclass
class _Sink:
    kind: str  # "llm", "python", "retrieve", "tool:<name>"
    node: int
    line: int
    loops: _Loops
    taint: set[str] = field(default_factory=set)


class Flow:
    """The abstract interpreter of the module docstring."""

    def __init__(self, tree: ast.Module) -> None:
        # top-level defs as Python binds them (a later def of a name replaces the earlier),
        # then nested ones of other names
        top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        nested = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        self.defs = {**nested, **top}
        self.env_fns = _env_functions(self.defs)
        self.sinks: dict[tuple[int, _Loops], _Sink] = {}
        self.checks: list[tuple[int, _Loops]] = []
        self.helpers: list[tuple[str, int, _Loops, set[str]]] = []  # name, line, loops, args
        self.loops: list[int] = []
        self.stack: list[str] = []
        self.steps = 0
        self.truncated = False

    def call(self, fn: ast.FunctionDef, args: list[set[str]], kw: dict[str, set[str]]) -> set[str]:
        if fn.name in self.stack or len(self.stack) >= MAX_DEPTH:
            return set().union(*args, *kw.values())
        a = fn.args
        names = [p.arg for p in a.posonlyargs + a.args]
        env: dict[str, set[str]] = {n: set() for n in names + [p.arg for p in a.kwonlyargs]}
        for name, t in zip(names, args, strict=False):
            env[name] = set(t)
        if a.vararg:
            env[a.vararg.arg] = set().union(*args[len(names) :])
        for k, t in kw.items():
            env.setdefault(k, set()).update(t)
        ret: set[str] = set()
        self.stack.append(fn.name)
        try:
            self.block(fn.body, env, ret)
        finally:
            self.stack.pop()
        return ret

    def block(self, body: list[ast.stmt], env: dict[str, set[str]], ret: set[str]) -> None:
        for stmt in body:
            self.steps += 1
            if self.steps > MAX_STEPS:
                self.truncated = True
                return
            self.stmt(stmt, env, ret)

    def loop(
        self,
        node: ast.AST,
        body: list[ast.stmt],
        env: dict[str, set[str]],
        ret: set[str],
        target: ast.AST | None = None,
        it: set[str] | None = None,
    ) -> None:
        self.loops.append(id(node))
        try:
            for _ in range(2):
                if target is not None:
                    self.bind(target, it or set(), env)
                if isinstance(node, ast.While):
                    self.check(node.test, env, [node], True)
                self.block(body, env, ret)
        finally:
            self.loops.pop()

    def check(
        self, test: ast.expr, env: dict[str, set[str]], branch: list[Any], is_while: bool = False
    ) -> None:
        t = self.expr(test, env)
        exits = is_while or any(isinstance(n, ast.Break | ast.Continue | ast.Return)
                                for b in branch for n in ast.walk(b))  # fmt: skip
        if t & _OUTPUT and exits:
            self.checks.append((getattr(test, "lineno", 0), tuple(self.loops)))

    def stmt(self, s: ast.stmt, env: dict[str, set[str]], ret: set[str]) -> None:
        if isinstance(s, ast.Assign):
            t = self.expr(s.value, env)
            for tg in s.targets:
                self.bind(tg, t, env)
        elif isinstance(s, ast.AugAssign | ast.AnnAssign):
            if s.value is not None:
                self.bind(s.target, self.expr(s.value, env), env)
        elif isinstance(s, ast.For | ast.AsyncFor):
            self.loop(s, s.body, env, ret, s.target, self.expr(s.iter, env))
            self.block(s.orelse, env, ret)
        elif isinstance(s, ast.While):
            self.loop(s, s.body, env, ret)
            self.block(s.orelse, env, ret)
        elif isinstance(s, ast.If):
            self.check(s.test, env, [*s.body, *s.orelse])
            self.block(s.body, env, ret)
            self.block(s.orelse, env, ret)
        elif isinstance(s, ast.Return):
            if s.value is not None:
                ret.update(self.expr(s.value, env))
        elif isinstance(s, ast.With | ast.AsyncWith):
            for item in s.items:
                t = self.expr(item.context_expr, env)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, t, env)
            self.block(s.body, env, ret)
        elif isinstance(s, ast.Try | ast.TryStar):
            self.block(s.body, env, ret)
            for h in s.handlers:
                self.block(h.body, env, ret)
            self.block(s.orelse, env, ret)
            self.block(s.finalbody, env, ret)
        elif isinstance(s, ast.Match):
            self.expr(s.subject, env)
            for case in s.cases:
                self.block(case.body, env, ret)
        elif isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self.expr(child, env)

    def bind(self, target: ast.AST, t: set[str], env: dict[str, set[str]]) -> None:
        if isinstance(target, ast.Name):
            env.setdefault(target.id, set()).update(t)
        elif isinstance(target, ast.Tuple | ast.List):
            for e in target.elts:
                self.bind(e, t, env)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, t, env)
        elif isinstance(target, ast.Subscript | ast.Attribute):
            root = target.value
            while isinstance(root, ast.Subscript | ast.Attribute):
                root = root.value
            self.bind(root, t, env)

    def expr(self, e: ast.AST, env: dict[str, set[str]]) -> set[str]:
        self.steps += 1
        if self.steps > MAX_STEPS:
            self.truncated = True
            return set()
        if isinstance(e, ast.Name):
            return set(env.get(e.id, ()))
        if isinstance(e, ast.Call):
            return self.call_expr(e, env)
        if isinstance(e, ast.Lambda):
            return set()
        if isinstance(e, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            return self.comprehension(e, env)
        if isinstance(e, ast.NamedExpr):
            t = self.expr(e.value, env)
            self.bind(e.target, t, env)
            return t
        out: set[str] = set()
        for child in ast.iter_child_nodes(e):
            out |= self.expr(child, env)
        return out

    def comprehension(self, e: Any, env: dict[str, set[str]]) -> set[str]:
        self.loops.append(id(e))
        try:
            out: set[str] = set()
            for _ in range(2):
                for g in e.generators:
                    self.bind(g.target, self.expr(g.iter, env), env)
                    for cond in g.ifs:
                        self.expr(cond, env)
                parts = [e.key, e.value] if isinstance(e, ast.DictComp) else [e.elt]
                for p in parts:
                    out |= self.expr(p, env)
            return out
        finally:
            self.loops.pop()

    def call_expr(self, e: ast.Call, env: dict[str, set[str]]) -> set[str]:
        args = [self.expr(a, env) for a in e.args]
        kw = {k.arg or "**": self.expr(k.value, env) for k in e.keywords}
        every = set().union(*args, *kw.values())
        f = e.func
        kind = _sink_kind(f)
        if kind is not None:
            key = (id(e), tuple(self.loops))
            sink = self.sinks.setdefault(key, _Sink(kind, id(e), e.lineno, tuple(self.loops)))
            sink.taint |= every
            if kind == "llm":
                return {"llm", "summary"} if "ret" in every else {"llm"}
            return {"py"} if kind == "python" else {"ret"} if kind == "retrieve" else {"tool"}
        if isinstance(f, ast.Name) and f.id in self.defs:
            out = self.call(self.defs[f.id], args, kw)
            if f.id not in self.env_fns and f.id != "run":
                self.helpers.append((f.id, e.lineno, tuple(self.loops), every))
                out.add(f"h:{f.id}")
            return out
        base = self.expr(f, env)
        if isinstance(f, ast.Attribute) and f.attr in _MUTATORS:
            self.bind(f.value, every, env)
        return base | every


def _sink_kind(f: ast.expr) -> str | None:
    if not isinstance(f, ast.Attribute):
        return None
    if f.attr == "llm":
        return "llm"
    if isinstance(f.value, ast.Attribute) and f.value.attr == "tools":
        return {"python": "python", "retrieve": "retrieve"}.get(f.attr, f"tool:{f.attr}")
    return None


def _env_functions(defs: dict[str, ast.FunctionDef]) -> set[str]:
    """Module functions that call the model or a tool, directly or through each other."""
    calls: dict[str, set[str]] = {}
    direct: set[str] = set()
    for name, fn in defs.items():
        calls[name] = set()
        for n in ast.walk(fn):
            if isinstance(n, ast.Call):
                if _sink_kind(n.func) is not None:
                    direct.add(name)
                elif isinstance(n.func, ast.Name) and n.func.id in defs:
                    calls[name].add(n.func.id)
    out, changed = set(direct), True
    while changed:
        changed = False
        for name, callees in calls.items():
            if name not in out and callees & out:
                out.add(name)
                changed = True
    return out
