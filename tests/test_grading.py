"""Grading out of process (issue 8, "The grader runs harness output as code, in the parent").

The audit (every family in-process-audited or jailed; no code evaluation reachable from an
audited scorer), the screens (every reference passes; code does not), the exact attack (scores
0, writes nothing, reads nothing of the parent), the jail (correct answers still score 1.0, a
hanging answer times out and the eval goes on) and the grader's own limits.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from tests.fakes import ScriptedModel
from whale import grading
from whale.evaluation import evaluate, outcome_of
from whale.harness import Budget, Runtime, Sandbox, Trajectory
from whale.harness.sandbox import nsjail_binary
from whale.tasks import load_task, rg

SYMPY_FAMILIES = [f for f, k in rg.SCREENS.items() if k == "sympy"]
EVAL_FAMILIES = [f for f, k in rg.SCREENS.items() if k == "python"]
_AVAILABLE = {"nsjail": nsjail_binary() is not None, "bwrap": shutil.which("bwrap") is not None}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["nsjail", "bwrap"])
def sandbox(request) -> str:
    """Each jail backend by name (CI has both)."""
    if not _AVAILABLE[request.param]:
        pytest.skip(f"{request.param} is not installed")
    return request.param


@pytest.fixture(autouse=True, scope="module")
def _close_graders():
    yield
    grading.close_all()


def marker_path() -> Path:
    """A host path the attack tries to write: letters only, since countdown and puzzle24
    count the digits of the whole answer."""
    return Path("/tmp") / ("whale-attack-" + "".join(random.choices(string.ascii_lowercase, k=12)))


def attack(marker: Path, reference: str, *, need_question: bool = False) -> str:
    """The issue's attack: exec() walks the frames up to score_answer, reads entry['answer'],
    scans gc for whale Question objects and writes a file; `or <reference>` then scores 1.0.
    With need_question it raises unless it found a Question (so only a grader that can see the
    parent's memory scores it 1.0)."""
    code = (
        "import sys,gc\\n"
        "f=sys._getframe()\\n"
        "while f and f.f_code.co_name!='score_answer': f=f.f_back\\n"
        "refs=[o for o in gc.get_objects() if type(o).__name__=='Question']\\n"
    )
    if need_question:
        code += "assert refs\\n"
    code += f"open('{marker}','w').write(repr(f.f_locals['entry']['answer'])+repr(len(refs)))"
    return f'exec("{code}") or {reference}'


# --- the audit -----------------------------------------------------------------------------


def test_every_family_is_in_exactly_one_of_the_audited_sets():
    from reasoning_gym.factory import DATASETS

    jailed = set(rg.JAILED)
    assert not rg.IN_PROCESS & jailed, "a family is both audited pure and jailed"
    missing = sorted(set(DATASETS) - rg.IN_PROCESS - jailed)
    assert not missing, f"families neither audited for in-process scoring nor jailed: {missing}"
    assert not (rg.IN_PROCESS | jailed) - set(DATASETS), "audit names a family that is gone"
    assert set(rg.SCREENS) <= jailed


FORBIDDEN = re.compile(
    r"\b(eval|exec|compile|__import__|literal_eval|sympy|sympify|parse_expr|pickle|marshal|"
    r"subprocess|importlib|getattr|setattr|globals|locals)\b|\bos\.(system|popen|exec\w*)"
)
# Modules an audited scorer may call into (numbers, strings, json, numpy's comparisons).
ALLOWED_EXTERNAL = re.compile(
    r"(typing|json|re|math|decimal|copy|numpy|datetime|enum|random|collections|functools|"
    r"itertools|string|dataclasses)(\.|$)"
)


def _code_without_docs(fn: types.FunctionType) -> tuple[str, ast.AST]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree), tree  # unparse drops the comments


def _ours(obj: object) -> bool:
    mod = getattr(obj, "__module__", None) or ""
    return mod.startswith(("reasoning_gym", "whale.tasks"))


