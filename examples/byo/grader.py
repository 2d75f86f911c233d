"""The example's grader: `py:examples/byo/grader.py:grade` in whale.toml.

whale calls `grade(question, answer, reference)` for every answer a harness returns, in a
jailed grader process by default (a timeout and a memory cap per answer), because the answer
is untrusted text: this function reads it as a string and never evaluates it. It imports the
standard library only (the jail holds this file, not the folder around it).

- A number reference (an int or a float in the JSONL) is matched by value: the whole answer,
  once an "Answer:" label, currency signs and codes, thousands separators, surrounding quotes,
  `**` and a final period are taken off, must be one number within TOLERANCE of it (a cent:
  prices and revenues are rounded to cents). "$1,234.50" and "1234.5" match 1234.5; "about
  1234", "1234.5 or 1240" and "12 orders" do not.
- A text reference (a product name, a date) is matched after case folding and the same
  trimming: "Teapot." matches "teapot", "the teapot" does not.

Returns 1.0 or 0.0.
"""

from __future__ import annotations

import math
import re

TOLERANCE = 0.01
MAX_NUMBER_CHARS = 40  # a longer "number" is not read (no 10,000-digit integers)
_LABEL = re.compile(r"^(?:final\s+)?answer\s*[:=]\s*", re.I)
_CURRENCY = re.compile(r"(?i)\b(?:usd|eur|gbp)\b|[$€£]")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def _trim(answer: str) -> str:
    text = answer.strip()
    text = _LABEL.sub("", text).strip()
    text = text.strip("*`\"' \t\n").strip()
    if text.endswith("."):  # a sentence's final period ("12." is 12 either way)
        text = text[:-1].strip()
    return text.strip("*`\"' \t\n")


def read_number(answer: str) -> float | None:
    """The one number `answer` states, or None: digits, an optional sign and decimal point,
    thousands commas; currency signs and codes around it are ignored."""
    text = _CURRENCY.sub("", _trim(answer)).strip()
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?", text):
        text = text.replace(",", "")
    if len(text) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def grade(question: str, answer: str, reference: object) -> float:
    """1.0 when `answer` states the reference (a number within TOLERANCE, or the text up to
    case), else 0.0."""
    if not isinstance(answer, str):
        return 0.0
    if isinstance(reference, bool):
        reference = str(reference)
    if isinstance(reference, int | float):
        value = read_number(answer)
        return float(value is not None and abs(value - float(reference)) <= TOLERANCE + 1e-9)
    want = " ".join(str(reference).split()).casefold()
    got = " ".join(_trim(answer).split()).casefold()
    return float(got == want)
