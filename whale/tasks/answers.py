"""Answer normalization and matching: SQuAD-style EM/F1 for QA, numbers for math.

`normalize_answer` is the standard one (HotpotQA/SQuAD evaluation scripts): lower case, drop
punctuation and the articles a/an/the, squeeze whitespace. F1 is over the normalized tokens.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from fractions import Fraction

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def contains_answer(text: str, answer: str) -> bool:
    """Whether the normalized `answer` occurs in the normalized `text` as whole words: "paris"
    is in "Paris is the capital" but not in "comparisons". An empty answer is in nothing."""
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {normalize_answer(text)} "


def em_f1(prediction: str, gold: str) -> tuple[float, float]:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    em = float(p == g)
    pt, gt = p.split(), g.split()
    # The official scripts give yes/no/noanswer no partial credit.
    if (p in ("yes", "no", "noanswer") or g in ("yes", "no", "noanswer")) and p != g:
        return em, 0.0
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return em, 0.0
    precision, recall = same / len(pt), same / len(gt)
    return em, 2 * precision * recall / (precision + recall)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (braces balanced), or None."""
    i = text.rfind("\\boxed")
    if i < 0:
        return None
    j = text.find("{", i)
    if j < 0:
        return None
    depth, k = 0, j
    while k < len(text):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1 : k]
        k += 1
    return None


MAX_NUMBER_CHARS = 200
_EXPONENT = re.compile(r"[eE]([+-]?\d{1,12})")


def parse_number(text: str) -> Fraction | None:
    """A number written as an integer, decimal, fraction, LaTeX \\frac, percent or with commas."""
    t = text.strip().strip("$").strip()
    boxed = last_boxed(t)
    if boxed is not None:
        t = boxed
    if len(t) > 10 * MAX_NUMBER_CHARS:  # before the regex below, quadratic on "\text{" x N
        return None
    t = t.replace("\\!", "").replace(",", "").replace(" ", "").rstrip(".")
    t = re.sub(r"\\(?:text|mathrm)\{[^}]*\}", "", t)
    m = re.fullmatch(r"\\d?frac\{(-?\d+)\}\{(-?\d+)\}", t.replace("\\dfrac", "\\frac"))
    if m:
        if len(t) > MAX_NUMBER_CHARS:
            return None
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    percent = t.endswith("%")
    t = t.rstrip("%")
    # Fraction("1e999999999") builds a billion-digit integer (minutes of CPU in the grader,
    # from one answer): a number longer than any real answer, or with an exponent past 400, is
    # not read as a number.
    if len(t) > MAX_NUMBER_CHARS or any(abs(int(e)) > 400 for e in _EXPONENT.findall(t)):
        return None
    try:
        if "/" in t:
            a, b = t.split("/", 1)
            value = Fraction(Fraction(a), Fraction(b))
        else:
            value = Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def numbers_match(prediction: str, gold: str) -> bool:
    p, g = parse_number(prediction), parse_number(gold)
    if p is not None and g is not None:
        return p == g
    return normalize_answer(prediction) == normalize_answer(gold)
