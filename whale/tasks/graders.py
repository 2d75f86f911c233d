"""Graders chosen by name: how a task of the user's own (`jsonl:PATH`, ...) scores an answer
against a reference. Each gives a `Grade`: the raw score in [0, 1] and the binary verifier
`correct` every decision uses (each grader says below when an answer is correct).

`task.config.grader` is a name, or a table with `name` and the grader's settings:

- `exact`: the answer equals the reference, surrounding whitespace ignored.
- `normalized` (the default): equal after NFKC, case folding, dropping punctuation (Unicode
  category P) and squeezing whitespace. Articles are kept ("The Who" is not "Who").
- `numeric`: the answer is a number (integer, decimal, fraction, \\frac, percent, commas,
  \\boxed{}; parsed without eval and with a bound on its size, `answers.parse_number`) within
  `tolerance` (absolute, default 0) plus `rel_tolerance` times |reference| (default 0) of the
  reference. The whole answer must be the number: "The answer is 42" is not one.
- `regex`: the answer (stripped) matches the reference read as a pattern, or the `pattern`
  setting when given (then the reference is not used); whole answer unless `search = true`.
- `contains`: the reference occurs in the answer as whole words (SQuAD normalization). An
  answer listing many candidates passes: prefer `normalized` where that matters.
- `f1`: SQuAD token F1 (lower case, punctuation and articles dropped) as the score; correct
  when F1 >= `threshold` (default 1.0: the same tokens; 0.5 is a common lenient choice).
- `judge`: an LLM judge with the SearchQA rubric (`whale.tasks.judged`), or the `rubric` text
  in its place; the model is `task.config.judge = "MODEL"` (the commands build a fixed judge
  from it: temperature 0, seed 0, the response cache). Answers over `JUDGE_MAX_CHARS` are
  rejected unsent.
- `py:TARGET:FUNCTION`: the user's `FUNCTION(question, answer, reference) -> float | bool`
  (TARGET a module or a .py file, `whale.tasks.pytasks`). True (or numpy's) is 1.0; correct
  when the score >= `threshold` (default 1.0). A result that is not a number, is NaN or
  infinite, or is outside [0, 1] is an error, not a clamped score.

A reference is text, a number, or a list of them (any one may match: the best score counts);
a `py:` grader gets the record's value as it is. `regex` and `py:` graders meet answers a
harness wrote, so by default they run out of process (`jailed()` gives `whale.grading` a
`JailedCall`: a jailed grader process, a forked child per answer, `timeout_s` and `memory_mb`
caps; a user function that raises, hangs, allocates without bound or returns a non-number is a
zero grade whose feedback says so, and the next answers are graded). `in_process = true` calls
them here instead: faster, and it trusts the answers (no timeout, no memory cap: a hostile
answer meets whatever the function or the pattern does with it).

Not covered: the jail sees a `py:` grader's module file (or its top package's folder), not
its siblings; a grader that imports a sibling module, whale itself, or reads files next to
it does not start there (its grades say so). A judge reads the answer as text: an answer may
try to talk the judge into CORRECT (the rubric and a fixed judge are the only defence).
"""

from __future__ import annotations

import json
import math
import numbers
import re
import sys
import sysconfig
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any

from whale.config import ConfigError
from whale.errors import WhaleError
from whale.tasks.answers import parse_number
from whale.tasks.base import Grade
from whale.tasks.pytasks import (
    Target,
    import_target,
    load_attribute,
    module_file,
    parse_target,
)
from whale.tasks.textmatch import contains_words, normalize_text, same_text, word_f1

DEFAULT_GRADER = "normalized"
JUDGE_MAX_CHARS = 8000
# where a py: grader's module is bound, read-only, in the jail
JAIL_USER = "/whale/user"
JUDGE_PROMPT = """You grade an answer to a question against a reference answer.
{rubric}
Question: {question}
Reference answer: {reference}
Answer to grade: {answer}
Reply with one word: CORRECT or INCORRECT."""


class GradeOutOfProcess(WhaleError, RuntimeError):
    """`grade()` asked, in process, of a grader that scores out of process (`whale.grading`)."""


