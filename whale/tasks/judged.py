"""SearchQA-style judged QA: the WHALE rubric as a deterministic rule grader, plus an optional
rubric LLM judge. The judge, its prompt and the reference answers are fixed for a whole run,
whatever changes in the model or the harness.

Accepted: aliases and abbreviations, punctuation differences, the reference contained in a
date or a place, unit variations. Rejected: multiple candidates, a contradictory entity,
passage dumping, no commitment. `Grade.feedback` names the rule that decided.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from whale.retrieval import Passage
from whale.tasks.answers import contains_answer, normalize_answer
from whale.tasks.base import Grade, Question
from whale.tasks.mhqa import MultiHopTask

_NO_COMMIT = re.compile(
    r"\b(i don'?t know|do not know|not sure|cannot be determined|can'?t be determined|unknown|"
    r"no answer|unable to|not enough information|insufficient information)\b",
    re.I,
)
_NEGATION = re.compile(r"\b(not|isn'?t|wasn'?t|never|no)\b", re.I)
_SPLIT = re.compile(r"\s+(?:or|and|/|vs\.?)\s+|\s*[;/]\s*", re.I)
_MONTHS = {
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
}
_UNITS = {
    "km": "kilometer",
    "kms": "kilometer",
    "kilometers": "kilometer",
    "kilometres": "kilometer",
    "kilometre": "kilometer",
    "m": "meter",
    "meters": "meter",
    "metres": "meter",
    "metre": "meter",
    "mi": "mile",
    "miles": "mile",
    "ft": "foot",
    "feet": "foot",
    "in": "inch",
    "inches": "inch",
    "kg": "kilogram",
    "kgs": "kilogram",
    "kilograms": "kilogram",
    "lb": "pound",
    "lbs": "pound",
    "pounds": "pound",
    "g": "gram",
    "grams": "gram",
    "cm": "centimeter",
    "centimeters": "centimeter",
    "mm": "millimeter",
    "millimeters": "millimeter",
    "yrs": "year",
    "years": "year",
    "yr": "year",
    "mph": "mile per hour",
    "°f": "fahrenheit",
    "f": "fahrenheit",
    "°c": "celsius",
    "c": "celsius",
    "degrees": "degree",
    "%": "percent",
}
DUMP_WORDS = 25


def _initials(text: str) -> str:
    words = [
        w for w in re.findall(r"[A-Za-z]+", text) if w.lower() not in ("of", "the", "and", "for")
    ]
    return "".join(w[0] for w in words).lower()


def _quantity(text: str) -> tuple[float, str] | None:
    m = re.fullmatch(r"\s*(-?[\d,]*\.?\d+)\s*([a-zA-Z°%][a-zA-Z°% ]*)?\s*\.?\s*", text)
    if not m:
        return None
    unit = (m.group(2) or "").strip().lower()
    unit = " ".join(_UNITS.get(u, u.rstrip("s") if len(u) > 3 else u) for u in unit.split())
    return float(m.group(1).replace(",", "")), unit


def rubric_grade(answer: str, reference: str, aliases: list[str] | tuple[str, ...] = ()) -> Grade:
    """Exact match and aliases decide first: a title such as "No Country for Old Men", "Never
    Let Me Go" or "The Unknown Soldier" is the answer, not a negation or a refusal. The reject
    rules then look only at what the answer says besides the reference (its spans removed), so
    "not Paris" is still a contradictory entity and "Paris, I think, or not" is not accepted."""
    golds = [reference, *aliases]
    a = answer.strip()
    na, ngolds = normalize_answer(a), [normalize_answer(g) for g in golds]
    if not na:
        return Grade(0.0, False, "reject: no commitment")
    if na == ngolds[0]:
        return Grade(1.0, True, "accept: exact")
    if na in ngolds[1:]:
        return Grade(1.0, True, "accept: alias")
    rest = f" {na} "
    for g in sorted((g for g in ngolds if g), key=len, reverse=True):
        rest = rest.replace(f" {g} ", "  ")
    if _NO_COMMIT.search(rest):
        return Grade(0.0, False, "reject: no commitment")
    if len(a.split()) > DUMP_WORDS or len(re.findall(r"[.!?](\s|$)", a)) > 2:
        return Grade(0.0, False, "reject: passage dumping")
    parts = [p for p in _SPLIT.split(a) if p.strip()]
    if len(parts) > 1 and any(normalize_answer(p) in ngolds for p in parts):
        return Grade(0.0, False, "reject: multiple candidates")
    if rest != f" {na} " and _NEGATION.search(rest):
        return Grade(0.0, False, "reject: contradictory entity")
    for g in golds:
        short, long_ = sorted((a, g), key=len)
        if len(short.replace(".", "")) >= 2 and short.replace(".", "").isupper():
            if short.replace(".", "").lower() == _initials(long_):
                return Grade(1.0, True, "accept: abbreviation")
    qa = _quantity(a)
    for g in golds:
        qg = _quantity(g)
        if qa and qg and qa[0] == qg[0] and (qa[1] == qg[1] or not qa[1] or not qg[1]):
            return Grade(1.0, True, "accept: unit variation")
    for g in ngolds:
        if g and re.search(rf"(^|\s){re.escape(g)}(\s|$)", na) and len(na.split()) <= 8:
            extra = [w for w in na.split() if w not in g.split()]
            datey = all(w.isdigit() or w in _MONTHS or w in ("st", "nd", "rd", "th") for w in extra)
            placey = "," in a and len(extra) <= 4
            if datey or placey:
                return Grade(1.0, True, "accept: contained in a date or place")
            return Grade(0.0, False, "reject: contradictory entity")
    return Grade(0.0, False, "reject: different answer")


JUDGE_PROMPT = """You grade an answer to a question against a reference answer.
CORRECT if it means the same answer: aliases, abbreviations, punctuation differences, the
reference contained in a date or place, or unit variations are fine.
INCORRECT if it gives multiple candidates, names a contradictory entity, dumps passages
instead of answering, or does not commit to an answer.
Question: {question}
Reference answer: {reference}
Answer to grade: {answer}
Reply with one word: CORRECT or INCORRECT."""


class RubricJudge:
    """The rubric as an LLM judge. `ask(prompt) -> reply` is any model call; the caller fixes it
    for the whole run (whale's CLI uses temperature 0, seed 0 and the response cache). Falls
    back to the rule grader, and says so in the feedback, if the reply is neither word or the
    call fails. (Tasks import no model code: the judge arrives as a plain callable.)"""

    def __init__(self, ask: Callable[[str], str]) -> None:
        self.ask = ask

    def grade(self, question: str, answer: str, reference: str, aliases: list[str]) -> Grade:
        prompt = JUDGE_PROMPT.format(question=question, reference=reference, answer=answer)
        try:
            reply = self.ask(prompt)
        except Exception as e:  # noqa: BLE001 - a failed judge call falls back, recorded
            g = rubric_grade(answer, reference, aliases)
            return Grade(g.score, g.correct, f"{g.feedback} (judge failed: {e})")
        word = reply.strip().upper()
        if word.startswith("INCORRECT"):
            return Grade(0.0, False, "judge: INCORRECT")
        if word.startswith("CORRECT"):
            return Grade(1.0, True, "judge: CORRECT")
        g = rubric_grade(answer, reference, aliases)
        return Grade(g.score, g.correct, f"{g.feedback} (judge said {reply[:20]!r})")


class JudgedQATask(MultiHopTask):
    def __init__(self, *args: Any, judge: RubricJudge | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.judge = judge

    def grade(self, q: Question, answer: str) -> Grade:
        ref, aliases = q.reference["answer"], list(q.reference.get("aliases", []))
        if self.judge is not None:
            return self.judge.grade(q.prompt, answer, ref, aliases)
        return rubric_grade(answer, ref, aliases)


def searchqa(path: str | Path, judge: RubricJudge | None = None) -> JudgedQATask:
    """SearchQA-style JSON or JSONL: records {id?, question, answer, aliases?, search_results:
    [{title?, snippet}]}. The corpus is every snippet; a question's gold passages are its own
    snippets that contain the answer as whole words (the answer-bearing ones; normalized as
    `normalize_answer`, aliases not counted)."""
    from whale.tasks.qa_files import DatasetError, _field, _records

    passages: list[Passage] = []
    questions = []
    for i, r in enumerate(_records(path)):
        question = _field(path, i, r, "question", str)
        answer = _field(path, i, r, "answer", str)
        qid = str(r.get("id", i))
        gold = []
        for j, sr in enumerate(r.get("search_results") or []):
            if not isinstance(sr, dict) or not isinstance(sr.get("snippet"), str):
                raise DatasetError(
                    f"{path}: record {i}: search_results[{j}] has no string 'snippet'"
                )
            pid = f"q{qid}-s{j}"
            passages.append(Passage(pid, str(sr.get("title") or ""), sr["snippet"]))
            # Whole words: a substring test counted "comparisons" as bearing "Paris".
            if contains_answer(sr["snippet"], answer):
                gold.append(pid)
        aliases = [a for a in r.get("aliases", []) if isinstance(a, str)]
        # Retrieval counts as a hit when any answer-bearing snippet was retrieved.
        ref = {
            "answer": answer,
            "aliases": aliases,
            "supporting": gold,
            "hops": 1,
            "retrieval": "any",
        }
        questions.append(Question(f"searchqa:{qid}", question, ref))
    desc = (
        "Open-domain questions (Jeopardy! style). Search with env.tools.retrieve(query, k) "
        "and commit to one short answer."
    )
    return JudgedQATask("searchqa", desc, questions, passages, judge=judge)
