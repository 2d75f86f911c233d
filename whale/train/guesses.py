"""The weight phase's guards against training on lucky guesses, which collapse the solver onto
a constant answer (issue 26). All three are off by default: the paper's S+ is every accepted
run.

Rejection-sampling SFT trains on every run the verifier accepts, and a binary verifier cannot
tell a solved question from a lucky guess. Measured on `rg:letter_counting` (docs/commands/
cotrain.md): the 0.5B answered "1" or "2" to every question, the verifier accepted the samples
where that was right (28%), and after one step on those the solver answered "2" to all 40 eval
questions. A guess is an answer the solver gives whatever the question; each guard reads that
from the step's own samples (answers compared by `answer_key`: stripped, inner whitespace
and case folded):

- `guesses` (`rsft.guess_precision`): an answer given on two or more prompts of the step and
  accepted in at most `precision` of its samples is a guess; its accepted runs leave S+.
- `one_answer_per_prompts` (`rsft.answer_prompts`): an answer's accepted runs are kept from at
  most k prompts of the step.
- `chance` (`rsft.chance_guard`): the step trains only when its accept rate beats its chance
  rate (each sample's answer graded against every prompt of the step) by more than one SE.

Measured (experiments/whale/guess-guard.sh, the table in docs/commands/cotrain.md): two short
examples of one answer were enough to make the 0.5B a constant answerer, so the first two,
which thin S+ out, did not prevent the collapse; the chance test did, by training on nothing
while the solver's answers did not depend on the question. What they do not catch: a solver
right by chance on more than one SE of a small step's samples (chance), a constant answer given
on one prompt only (guesses). What they cost: the grades of (distinct answers x prompts) per
step (chance); on a task whose answers are few, runs of a solver no better than the threshold
are dropped even where it reasoned.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def answer_key(answer: str | None) -> str | None:
    """The text two answers are compared by: stripped, inner whitespace folded, casefolded.
    None for no answer, and for one that is not text (a ledger row read back)."""
    if not isinstance(answer, str):
        return None
    key = " ".join(answer.split()).casefold()
    return key or None


def prompt_of(question_id: str) -> str:
    """The prompt a weight-step sample ran (`Rsft._sample_id`: "<question id>@w<k>.<g>")."""
    return question_id.rsplit("@w", 1)[0]


@dataclass
class AnswerCount:
    prompts: int  # distinct prompts whose samples gave the answer
    samples: int
    accepted: int

    def text(self) -> str:
        return f"accepted in {self.accepted} of {self.samples} samples on {self.prompts} prompts"


def guesses(outcomes: Sequence[Any], precision: float) -> dict[str, AnswerCount]:
    """The answers of `outcomes` (a step's samples: `question_id`, `answer`, `correct`) that are
    guesses at `precision` (module docstring), each with its counts; {} when `precision` is 0."""
    if precision <= 0:
        return {}
    prompts: dict[str, set[str]] = {}
    samples: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for o in outcomes:
        key = answer_key(o.answer)
        if key is None:
            continue
        prompts.setdefault(key, set()).add(prompt_of(o.question_id))
        samples[key] = samples.get(key, 0) + 1
        accepted[key] = accepted.get(key, 0) + bool(o.correct)
    out = {}
    for key, where in prompts.items():
        count = AnswerCount(len(where), samples[key], accepted[key])
        if count.prompts >= 2 and count.accepted and count.accepted <= precision * count.samples:
            out[key] = count
    return out


def one_answer_per_prompts(accepted: Sequence[tuple[Any, Any]], k: int,
                           salt: str) -> tuple[list[Any], dict[str, int]]:  # fmt: skip
    """The trajectories of `accepted` ((outcome, trajectory) pairs of a step) with each answer
    taught on at most `k` prompts: for an answer accepted on more, the prompts kept are the
    first `k` in an order seeded by `salt` and the answer (all the kept prompts' accepted
    samples stay). Returns (kept trajectories, answer -> accepted runs left out). `k` = 0:
    everything kept. Why: S+ whose examples repeat one answer across prompts teaches that
    answer whatever the question (the collapse: module docstring); an answer tied to one
    question is what a solution looks like."""
    if k <= 0:
        return [t for _, t in accepted], {}
    prompts: dict[str | None, list[str]] = {}
    for o, _ in accepted:
        where = prompts.setdefault(answer_key(o.answer), [])
        if prompt_of(o.question_id) not in where:
            where.append(prompt_of(o.question_id))
    allowed: dict[str | None, set[str]] = {}
    for key, where in prompts.items():
        if key is None or len(where) <= k:
            allowed[key] = set(where)
        else:
            order = sorted(where)
            random.Random(f"{salt}:{key}").shuffle(order)
            allowed[key] = set(order[:k])
    kept, dropped = [], Counter[str]()
    for o, t in accepted:
        key = answer_key(o.answer)
        if prompt_of(o.question_id) in allowed[key]:
            kept.append(t)
        else:
            dropped[str(key)] += 1
    return kept, dict(dropped)


@dataclass
class Chance:
    """A step's accept rate against the rate its answers would get on random questions of
    the step (`chance`)."""

    rate: float  # accepted / samples
    chance: float  # mean over samples of the share of the step's prompts its answer passes
    se: float  # sqrt(chance (1 - chance) / samples)
    samples: int
    grades: int  # answers graded against other prompts to get `chance`

    @property
    def above(self) -> bool:
        """More often accepted than chance by more than one standard error."""
        return self.rate - self.chance > self.se

    def text(self) -> str:
        return (
            f"accepted {self.rate:.3f} of {self.samples} samples against {self.chance:.3f} "
            f"for the same answers on random questions of the step (SE {self.se:.3f})"
        )


def chance(outcomes: Sequence[Any], questions: Sequence[Any],
           grade: Callable[[Any, str], bool]) -> Chance:  # fmt: skip
    """The step's accept rate and its chance rate: each sample's answer graded (`grade(question,
    answer)`, the task's verifier) against every prompt of the step (`questions`, by id), its
    mean taken; no answer passes none. One grade per distinct answer text and prompt. A solver
    whose answers do not depend on the question (it guesses) has a rate near its chance rate;
    one that solves them, a rate far above it (a distinct answer per question: chance ~ rate /
    prompts). What the rule cannot see: a solver right by chance on more than one SE of the
    step's samples (small steps: one SE of 32 samples at chance 0.3 is 0.08)."""
    by_id = {q.id: q for q in questions}
    memo: dict[str, float] = {}
    grades = 0
    accepted = passed = 0.0
    for o in outcomes:
        accepted += bool(o.correct)
        if not isinstance(o.answer, str) or answer_key(o.answer) is None:
            continue
        if o.answer not in memo:
            hits = [grade(q, o.answer) for q in by_id.values()]
            grades += len(hits)
            memo[o.answer] = sum(hits) / max(1, len(hits))
        passed += memo[o.answer]
    n = len(outcomes)
    rate, ch = accepted / max(1, n), passed / max(1, n)
    return Chance(rate, ch, math.sqrt(ch * (1 - ch) / max(1, n)), n, grades)