def scorer_reach(family: str) -> tuple[dict[str, str], list[str]]:
    """The code reachable from a family's scorer that we can resolve (methods of the dataset
    class via self.X, module functions and classes of reasoning_gym by name), and the
    problems: forbidden names in that code, unresolvable self.X calls, calls into modules
    outside ALLOWED_EXTERNAL, forbidden builtins."""
    from reasoning_gym.factory import DATASETS

    cls, _ = DATASETS[family]
    start = rg._SCORER_FIXES.get(family) or inspect.getattr_static(cls, "score_answer")
    texts: dict[str, str] = {}
    problems: list[str] = []
    todo: list[tuple[object, type]] = [(start, cls)]  # (function, the class of its self)
    seen: set[int] = set()

    def visit(obj: object, owner: type) -> None:
        if isinstance(obj, types.MethodType):  # a classmethod read off its class
            self_ = obj.__self__
            obj, owner = obj.__func__, self_ if isinstance(self_, type) else type(self_)
        if isinstance(obj, staticmethod | classmethod):
            obj = obj.__func__
        if isinstance(obj, property):
            obj = obj.fget
        if isinstance(obj, types.FunctionType):
            if _ours(obj):
                todo.append((obj, owner))
            elif not ALLOWED_EXTERNAL.match(obj.__module__ or ""):
                problems.append(f"calls {obj.__module__}.{obj.__qualname__}")
        elif isinstance(obj, type):
            if _ours(obj):
                for v in vars(obj).values():
                    if _ours(v) or isinstance(v, staticmethod | classmethod | property):
                        visit(v, obj)
            elif not ALLOWED_EXTERNAL.match(obj.__module__):
                problems.append(f"uses {obj.__module__}.{obj.__qualname__}")
        elif isinstance(obj, types.ModuleType):
            if not (ALLOWED_EXTERNAL.match(obj.__name__) or obj.__name__.startswith(
                    ("reasoning_gym", "whale.tasks"))):
                problems.append(f"uses module {obj.__name__}")
        elif callable(obj) and not ALLOWED_EXTERNAL.match(getattr(obj, "__module__", "") or ""):
            problems.append(f"calls {obj!r}")

    while todo:
        fn, owner = todo.pop()
        fn = inspect.unwrap(fn)  # type: ignore[arg-type]
        if not isinstance(fn, types.FunctionType) or id(fn) in seen:
            continue
        seen.add(id(fn))
        try:
            code, tree = _code_without_docs(fn)
        except OSError:  # no source: only dataclass-generated dunders are expected
            if fn.__code__.co_filename != "<string>" or not fn.__name__.startswith("__"):
                problems.append(f"{fn.__qualname__}: no source to audit")
            continue
        texts[f"{fn.__module__}.{fn.__qualname__}"] = code
        problems += [f"{fn.__qualname__}: {m.group(0)}" for m in FORBIDDEN.finditer(code)]
        g = fn.__globals__
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                base = node.value.id
                if base in ("self", "cls"):
                    found = inspect.getattr_static(owner, node.attr, None)
                    if found is None and _is_called(tree, node):
                        problems.append(f"{fn.__qualname__}: self.{node.attr}() not resolvable")
                    elif found is not None:
                        visit(getattr(found, "func", found), owner)  # cached_property: .func
                elif isinstance(g.get(base), types.ModuleType | type):
                    found = getattr(g[base], node.attr, None)
                    if found is not None:
                        visit(found, g[base] if isinstance(g[base], type) else owner)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in g:
                    visit(g[node.id], owner)
                elif node.id in ("eval", "exec", "compile", "__import__", "open", "getattr"):
                    problems.append(f"{fn.__qualname__}: builtin {node.id}")
                elif not hasattr(builtins, node.id) and node.id not in _local_names(tree):
                    problems.append(f"{fn.__qualname__}: unresolved name {node.id}")
    return texts, problems


def _is_called(tree: ast.AST, attr: ast.Attribute) -> bool:
    return any(isinstance(n, ast.Call) and n.func is attr for n in ast.walk(tree))


def _local_names(tree: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.FunctionDef):
            names.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


@pytest.mark.parametrize("family", sorted(rg.IN_PROCESS))
def test_audited_scorer_reaches_no_code_evaluation(family):
    texts, problems = scorer_reach(family)
    assert texts, f"{family}: no scorer source found"
    assert not problems, f"{family} is graded in process but: {problems}"


@pytest.mark.parametrize("family", sorted(rg.SCREENS) + ["sokoban", "coin_flip", "codeio"])
def test_the_audit_finds_the_known_hazards(family):
    # The same walk flags what the jailed families do: so the test above can fail.
    _, problems = scorer_reach(family)
    assert problems, f"the audit walk found nothing in {family}'s scorer"


