"""Math: GSM8K- and MATH-format JSONL files given by path (`math:PATH`), and the 270
competition problems of `champ-dataset` (`champ`). The Reasoning Gym arithmetic and algebra
families (`rg:basic_arithmetic`, `rg:simple_equations`, ...) are the generated part of the
domain. Answers match as numbers (integers, decimals, fractions, \\frac, percents, \\boxed{})
and otherwise as normalized text.
"""

from __future__ import annotations

from pathlib import Path

from whale.tasks.answers import last_boxed, numbers_match, parse_number
from whale.tasks.base import Grade, Question, TaskBase

DESCRIPTION = (
    "Math word and competition problems. Return the final answer only (a number, a "
    "fraction or a short expression), not the working."
)


class MathTask(TaskBase):
    def __init__(self, name: str, questions: list[Question], description: str = DESCRIPTION):
        self.name, self.description, self._questions = name, description, questions

    def questions(self) -> list[Question]:
        return list(self._questions)

    def expected(self, q: Question) -> str:
        return str(q.reference)

    def format_ok(self, q: Question, answer: str) -> bool:
        a = answer.strip()
        return bool(a) and "\n" not in a and len(a) <= 64

    def grade(self, q: Question, answer: str) -> Grade:
        boxed = last_boxed(answer)
        candidate = boxed if boxed is not None else answer
        ok = numbers_match(candidate, str(q.reference))
        return Grade(1.0 if ok else 0.0, ok)


def gold_of(record: dict[str, object], path: object, i: int) -> str:
    """GSM8K: 'answer' ends with '#### 42'. MATH: 'solution' with \\boxed{...}, or 'answer'."""
    ans = record.get("answer")
    if isinstance(ans, str) and "####" in ans:
        return ans.rsplit("####", 1)[1].strip()
    if isinstance(ans, str | int | float) and not isinstance(ans, bool):
        return str(ans).strip()
    sol = record.get("solution")
    if isinstance(sol, str):
        boxed = last_boxed(sol)
        if boxed is not None:
            return boxed.strip()
        raise ValueError(f"{path}: record {i}: 'solution' has no \\boxed{{}} answer")
    raise ValueError(f"{path}: record {i}: missing field 'answer' (or 'solution')")


def math_file(path: str | Path) -> MathTask:
    from whale.tasks.qa_files import DatasetError, _records

    questions = []
    for i, r in enumerate(_records(path)):
        if not isinstance(r, dict):
            raise DatasetError(f"{path}: record {i}: not an object")
        text = r.get("question", r.get("problem"))
        if not isinstance(text, str):
            raise DatasetError(f"{path}: record {i}: missing field 'question' (or 'problem')")
        questions.append(Question(f"math:{r.get('id', i)}", text, gold_of(r, path, i)))
    return MathTask(f"math:{Path(path).name}", questions)


def champ() -> MathTask:
    import champ_dataset  # type: ignore[import-not-found]

    ds = champ_dataset.load("v0")
    questions = [
        Question(f"champ:{k}", p.text, str(p.answer)) for k, p in sorted(ds.problems.items())
    ]
    return MathTask("champ", questions)


__all__ = ["MathTask", "champ", "math_file", "parse_number"]
