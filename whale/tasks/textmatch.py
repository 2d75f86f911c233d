"""Text matching for the user's graders (`normalized`, `contains`, `f1`: whale.tasks.graders)
that keeps numbers whole.

The SQuAD normalization (`answers.normalize_answer`) drops every punctuation mark, so "5"
equals "-5", "314" equals "3.14" and "12" equals "1/2": right for the QA benchmarks it was
written for, a wrong result on a user's data where answers are numbers (an optimizer would
climb through it). Here punctuation is dropped except where it is part of a number: a sign
before a digit (not after a word: "5-4" is 5 and 4), and a decimal point, thousands comma,
fraction bar or colon between digits. Where answer and reference both read as numbers
(`answers.parse_number`: "1,000", "1000", "10.00" and "10"), they are compared by value.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

from whale.tasks.answers import parse_number

_IN_NUMBER = re.compile(r"(?<![\w.])[-\u2212](?=\d)|(?<=\d)[.,/:](?=\d)")
_ARTICLES = frozenset(("a", "an", "the"))


def normalize_text(s: str) -> str:
    """NFKC, case folded, punctuation dropped except inside numbers, whitespace squeezed."""
    s = unicodedata.normalize("NFKC", s).casefold()
    keep = {m.start() for m in _IN_NUMBER.finditer(s)}
    kept = "".join(c for i, c in enumerate(s)
                   if i in keep or not unicodedata.category(c).startswith("P"))  # fmt: skip
    return " ".join(kept.replace("\u2212", "-").split())


def words(s: str) -> list[str]:
    """The normalized words of `s`, the articles a/an/the left out."""
    return [w for w in normalize_text(s).split() if w not in _ARTICLES]


def same_text(answer: str, reference: str) -> bool:
    """The `normalized` grader: equal as numbers when both are numbers, else as normalized text."""
    a, r = parse_number(answer), parse_number(reference)
    if a is not None and r is not None:
        return a == r
    return bool(normalize_text(reference)) and normalize_text(answer) == normalize_text(reference)


def contains_words(answer: str, reference: str) -> bool:
    """The `contains` grader: the reference's words occur in a row among the answer's."""
    want = words(reference)
    return bool(want) and f" {' '.join(want)} " in f" {' '.join(words(answer))} "


def word_f1(answer: str, reference: str) -> float:
    """The `f1` grader: token F1 over `words`."""
    a, r = words(answer), words(reference)
    same = sum((Counter(a) & Counter(r)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(a), same / len(r)
    return 2 * precision * recall / (precision + recall)