@dataclass(frozen=True)
class GraderSettings:
    """`task.config.grader` parsed; each grader reads only its own settings (`READS`)."""

    name: str = DEFAULT_GRADER
    tolerance: float = 0.0
    rel_tolerance: float = 0.0
    pattern: str | None = None
    search: bool = False
    threshold: float = 1.0
    rubric: str | None = None
    in_process: bool = False
    timeout_s: float | None = None  # None: whale.grading's default (GradingLimits)
    memory_mb: int | None = None

    @property
    def kind(self) -> str:
        return "py" if self.name.startswith("py:") else self.name


_JAILED = ("in_process", "timeout_s", "memory_mb")
READS: dict[str, tuple[str, ...]] = {
    "exact": (),
    "normalized": (),
    "contains": (),
    "numeric": ("tolerance", "rel_tolerance"),
    "regex": ("pattern", "search", *_JAILED),
    "f1": ("threshold",),
    "judge": ("rubric",),
    "py": ("threshold", *_JAILED),
}
_TYPES = {f.name: str(f.type) for f in fields(GraderSettings)}


def parse_grader(value: Any, field: str = "task.config.grader") -> GraderSettings:
    """`value` (a name or a table with `name`) as settings; ConfigError naming the field of a
    bad name, an unknown setting, one the grader does not read, or a value out of range."""
    if isinstance(value, str):
        table: dict[str, Any] = {"name": value}
    elif isinstance(value, Mapping):
        table = dict(value)
    else:
        raise ConfigError(f"{field}: expected a grader name or a table with 'name'", field)
    name = table.pop("name", None)
    if not isinstance(name, str):
        raise ConfigError(f"{field}.name: expected a grader name (got {name!r})", f"{field}.name")
    kind = "py" if name.startswith("py:") else name
    if kind not in READS:
        known = ", ".join([*READS][:-1])
        raise ConfigError(f"{field}: unknown grader {name!r}; one of {known}, or "
                          "py:module:function", field)  # fmt: skip
    for key, v in table.items():
        where = f"{field}.{key}"
        if key not in _TYPES:
            raise ConfigError(f"{where}: unknown setting; known: {sorted(set(_TYPES) - {'name'})}",
                              where)  # fmt: skip
        if key not in READS[kind]:
            reads = ", ".join(READS[kind]) or "none"
            raise ConfigError(f"{where}: the {kind} grader has no such setting (its settings: "
                              f"{reads})", where)  # fmt: skip
        table[key] = _checked(where, key, v)
    settings = GraderSettings(name=name, **table)
    if settings.pattern is not None:
        try:
            re.compile(settings.pattern)
        except re.error as e:
            raise ConfigError(f"{field}.pattern: not a regular expression ({e})",
                              f"{field}.pattern") from None  # fmt: skip
    return settings


def _checked(where: str, key: str, v: Any) -> Any:
    kind = _TYPES[key]
    if "bool" in kind:
        ok = isinstance(v, bool)
    elif "float" in kind:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    elif "int" in kind:
        ok = isinstance(v, int) and not isinstance(v, bool)
    else:
        ok = isinstance(v, str)
    if not ok:
        raise ConfigError(f"{where}: expected {kind.replace(' | None', '')} (got {v!r})", where)
    low = {"tolerance": 0, "rel_tolerance": 0, "memory_mb": 64}.get(key)
    if low is not None and v < low:
        raise ConfigError(f"{where}: must be at least {low} (got {v!r})", where)
    if key in ("threshold", "timeout_s") and v <= 0 or key == "threshold" and v > 1 \
            or key == "timeout_s" and v > 3600:  # fmt: skip - past an hour, select() overflows
        bound = "in (0, 1]" if key == "threshold" else "in (0, 3600] seconds"
        raise ConfigError(f"{where}: must be {bound} (got {v!r})", where)
    return float(v) if "float" in kind else v