# --- the screens ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(rg.SCREENS))
def test_screen_accepts_every_reference_answer(family):
    task = rg.ReasoningGymTask(family, size=200, seed=11)
    # reasoning-gym's own references for intermediate_integration are sometimes left
    # unevaluated ("3*Integral(x**3*cos(3*x), x) + C"); the screen refuses Integral (copying the
    # integrand into one scores 1.0), so those questions need a closed form: see below. A
    # reference decided before the screen (string_insertion's exact match) is not screened.
    refs = [(q, str(q.reference["answer"])) for q in task.questions()
            if "Integral" not in str(q.reference["answer"])]  # fmt: skip
    refused = [a for q, a in refs
               if task.precheck(q, a) is None and not rg.passes_screen(rg.SCREENS[family], a)]  # fmt: skip
    assert not refused, f"{family}: the screen refuses {len(refused)} references: {refused[:3]}"
    assert len(refs) >= 150


def test_a_closed_form_scores_where_the_reference_is_an_unevaluated_integral(sandbox):
    import sympy

    task = rg.ReasoningGymTask("intermediate_integration", size=200, seed=11)
    q = next(q for q in task.questions() if "Integral" in str(q.reference["answer"]))
    x = sympy.Symbol(q.reference["metadata"]["variable"])
    closed = f"{sympy.integrate(sympy.sympify(q.reference['metadata']['integrand']), x)} + C"
    assert rg.plain_expression(closed)
    assert grading.grade(task, q, closed, sandbox=sandbox).score == 1.0


@pytest.mark.parametrize("family,answer", [
    ("simple_integration", "Integral({integrand}, {variable})"),
    ("intermediate_integration", "Integral({integrand}, {variable}) + C"),
])  # fmt: skip
def test_an_unevaluated_integral_of_the_integrand_is_refused(family, answer, sandbox):
    task = rg.ReasoningGymTask(family, size=5, seed=0)
    for q in task.questions():
        a = answer.format(**q.reference["metadata"])
        g = grading.grade(task, q, a, sandbox=sandbox)
        assert g.score == 0.0 and g.feedback == grading.REJECTED


@pytest.mark.parametrize("answer", ["9**9**9**9", "N(pi, 10**8)", "2**(10**6)", "x**1000",
                                    "S(10)**10", "2^3^4", "1e99999", "x**(2**40)",
                                    "((x+1)**99+1)**99", "exp(exp(exp(9)))"])
def test_answers_that_make_sympy_compute_for_minutes_are_refused_by_the_screen(answer):
    assert not rg.plain_expression(answer)


@pytest.mark.parametrize("answer", ["x**2/2 + C", "2*x**3 - x**(1/2)", "exp(-x**2)", "(x+1)^2",
                                    "x**100", "sin(x)**2", "-x**(-3)"])
def test_ordinary_powers_pass_the_screen(answer):
    assert rg.plain_expression(answer)


def test_a_constant_puzzle24_answer_does_not_score():
    task = rg.ReasoningGymTask("puzzle24", size=10, seed=0)
    scores = [grading.grade(task, q, "4*3*2*1").score for q in task.questions()]
    assert max(scores) < 1.0
    q = task.questions()[0]
    assert grading.grade(task, q, q.reference["answer"]).score == 1.0


@pytest.mark.parametrize("answer", [
    'exec("import os") or 1', "__import__('os')", "x.real", "(x).conjugate()", "1 .real",
    "x_1", "lambda: 1", "1 or 2", "[1, 2]", "x[0]", "eval(x)", "open(x)", "S(x); y",
    "x\\n", "\uff45\uff58\uff45\uff43(x)", "x @ y", "x if y else z", "Symbol(x)", "2.x",
    "1" * (rg.PLAIN_MAX_CHARS + 1),
])  # fmt: skip
def test_plain_expression_screen_refuses_code(answer):
    assert not rg.plain_expression(answer)


@pytest.mark.parametrize("answer", [
    "-5*X**9 - 2*X**6/3 + 4*X**3 + C", "10*(8 - 5) - 6", "exp(x)*sin(x) + C", "x^2 + 1.5e3",
    "sqrt(2)*pi", "x1 + y2", "-4*(-2*x - 8)**(3/2)/3 + C", "  7 ",
])  # fmt: skip
def test_plain_expression_screen_accepts_math(answer):
    assert rg.plain_expression(answer)


