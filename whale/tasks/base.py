"""Task, Question, Grade and the split helper.

A task is a description, a pool of questions and a grader. The grader and the references stay
in the parent process: a harness only ever receives `Question.prompt`.

A task is written by subclassing `TaskBase` and giving the four required members (`name`,
`description`, `questions`, `grade`); the optional capabilities (`CAPABILITIES`: a retriever,
expected answers, a format check, gold passages, a precheck, jailed grading) default to "not
offered", so callers read `task.retriever` or `task.expected(q)` without probing.
"""

from __future__ import annotations

import json
import numbers
import random
import time
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from whale.errors import WhaleError
from whale.records import RecordError, read_json, write_atomic


@dataclass(frozen=True)
class Question:
    id: str
    prompt: str
    reference: Any = field(repr=False)  # never visible to a harness
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Grade:
    """`score` in [0, 1] is the raw grade; `correct` is the binary verifier R(x, τ)."""

    score: float
    correct: bool
    feedback: str = ""


def graded_here(task: Task, question: Question, answer: str) -> Grade:
    """`task.grade` in this process on an untrusted answer. A task's grade may be the user's
    code (`py:` tasks, entry points): an exception (SystemExit included) is a zero grade whose
    feedback names its class only (its message may quote the reference, and feedback reaches
    the proposer); what it returns goes through `checked_grade`. Not covered: a grade() that
    hangs hangs its grading thread (a `py:` task's code is trusted to return)."""
    try:
        return checked_grade(task.grade(question, answer))
    except (Exception, SystemExit) as e:  # noqa: BLE001 - reported as this answer's grade
        return grader_error(e)


def grader_error(e: BaseException) -> Grade:
    return Grade(0.0, False, f"grader error: {type(e).__name__}")


def checked_grade(g: Any) -> Grade:
    """A Grade with `correct` true or false and a finite `score` in [0, 1], as a plain Grade;
    anything else is a zero grade saying so. `correct` is the binary verifier: a partial score
    handed as `correct` would turn accuracy into a mean score, which ranking reads."""
    try:
        if not isinstance(g, Grade):
            return Grade(0.0, False, f"grader returned {type(g).__name__}, not a Grade")
        correct, score, feedback = g.correct, g.score, g.feedback
        if type(correct).__module__ == "numpy" and type(correct).__name__ in ("bool", "bool_"):
            correct = bool(correct)
        if not isinstance(correct, bool):
            return Grade(0.0, False, f"grader's correct is {type(correct).__name__}, "
                                     "not True/False")  # fmt: skip
        if isinstance(score, bool) or not isinstance(score, numbers.Real) \
                or not 0.0 <= float(score) <= 1.0:  # fmt: skip - NaN fails both comparisons
            return Grade(0.0, False, "grader's score is not a number in [0, 1]")
        return Grade(float(score), correct, feedback if isinstance(feedback, str) else "")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a property that raises, an overflow
        return grader_error(e)


class Retriever(Protocol):
    """A passage index a task hands every run (`env.tools.retrieve`); the runtime's
    `whale.harness.broker.Retriever` is the same shape (tasks import nothing of the harness)."""

    def retrieve(self, query: str, k: int) -> list[dict[str, Any]]: ...


class JailedGrading(Protocol):
    """What the grading jail needs for one answer (`whale.grading`); the one kind today is
    `whale.tasks.rg.JailedGrading`, which also carries the dataset the jail rebuilds."""

    @property
    def entry(self) -> Any: ...

    @property
    def dataset_key(self) -> str: ...

    def passes_screen(self, answer: str) -> bool: ...


# The optional members of Task, each with a "not offered" default in TaskBase.
CAPABILITIES = (
    "retriever",
    "expected",
    "format_ok",
    "gold_passages",
    "precheck",
    "jailed_grading",
)


