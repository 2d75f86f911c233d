"""Text matching for the user's graders (`normalized`, `contains`, `f1`: whale.tasks.graders)
that keeps numbers whole.

The SQuAD normalization (`answers.normalize_answer`) drops every punctuation mark, so "5"
equals "-5", "314" equals "3.14" and "12" equals "1/2": right for the QA benchmarks it was
written for, a wrong result on a user's data where answers are numbers (an optimizer would
climb through it). Here punctuation is dropped except where it is part of a number: a sign
before a digit (not after a word: "5-4" is 5 and 4; any dash before a digit is a minus), and a
decimal point, thousands comma, fraction bar or colon between digits; a mark dropped next to a
digit leaves a space ("1)2" is 1 and 2). A superscript stays apart ("2⁵" is not "25"). Where
answer and reference are each one whole number ("1,000", "1000", "10.00", "1/2", "1e3", "50%";
not "1, 2", "1 0" or "0,5"), they are compared by value (`answers.parse_number`).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

from whale.tasks.answers import parse_number

# Dashes and minus signs that mean a minus before a digit ("–5" is -5, not 5).
_MINUS = str.maketrans({c: "-" for c in "\u2010\u2011\u2012\u2013\u2212\ufe63\uff0d"})
_IN_NUMBER = re.compile(r"(?<![\w.])-(?=\d)|(?<=\d)[.,/:](?=\d)")
# A number as a whole answer (what is compared by value): a sign, digits (thousands commas only
# in groups of three), a decimal part, a fraction bar, an exponent, a percent. "1, 2", "1 0" and
# "0,5" are not one number.
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?:e[-+]?\d+)?%?")
_ARTICLES = frozenset(("a", "an", "the"))
MAX_CHARS = 100_000  # past this an answer is compared as text only, never parsed as a number


def _plain(s: str) -> str:
    """NFKC and case folded, with a superscript, subscript or vulgar fraction set apart as its
    own token first (NFKC would write "2⁵" as "25"), and dashes before a digit as "-"."""
    s = "".join(f" {c} " if unicodedata.category(c) == "No" else c for c in s)
    return unicodedata.normalize("NFKC", s).casefold().translate(_MINUS)


def normalize_text(s: str) -> str:
    """Punctuation dropped except inside numbers, whitespace squeezed (module docstring). A
    dropped mark next to a digit becomes a space, so "5-4" is 5 and 4, never 54."""
    s = _plain(s)
    keep = {m.start() for m in _IN_NUMBER.finditer(s)}
    out = []
    for i, c in enumerate(s):
        if i in keep or not unicodedata.category(c).startswith("P"):
            out.append(c)
        elif (i and s[i - 1].isdigit()) or (i + 1 < len(s) and s[i + 1].isdigit()):
            out.append(" ")
    return " ".join("".join(out).split())


def words(s: str) -> list[str]:
    """The normalized words of `s`, the articles a/an/the left out."""
    return [w for w in normalize_text(s).split() if w not in _ARTICLES]


def _number(s: str) -> object:
    t = _plain(s).strip()
    if len(t) > MAX_CHARS or not _NUMBER.fullmatch(t.rstrip(".")):
        return None
    return parse_number(t)


def same_text(answer: str, reference: str) -> bool:
    """The `normalized` grader: equal by value when both are whole numbers, else as text."""
    a, r = _number(answer), _number(reference)
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