def golds(reference: Any) -> list[str]:
    """A reference as the texts a built-in grader compares with: text, a number, or a list of
    them. ValueError saying what is wrong (the file loader adds the record and the field)."""
    items = reference if isinstance(reference, list) else [reference]
    out = []
    for r in items:
        if isinstance(r, bool) or not isinstance(r, str | int | float):
            raise ValueError(f"is {type(r).__name__}: expected text, a number or a list of them")
        if isinstance(r, float) and not math.isfinite(r):
            raise ValueError(f"is {r!r}")
        out.append(str(r))
    if not out or not all(s.strip() for s in out):
        raise ValueError("is empty")
    return out


def score_value(value: Any) -> float | str:
    """A user grader's result as a score, or why it is not one (the jailed grader applies the
    same rules, `whale.grading_zygote`)."""
    if isinstance(value, bool):
        return float(value)
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return float(bool(value))  # np.isclose(...) and friends
    if not isinstance(value, numbers.Real):
        return f"grader returned a non-number ({type(value).__name__})"
    v = float(value)
    if not math.isfinite(v):
        return "grader returned NaN or infinity"
    if not 0.0 <= v <= 1.0:
        return "grader returned a score outside [0, 1]"
    return v


@dataclass(frozen=True)
class JailedCall:
    """What `whale.grading` needs to score one answer out of process with a grader that is not
    Reasoning Gym's: the zygote's `kind` ("call": a user function; "regex"), what it loads
    (`grader`, JSON), the host paths bound read-only into the jail (`mounts`), this answer's
    `entry` ((question, reference) or (patterns, search)), the score at which an answer is
    correct, and the jail's limits where the task sets them."""

    kind: str
    grader: dict[str, Any]
    mounts: tuple[tuple[str, str], ...]
    entry: Any
    threshold: float = 1.0
    timeout_s: float | None = None
    memory_mb: int | None = None

    @property
    def dataset_key(self) -> str:
        """One jailed grader per distinct grader (not per question)."""
        return json.dumps([self.kind, self.grader, self.mounts, self.timeout_s, self.memory_mb],
                          sort_keys=True)  # fmt: skip

    def passes_screen(self, answer: str) -> bool:
        return True  # the jail's timeout and memory cap are the guard, not a screen

    def zygote_spec(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.grader}


class Grader(ABC):
    """One grader: `grade(question, answer, reference)`; `jailed(...)` says when it must run
    out of process instead; `check_reference` refuses a reference at load time."""

    def __init__(self, settings: GraderSettings) -> None:
        self.settings = settings

    @abstractmethod
    def grade(self, question: str, answer: str, reference: Any) -> Grade: ...

    @abstractmethod
    def describe(self) -> str:
        """How answers are graded, one line, for the task description the proposer reads."""

    def check_reference(self, reference: Any) -> None:
        golds(reference)

    def jailed(self, question: str, answer: str, reference: Any) -> JailedCall | None:
        return None


class _PerGold(Grader):
    """The best score over the reference's texts; correct at `cut`."""

    cut = 1.0

    @abstractmethod
    def score_one(self, answer: str, gold: str) -> float: ...

    def grade(self, question: str, answer: str, reference: Any) -> Grade:
        best = max(self.score_one(answer, g) for g in golds(reference))
        ok = best >= self.cut
        return Grade(best, ok, self.feedback(best, ok))

    def feedback(self, score: float, ok: bool) -> str:
        return f"{self.settings.kind}: {'match' if ok else 'no match'}"


class Exact(_PerGold):
    def score_one(self, answer: str, gold: str) -> float:
        return float(answer.strip() == gold.strip())

    def describe(self) -> str:
        return "the answer must equal the reference exactly (surrounding whitespace ignored)"


class _Words(_PerGold):
    """A grader over normalized words (whale.tasks.textmatch): a reference with none (only
    punctuation, "-") would be matched by the empty answer, so it is refused at load."""

    def check_reference(self, reference: Any) -> None:
        for g in golds(reference):
            if not normalize_text(g):
                raise ValueError(f"has no letter or digit ({g[:40]!r}): use the exact grader")


class Normalized(_Words):
    def score_one(self, answer: str, gold: str) -> float:
        return float(same_text(answer, gold))

    def describe(self) -> str:
        return ("the answer must equal the reference, ignoring case, spacing and punctuation "
                "outside numbers; numbers compare by value")  # fmt: skip