class Task(Protocol):
    """What every command reads of a task. `name`, `description`, `questions` and `grade` are
    required; the rest are the capabilities a task may offer (`TaskBase` gives the defaults)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    def questions(self) -> list[Question]: ...

    def grade(self, question: Question, answer: str) -> Grade: ...

    @property
    def retriever(self) -> Retriever | None: ...

    def expected(self, question: Question) -> str | None: ...

    def format_ok(self, question: Question, answer: str) -> bool: ...

    def gold_passages(self, question: Question) -> list[str]: ...

    def precheck(self, question: Question, answer: str) -> Grade | None: ...

    def jailed_grading(self, question: Question, answer: str) -> JailedGrading | None: ...


class TaskBase(ABC):
    """The base every task inherits. A subclass gives `name` and `description` (attributes or
    properties), `questions()` and `grade()`; each capability below it may override:

    - `retriever`: the passage index every run of the task may search (None: no retrieve tool);
    - `expected(q)`: the reference answer as text, for reports that may show it (None: not shown);
    - `format_ok(q, answer)`: the answer has the shape the task asks for (default: not blank);
    - `gold_passages(q)`: ids of the passages that answer `q`, for the retrieval hit rate
      (empty: no hit rate);
    - `precheck(q, answer)`: a grade decided by string handling before any scorer runs
      (None: the scorer decides);
    - `jailed_grading(q, answer)`: what the grading jail needs when `grade()` may not score
      this answer in process (None: `grade()` scores it here)."""

    @abstractmethod
    def questions(self) -> list[Question]: ...

    @abstractmethod
    def grade(self, question: Question, answer: str) -> Grade: ...

    @property
    def retriever(self) -> Retriever | None:
        return None

    def expected(self, question: Question) -> str | None:
        return None

    def format_ok(self, question: Question, answer: str) -> bool:
        return bool(answer.strip())

    def gold_passages(self, question: Question) -> list[str]:
        return []

    def precheck(self, question: Question, answer: str) -> Grade | None:
        return None

    def jailed_grading(self, question: Question, answer: str) -> JailedGrading | None:
        return None


class WrappedTask(TaskBase):
    """`inner` seen through a wrapper that overrides some members. Every member it does not
    override is the inner task's: the protocol's members are forwarded one by one (TaskBase's
    defaults would otherwise shadow the inner task's capabilities), and any other attribute (a
    family's own, such as `passages`) by `__getattr__`."""

    def __init__(self, inner: Task) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def description(self) -> str:
        return self.inner.description

    def questions(self) -> list[Question]:
        return self.inner.questions()

    def grade(self, question: Question, answer: str) -> Grade:
        return self.inner.grade(question, answer)

    @property
    def retriever(self) -> Retriever | None:
        return self.inner.retriever

    def expected(self, question: Question) -> str | None:
        return self.inner.expected(question)

    def format_ok(self, question: Question, answer: str) -> bool:
        return self.inner.format_ok(question, answer)

    def gold_passages(self, question: Question) -> list[str]:
        return self.inner.gold_passages(question)

    def precheck(self, question: Question, answer: str) -> Grade | None:
        return self.inner.precheck(question, answer)

    def jailed_grading(self, question: Question, answer: str) -> JailedGrading | None:
        return self.inner.jailed_grading(question, answer)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "inner":  # copy/pickle probe before __init__
            raise AttributeError(name)
        return getattr(self.inner, name)


class UnknownTask(WhaleError, ValueError):
    pass


class SplitOverlap(WhaleError, ValueError):
    pass


def normalize_prompt(text: str) -> str:
    """A question's identity, for dedupe, disjoint splits and exclusions: NFKC, case-folded,
    every run of whitespace one space, without trailing sentence punctuation. Symbols, emoji,
    brackets and operators are kept: "2+3" and "2*3", "(1+2)*3" and "1+(2*3)", two emoji puzzles,
    two boards drawn with "." and "#" are different questions. (Folding every non-word character,
    as this did before, made the first 200 questions of rg:emoji_mystery, rg:modulo_grid and
    rg:rectangle_count one text each and rg:sokoban's eight (tests/tasks/test_normalize.py),
    and merged some in other families: "2+3" and "2*3" were one text.)"""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_STRAIGHT_QUOTES)
    return " ".join(text.split()).rstrip(".?!。？！ ")


# Typographic quotes as the straight ones (NFKC leaves them): a data file's copy of a question
# re-typed in an editor is the same question.
_STRAIGHT_QUOTES = str.maketrans({c: "'" for c in "\u2018\u2019\u201a\u201b"}
                                 | {c: '"' for c in "\u201c\u201d\u201e\u201f"})


