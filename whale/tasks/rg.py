"""Reasoning Gym families as whale tasks (`rg:FAMILY`).

Every family the installed `reasoning-gym` offers, by name, with size, seed and the family's
own config overrides. The package's scorer grades: the raw score is kept, and only a score of
1.0 counts as correct (scores are partial, e.g. 0.91 for a near miss). Families whose `answer`
is None (many valid solutions) are graded by the same scorer from the entry's metadata.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Any

from whale.tasks.base import Grade, Question, UnknownTask


def families() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class ReasoningGymTask:
    def __init__(
        self, family: str, size: int = 100, seed: int = 0, config: dict[str, Any] | None = None
    ):
        from reasoning_gym.factory import DATASETS

        if family not in DATASETS:
            raise UnknownTask(
                f"unknown Reasoning Gym family {family!r} "
                f"({len(DATASETS)} known; see `whale tasks --families`)"
            )
        self.family, self.size, self.seed = family, size, seed
        self.config = dict(config or {})
        _, config_cls = DATASETS[family]
        known = {f.name for f in dataclasses.fields(config_cls)}
        bad = sorted(set(self.config) - known - {"size", "seed"})
        if bad:
            raise UnknownTask(f"{family}: unknown config field(s) {bad}; known: {sorted(known)}")
        if family == "composite":
            self.config["datasets"] = _composite_specs(self.config.get("datasets"))
        self.name = f"rg:{family}"

    @cached_property
    def dataset(self) -> Any:
        import reasoning_gym

        return reasoning_gym.create_dataset(
            self.family, seed=self.seed, size=self.size, **self.config
        )

    @property
    def description(self) -> str:
        doc = (type(self.dataset).__doc__ or "").strip().split("\n\n")[0]
        return (
            f"Reasoning Gym family '{self.family}'. {doc} The harness receives the question text "
            "and must return the final answer as a string, in the format the question asks for."
        )

    def questions(self) -> list[Question]:
        out = []
        for i in range(len(self.dataset)):
            entry = self.dataset[i]
            out.append(
                Question(
                    id=f"rg:{self.family}:{self.seed}:{i}",
                    prompt=str(entry["question"]),
                    reference=entry,
                    metadata={"family": self.family, "index": i},
                )
            )
        return out

    def expected(self, question: Question) -> str | None:
        """The reference answer as text, for reports that may show it (feedback questions)."""
        ref = question.reference.get("answer")
        return None if ref is None else str(ref)

    def format_ok(self, question: Question, answer: str) -> bool:
        """A bare answer of the reference's shape: a number where the reference is a number,
        one line where it is one line. Prose around the answer is a format failure."""
        a = answer.strip()
        ref = question.reference.get("answer")
        if not a or ref is None:
            return bool(a)
        ref = str(ref).strip()
        if _is_number(ref):
            return _is_number(a)
        if "\n" not in ref and "\n" in a:
            return False
        return len(a) <= max(64, 4 * len(ref))

    def grade(self, question: Question, answer: str) -> Grade:
        fixed = _SCORER_FIXES.get(self.family)
        try:
            if fixed is not None:
                score = fixed(answer, question.reference)
            else:
                score = float(self.dataset.score_answer(answer, question.reference))
        except Exception as e:  # noqa: BLE001 - a scorer crash on odd input is a zero, recorded
            return Grade(0.0, False, f"scorer error: {type(e).__name__}: {e}")
        score = min(1.0, max(0.0, score))
        return Grade(score, score == 1.0)


def _composite_specs(specs: Any) -> list[Any]:
    """`composite` mixes families: config `datasets` = [{name, weight, config}, ...]."""
    from reasoning_gym.composite import DatasetSpec

    if not specs:
        raise UnknownTask("rg:composite needs config datasets=[{name, weight, config}, ...]")
    out = []
    for s in specs:
        if isinstance(s, DatasetSpec):
            out.append(s)
        elif isinstance(s, dict) and "name" in s:
            out.append(
                DatasetSpec(s["name"], float(s.get("weight", 1.0)), dict(s.get("config", {})))
            )
        else:
            raise UnknownTask(
                f"rg:composite: bad dataset spec {s!r} (want {{name, weight, config}})"
            )
    return out


def _bool_answer(answer: str, entry: dict[str, Any]) -> float:
    """reasoning-gym 0.1.25's game_of_life_halting scorer compares bool(str), so any non-empty
    answer scores 1.0 (bool("False") is True). whale compares the words instead."""
    word = answer.strip().strip(".").casefold()
    return 1.0 if word == str(entry["answer"]).strip().casefold() else 0.0


_SCORER_FIXES = {"game_of_life_halting": _bool_answer}


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