class Contains(_Words):
    def score_one(self, answer: str, gold: str) -> float:
        return float(contains_words(answer, gold))

    def describe(self) -> str:
        return "the answer must contain the reference as whole words (case, punctuation ignored)"


class F1(_Words):
    def __init__(self, settings: GraderSettings) -> None:
        super().__init__(settings)
        self.cut = settings.threshold

    def score_one(self, answer: str, gold: str) -> float:
        return word_f1(answer, gold)

    def feedback(self, score: float, ok: bool) -> str:
        return f"f1 {score:.3f}"

    def describe(self) -> str:
        return f"token F1 against the reference; correct at F1 >= {self.cut:g}"


class Numeric(_PerGold):
    def __init__(self, settings: GraderSettings) -> None:
        super().__init__(settings)
        # decimal text, so that 0.01 is 1/100 and not the float nearest it
        self.tol = Fraction(str(settings.tolerance))
        self.rel = Fraction(str(settings.rel_tolerance))

    def check_reference(self, reference: Any) -> None:
        for g in golds(reference):
            if parse_number(g) is None:
                raise ValueError(f"is not a number ({g[:40]!r})")

    def score_one(self, answer: str, gold: str) -> float:
        a, g = parse_number(answer), parse_number(gold)
        if a is None or g is None:
            return 0.0
        return float(abs(a - g) <= self.tol + self.rel * abs(g))

    def describe(self) -> str:
        s = self.settings
        within = "" if not (s.tolerance or s.rel_tolerance) else (
            f" within {s.tolerance:g}" + (f" + {s.rel_tolerance:g}·|reference|"
                                          if s.rel_tolerance else ""))  # fmt: skip
        return f"the answer must be a number equal to the reference{within}; give the number only"


class Regex(_PerGold):
    def _patterns(self, reference: Any) -> list[str]:
        return [self.settings.pattern] if self.settings.pattern else golds(reference)

    def check_reference(self, reference: Any) -> None:
        for p in self._patterns(reference):
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"is not a regular expression ({e})") from None

    def score_one(self, answer: str, gold: str) -> float:
        match = re.search if self.settings.search else re.fullmatch
        return float(match(gold, answer.strip()) is not None)

    def grade(self, question: str, answer: str, reference: Any) -> Grade:
        if not self.settings.in_process:
            raise GradeOutOfProcess("the regex grader runs out of process: whale.grading.grade")
        best = max(self.score_one(answer, p) for p in self._patterns(reference))
        return Grade(best, best == 1.0, self.feedback(best, best == 1.0))

    def jailed(self, question: str, answer: str, reference: Any) -> JailedCall | None:
        s = self.settings
        if s.in_process:
            return None
        return JailedCall("regex", {}, (), (self._patterns(reference), s.search),
                          timeout_s=s.timeout_s, memory_mb=s.memory_mb)  # fmt: skip

    def describe(self) -> str:
        where = "somewhere in" if self.settings.search else "the whole of"
        return f"a regular expression must match {where} the answer"


class Judge(Grader):
    def __init__(self, settings: GraderSettings, ask: Callable[[str], str]) -> None:
        super().__init__(settings)
        self.ask = ask

    def grade(self, question: str, answer: str, reference: Any) -> Grade:
        from whale.tasks.judged import RubricJudge

        refs = golds(reference)
        if len(answer) > JUDGE_MAX_CHARS:
            return Grade(0.0, False, "reject: too long for the judge")
        rubric = self.settings.rubric
        if rubric is None:
            return RubricJudge(self.ask).grade(question, answer, refs[0], refs[1:])
        prompt = JUDGE_PROMPT.format(rubric=rubric, question=question,
                                     reference=" | ".join(refs), answer=answer)  # fmt: skip
        try:
            word = self.ask(prompt).strip()
        except Exception as e:  # noqa: BLE001 - a failed judge call is this answer's error
            return Grade(0.0, False, f"judge failed: {type(e).__name__}")
        if word.upper().startswith("INCORRECT"):
            return Grade(0.0, False, "judge: INCORRECT")
        if word.upper().startswith("CORRECT"):
            return Grade(1.0, True, "judge: CORRECT")
        return Grade(0.0, False, f"judge said {word[:20]!r}")

    def describe(self) -> str:
        return "an LLM judge compares the answer with the reference; give one short answer"