def fold_text(text: str) -> str:
    """`text` as it is searched for a question inside a longer text (a held-out prompt inside a
    training corpus): NFKC, case-folded, punctuation (quotes, brackets, dots, dashes; not "_")
    and invisible format characters as spaces, operators spaced apart ("2+2" is "2 + 2"; "−",
    "×", "÷" are "-", "*", "/"), whitespace squeezed (`_fold_char`). Looser than
    `normalize_prompt`, so that a question quoted, escaped, re-punctuated or re-spaced inside a
    report is still found; symbols, emoji and "#" stay, so that different questions of one
    template (rg:emoji_mystery, rg:rectangle_count) do not all fold to their shared words."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_SAME_OPERATOR)
    return " ".join("".join(_fold_char(c) for c in text).split())


def _fold_char(c: str) -> str:
    """fold_text's rule for one character. A space: punctuation (quotes, brackets, dots,
    dashes) and control or invisible format characters (zero-width spaces and joiners, which
    whitespace squeezing does not see). Padded with a space on each side, so that "2+2" and
    "2 + 2" fold to one text: operators (math, currency and modifier symbols, and "*", "/",
    "%", "&", "@"). Kept as they are: letters, digits, "_", "#" and other symbols (emoji, box
    drawing: the cells of a board)."""
    cat = unicodedata.category(c)
    if c in _OPERATORS or cat in ("Sm", "Sc", "Sk"):
        return f" {c} "
    if c in "_#" or cat[0] not in "PC":
        return c
    return " " if cat[0] == "P" or cat in ("Cf", "Cc") else c


_OPERATORS = frozenset("*/%&@")
_SAME_OPERATOR = str.maketrans({"\u2212": "-", "\u00d7": "*", "\u00f7": "/"})


def check_disjoint(named: Mapping[str, Sequence[Question]]) -> None:
    """Raise SplitOverlap naming the questions that two splits share by id or normalized text."""
    seen_id: dict[str, str] = {}
    seen_text: dict[str, tuple[str, str]] = {}
    clashes: list[str] = []
    for split, qs in named.items():
        for q in qs:
            if q.id in seen_id and seen_id[q.id] != split:
                clashes.append(f"{q.id} (id in {seen_id[q.id]} and {split})")
            norm = normalize_prompt(q.prompt)
            other = seen_text.get(norm)
            if other is not None and other[0] != split:
                clashes.append(f"{q.id} (same text as {other[1]} in {other[0]})")
            seen_id.setdefault(q.id, split)
            seen_text.setdefault(norm, (split, q.id))
    if clashes:
        shown = "; ".join(clashes[:10]) + (
            f"; and {len(clashes) - 10} more" if len(clashes) > 10 else ""
        )
        raise SplitOverlap(f"splits overlap: {shown}")


def dedupe(questions: Iterable[Question]) -> list[Question]:
    """Drop later questions whose id or normalized prompt repeats an earlier one."""
    ids, texts, out = set(), set(), []
    for q in questions:
        norm = normalize_prompt(q.prompt)
        if q.id in ids or norm in texts:
            continue
        ids.add(q.id)
        texts.add(norm)
        out.append(q)
    return out


def split(
    questions: Sequence[Question], sizes: dict[str, int], rng: random.Random
) -> dict[str, list[Question]]:
    """Disjoint splits of the given sizes (by id and normalized text), drawn with `rng`."""
    pool = dedupe(questions)
    need = sum(sizes.values())
    if need > len(pool):
        raise ValueError(
            f"asked for {need} distinct questions, the pool has {len(pool)} "
            "(a larger pool: --set task.size=N)"
        )
    order = list(pool)
    rng.shuffle(order)
    out, i = {}, 0
    for name, n in sizes.items():
        out[name] = order[i : i + n]
        i += n
    check_disjoint(out)
    return out


class EvalAlreadyRead(WhaleError, RuntimeError):
    pass


class SealedSplit:
    """The held-out split: its questions come out once, for a stated purpose and a stated set of
    harnesses, and the read is recorded in `record` (a JSON file in the run directory). A
    second read is refused, except to finish the same read after a crash: the same harnesses
    and the same questions (by id; a changed split or seed would draw other ones). The record
    is written whole (tmp + rename); a record that is cut or edited is a RecordError."""

    def __init__(self, questions: Sequence[Question], record: Path) -> None:
        self._questions = list(questions)
        self.record = record

    def __len__(self) -> int:
        return len(self._questions)

    def open(self, purpose: str, harness_hashes: Sequence[str]) -> list[Question]:
        hashes = sorted(harness_hashes)
        ids = [q.id for q in self._questions]
        if self.record.exists():
            prior = read_json(self.record)
            if not isinstance(prior, dict) or not isinstance(prior.get("question_ids"), list):
                raise RecordError(f"{self.record}: not a record of an eval read")
            if prior.get("harnesses") != hashes:
                raise EvalAlreadyRead(
                    f"the eval split was already read at {prior.get('at')} for "
                    f"{prior.get('purpose')!r} (harnesses {prior.get('harnesses')}); "
                    "it is read once"
                )
            if sorted(map(str, prior["question_ids"])) != sorted(ids):
                raise EvalAlreadyRead(
                    f"the eval split was already read at {prior.get('at')} with other questions "
                    f"({len(prior['question_ids'])} recorded in {self.record}, {len(ids)} asked "
                    "now; did the split sizes, the seed or the task change?); it is read once"
                )
            prior["resumed"] = prior.get("resumed", 0) + 1
            write_atomic(self.record, json.dumps(prior, indent=2))
            return list(self._questions)
        self.record.parent.mkdir(parents=True, exist_ok=True)
        entry = {
            "purpose": purpose,
            "harnesses": hashes,
            "n": len(self._questions),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "question_ids": ids,
        }
        write_atomic(self.record, json.dumps(entry, indent=2))
        return list(self._questions)