@pytest.mark.parametrize("answer", [
    "__import__('os').system('id')", " __import__('os')", "\t[x for x in ()]", "a.b",
    "f(1)", "[1] * 10", "_", "(lambda: 0)", "{1: 2}", "1 + 1", "-x", "a\x00b", "-" * 100_000 + "1",
    "ABCDE", "oracle_answer", "entry",
])  # fmt: skip
def test_python_screen_refuses_code(answer):
    assert not rg.python_literal_or_not_code(answer)


@pytest.mark.parametrize("answer", [
    "[[1, 0], [0, 1]]", "['A', 'B']", "0 1\n1 0", "_ Q _\nQ _ _", "-3", "(1, 'x')",
])  # fmt: skip
def test_python_screen_accepts_literals_and_non_code(answer):
    assert rg.python_literal_or_not_code(answer)


# --- the attack ----------------------------------------------------------------------------


def test_the_attack_is_real_against_an_unjailed_scorer(tmp_path):
    # Control: in a plain process the answer scores 1.0, writes its file and sees
    # whale's Question objects. (A subprocess, so this test process runs none of it.)
    markers = {f: marker_path() for f in SYMPY_FAMILIES}
    script = tmp_path / "control.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_grading import attack
        from whale.tasks import load_task
        from pathlib import Path
        out = {{}}
        for family, marker in {json.dumps({f: str(m) for f, m in markers.items()})}.items():
            task = load_task("rg:" + family, size=3, seed=0)
            q = task.questions()[0]
            a = attack(Path(marker), q.reference["answer"], need_question=True)
            out[family] = task.dataset.score_answer(a, q.reference)
        print(json.dumps(out))
    """))
    try:
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout.strip().splitlines()[-1]) == dict.fromkeys(markers, 1.0)
        for family, m in markers.items():
            assert m.exists(), family  # it wrote the file, having seen Questions
    finally:
        for m in markers.values():
            m.unlink(missing_ok=True)


@pytest.mark.parametrize("family", SYMPY_FAMILIES)
def test_the_attack_through_the_evaluator_scores_zero_and_writes_nothing(family):
    task = load_task(f"rg:{family}", size=3, seed=0)
    q = task.questions()[0]
    marker = marker_path()
    t = Trajectory(question_id=q.id, harness_hash="h", answer=attack(marker, q.reference["answer"]),
                   sandbox="nsjail" if _AVAILABLE["nsjail"] else "bwrap")  # fmt: skip
    out = outcome_of(task, q, t)
    assert (out.score, out.correct, out.feedback) == (0.0, False, grading.REJECTED)
    assert not marker.exists()


def test_in_process_grade_refuses_a_jailed_family():
    task = load_task("rg:countdown", size=2, seed=0)
    q = task.questions()[0]
    marker = marker_path()
    with pytest.raises(rg.GradeInJail, match="out of process"):
        task.grade(q, attack(marker, q.reference["answer"]))
    assert not marker.exists()


def test_an_attack_past_the_screen_stays_in_the_jail(sandbox, monkeypatch):
    # Defense in depth: with the screen switched off, the answer runs only in the jail: it
    # cannot write the host's /tmp and finds no Question of the parent (so `need_question`
    # raises and the scorer's except gives its 0.01, not 1.0).
    monkeypatch.delitem(rg.SCREENS, "countdown")
    task = load_task("rg:countdown", size=3, seed=0)
    q = task.questions()[0]
    marker = marker_path()
    g = grading.grade(task, q, attack(marker, q.reference["answer"], need_question=True), sandbox)
    assert g.score < 1.0 and not g.correct, g
    assert not marker.exists()


@pytest.mark.parametrize("family", SYMPY_FAMILIES + EVAL_FAMILIES)
def test_correct_answers_still_score_one_through_the_jail(family, sandbox):
    task = load_task(f"rg:{family}", size=3, seed=5)
    for q in task.questions():
        if "Integral" in str(q.reference["answer"]):
            continue  # an unevaluated reference: see test_a_closed_form_scores_where_...
        assert task.jailed_grading(q, str(q.reference["answer"])) is not None
        g = grading.grade(task, q, str(q.reference["answer"]), sandbox)
        assert (g.score, g.correct) == (1.0, True), (family, q.reference["answer"], g)
    wrong = grading.grade(task, task.questions()[0], "7", sandbox)
    assert not wrong.correct and wrong.score < 1.0


def test_hanging_answer_times_out_and_the_eval_goes_on(monkeypatch):
    monkeypatch.setattr(grading, "LIMITS", grading.GradingLimits(timeout_s=1.0))
    kind = "nsjail" if _AVAILABLE["nsjail"] else "bwrap"
    # passes the screen (496 terms at most, exponents <= 100), yet simplifying its derivative
    # (trigonometric powers) takes sympy minutes: what the jail's timeout is for
    hang = "(sin(x)+cos(x)+tan(x))**30"
    assert rg.plain_expression(hang)
    task = load_task("rg:simple_integration", size=3, seed=0)
    qs = task.questions()
    grading.grade(task, qs[2], "1", kind)  # start the grader: the timing below is grading only
    t0 = time.monotonic()
    g = grading.grade(task, qs[2], hang, kind)
    assert g == grading.Grade(0.0, False, grading.TIMEOUT)
    assert time.monotonic() - t0 < 1.0 + 3.0  # the grader's own timeout, not the parent's 5 s
    rt = Runtime(model=ScriptedModel(), budget=Budget(run_timeout_s=20), sandbox=Sandbox(kind))
    source = f"def run(question, env):\n    return {hang!r}\n"
    result = evaluate(rt, source, task, qs[:2], workers=2)
    # every run is recorded and graded; the hanging grade is a zero with its reason
    assert [o.status for o in result.outcomes] == ["ok", "ok"]
    assert grading.TIMEOUT in [o.feedback for o in result.outcomes]
    assert all(o.score == 0.0 for o in result.outcomes)
    ref = qs[2].reference["answer"]
    assert grading.grade(task, qs[2], ref, kind).correct  # the grader still serves


# --- the grader's limits -------------------------------------------------------------------


def test_long_answer_of_an_audited_family_is_graded_in_the_jail():
    task = load_task("rg:basic_arithmetic", size=2, seed=0)
    q = task.questions()[0]
    long = str(q.reference["answer"]) + " " * rg.IN_PROCESS_MAX_CHARS
    with pytest.raises(rg.GradeInJail, match="longer than"):
        task.grade(q, long)
    expected = task.dataset.score_answer(long, q.reference)  # this scorer is pure: a control
    g = grading.grade(task, q, long, "nsjail" if _AVAILABLE["nsjail"] else "bwrap")
    assert g.score == pytest.approx(expected) and g.feedback == ""


def test_answer_over_the_jail_cap_is_rejected_unsent():
    task = load_task("rg:string_insertion", size=2, seed=0)
    q = task.questions()[0]
    limits = grading.GradingLimits(max_answer_chars=100)
    g = grading.grade(task, q, str(list(range(40))), "nsjail", limits)
    assert g == grading.Grade(0.0, False, grading.TOO_LONG)


def test_a_grader_that_cannot_start_is_a_recorded_zero():
    task = load_task("rg:countdown", size=2, seed=0)
    q = task.questions()[0]
    limits = grading.GradingLimits(memory_mb=40)  # too small to import reasoning_gym
    g = grading.grade(task, q, q.reference["answer"], "nsjail" if _AVAILABLE["nsjail"] else "bwrap", limits)
    assert g.score == 0.0 and g.feedback.startswith(grading.UNAVAILABLE), g


def test_at_most_limits_zygotes_graders_live():
    grading.close_all()
    limits = grading.GradingLimits(zygotes=1)
    kind = "nsjail" if _AVAILABLE["nsjail"] else "bwrap"
    for seed in (1, 2):
        task = load_task("rg:puzzle24", size=2, seed=seed)
        q = task.questions()[0]
        assert grading.grade(task, q, q.reference["answer"], kind, limits).correct
    assert len(grading.live_zygotes()) == 1


@pytest.mark.parametrize("line,grade", [
    (b"ok 0.5", grading.Grade(0.5, False)), (b"ok 1.0", grading.Grade(1.0, True)),
    (b"ok 7", grading.Grade(1.0, True)), (b"ok -3", grading.Grade(0.0, False)),
    (b"ok nan", grading.Grade(0.0, False)), (b"ok inf", grading.Grade(0.0, False)),
    (b"error", grading.Grade(0.0, False, grading.SCORER_ERROR)),
    (b"timeout", grading.Grade(0.0, False, grading.TIMEOUT)),
    (b"ok 0.5 you were right", grading.Grade(0.0, False, grading.CRASHED)),
    (b"the answer was 42", grading.Grade(0.0, False, grading.CRASHED)),
])  # fmt: skip
def test_only_a_clamped_float_or_a_fixed_word_comes_back(line, grade):
    assert grading._parse_reply(line) == grade


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task_dir in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task_dir / "children").read_text().split()]
            except OSError:
                pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("kind", ["nsjail", "bwrap", "unsafe"])
def test_graders_die_with_their_whale(kind, tmp_path):
    if kind != "unsafe" and not _AVAILABLE[kind]:
        pytest.skip(f"{kind} is not installed")
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_grading import _tree
        from whale import grading
        from whale.tasks import load_task
        task = load_task("rg:countdown", size=2, seed=0)
        q = task.questions()[0]
        assert grading.grade(task, q, q.reference["answer"], {kind!r}).correct
        print(*_tree(grading.live_zygotes()[0]), flush=True)
        time.sleep(120)
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)  # fmt: skip
    try:
        assert owner.stdout is not None
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) >= (1 if kind == "unsafe" else 2), pids  # the jail and the grader
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"grader processes outlived their whale: {left}"


HOSTILE = [
    "9" * 4300, "1e999999999", "-1e999999999", "1e-999999999", "A+" + "9" * 4000,
    "R" + "9" * 4000, "(" * 4000 + ")" * 4000, "[" * 4000 + "]" * 4000,
    '{"a":' * 1300 + "1" + "}" * 1300, ", " * 4096, "1" * 8191 + "a", "move(" + ", " * 4090,
    "Move disk 1 from Peg 1 to Peg 2\n" * 250, "A" * 8192, "ABC" * 2730, "0x" + "f" * 8190,
    "[" + ",".join(["1e308"] * 1300) + "]", "1/" + "9" * 4000, "\\frac{" + "9" * 4000 + "}{1}",
    "x" * 8192, "\n".join(["1 2 3 4 5 6 7 8 9"] * 400), "A" * 4000 + " and " + "B" * 4000,
    "9" * 4000 + "\u00d7" + "9" * 4000, "True " * 1600, "0:" * 4000,
]  # fmt: skip


def test_audited_scorers_do_not_stall_on_hostile_answers(tmp_path):
    # Every in-process scorer on answers up to IN_PROCESS_MAX_CHARS: none may stall the
    # evaluator. Run in a child so a hang fails, not blocks.
    assert all(len(a) <= rg.IN_PROCESS_MAX_CHARS for a in HOSTILE)
    script = tmp_path / "fuzz.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_grading import HOSTILE
        from whale.tasks import load_task, rg
        worst = (0.0, "", "")
        for family in sorted(rg.IN_PROCESS):
            task = load_task("rg:" + family, size=2, seed=0)
            for q in task.questions():
                for a in HOSTILE:
                    t = time.perf_counter()
                    task.grade(q, a)
                    dt = time.perf_counter() - t
                    if dt > worst[0]:
                        worst = (dt, family, a[:30])
        print("\\nWORST", json.dumps(worst))
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=180, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    worst = json.loads(run.stdout.rsplit("WORST", 1)[1])
    # A stall guard, not a speed figure (issue 20: no CPU-dependent bounds in tests): ten
    # times the bound it replaced; a scorer that stalls on a hostile answer takes minutes.
    assert worst[0] < 10.0, f"slowest in-process grade: {worst}"


@pytest.mark.parametrize("family", EVAL_FAMILIES)
def test_a_bare_name_cannot_read_the_scorers_reference(family, sandbox):
    task = load_task(f"rg:{family}", size=3, seed=0)
    for q in task.questions():
        g = grading.grade(task, q, "oracle_answer", sandbox)
        assert g.score == 0.0 and g.feedback == grading.REJECTED


def test_the_exact_string_insertion_answer_still_scores():
    task = load_task("rg:string_insertion", size=5, seed=0)
    for q in task.questions():
        assert grading.grade(task, q, q.reference["answer"]).score == 1.0
