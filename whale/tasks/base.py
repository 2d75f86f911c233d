"""Task, Question, Grade and the split helper.

A task is a description, a pool of questions and a grader. The grader and the references stay
in the parent process: a harness only ever receives `Question.prompt`.
"""

from __future__ import annotations

import json
import random
import re
import time
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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


class Task(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    def questions(self) -> list[Question]: ...

    def grade(self, question: Question, answer: str) -> Grade: ...


class UnknownTask(ValueError):
    pass


class SplitOverlap(ValueError):
    pass


def normalize_prompt(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", text)).strip()


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


class EvalAlreadyRead(RuntimeError):
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