class PyGrader(Grader):
    def __init__(self, settings: GraderSettings, field: str) -> None:
        super().__init__(settings)
        self.target = parse_target(settings.name[3:], field)
        self.fn = load_attribute(self.target, None, field)
        if not callable(self.fn):
            raise ConfigError(f"{field}: {settings.name} is not callable", field)
        self.spec, self.mounts = _jail_location(self.target, import_target(self.target, field))

    def check_reference(self, reference: Any) -> None:
        pass  # the user's function reads whatever the record holds

    def grade(self, question: str, answer: str, reference: Any) -> Grade:
        if not self.settings.in_process:
            raise GradeOutOfProcess(f"{self.settings.name} runs out of process: "
                                    "whale.grading.grade, or grader.in_process = true")  # fmt: skip
        try:
            value = score_value(self.fn(question, answer, reference))
        except Exception as e:  # noqa: BLE001 - the user's grader failing is this answer's error
            # the class only: a message may quote the reference, and feedback reaches x_t
            return Grade(0.0, False, f"grader raised {type(e).__name__}")
        if isinstance(value, str):
            return Grade(0.0, False, value)
        return Grade(value, value >= self.settings.threshold)

    def jailed(self, question: str, answer: str, reference: Any) -> JailedCall | None:
        s = self.settings
        if s.in_process:
            return None
        return JailedCall("call", self.spec, self.mounts, (question, reference), s.threshold,
                          s.timeout_s, s.memory_mb)  # fmt: skip

    def describe(self) -> str:
        # not the function's or file's name: the description is x_t, and a name can say
        # how answers are judged beyond what the task says
        return "scored by the user's Python grader"


def _site_folders() -> list[Path]:
    """Folders the grading jail has on its path already: the standard library and the
    environment's site-packages (`whale.grading.site_folders`)."""
    paths = sysconfig.get_paths()
    return [Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")]


def _jail_location(target: Target, module: ModuleType) -> tuple[dict[str, Any], tuple]:
    """What the jailed grader imports and the host path it needs bound: the .py file, the
    module's file, or its top package's folder; nothing for a module installed in the
    environment's site-packages (the jail mounts those)."""
    fn = target.name
    if target.path is not None:
        inside = f"{JAIL_USER}/{target.path.name}"
        spec = {"module": target.path.stem, "file": True, "function": fn}
        return spec, ((str(target.path), inside),)
    dotted = str(target.module)
    where = module_file(sys.modules.get(dotted.split(".")[0], module))
    spec = {"module": dotted, "function": fn, "file": False}
    if where is None or any(where.is_relative_to(s) for s in _site_folders()):
        return spec, ()
    if where.name == "__init__.py":
        where = where.parent  # a package: its whole folder
    return spec, ((str(where), f"{JAIL_USER}/{where.name}"),)


def build_grader(settings: GraderSettings, judge: Any = None,
                 field: str = "task.config.grader") -> Grader:  # fmt: skip
    """The grader `settings` name. `judge` (for `judge`): a `RubricJudge` or any
    `ask(prompt) -> reply` callable; a model name is turned into one by the commands."""
    kind = settings.kind
    if kind == "py":
        return PyGrader(settings, field)
    if kind == "judge":
        ask = getattr(judge, "ask", judge)
        if isinstance(judge, str) or not callable(ask):
            raise ConfigError(
                "task.config.judge: the judge grader needs a judge model: task.config.judge = "
                "'MODEL' from a command or config file, or, from Python, a RubricJudge or an "
                f"ask(prompt) -> reply callable (got {judge!r})", "task.config.judge")  # fmt: skip
        return Judge(settings, ask)
    simple: dict[str, type[_PerGold]] = {"exact": Exact, "normalized": Normalized,
                                         "contains": Contains, "f1": F1, "numeric": Numeric,
                                         "regex": Regex}  # fmt: skip
    return simple[kind](settings)
