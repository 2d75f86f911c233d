"""The held-out leak search: a held-out eval question of any family must never enter a
training corpus (`check_no_eval_text`, run over every training text against every held-out
prompt; `contexts` says what is split and why)."""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable, Sequence

from whale.tasks.base import fold_text

# Held-out prompts shorter than this are not looked for in a corpus ("2+2?" occurs anywhere);
# longer ones must match whole (not inside a longer word or number) wherever they occur.
MIN_LEAK_CHARS = 8


class EvalLeak(ValueError):
    """A training corpus holds the text of a held-out question."""


def check_no_eval_text(texts: Iterable[str], held_out: Sequence[str]) -> None:
    """EvalLeak if any text holds a held-out question's prompt (folded, 8+ chars, not
    inside a longer word or number: "what is 3 + 7?" is not in "what is 13 + 7?")."""
    needles = [h for h in set(held_out) if len(h) >= MIN_LEAK_CHARS]
    for n, text in enumerate(texts):
        for norm in _leak_views(text):
            for h in needles:
                at = norm.find(h)
                while at >= 0:
                    before = norm[at - 1] if at > 0 else " "
                    after = norm[at + len(h)] if at + len(h) < len(norm) else " "
                    if not (_word(before) and _word(h[0])) and not (_word(after) and _word(h[-1])):
                        raise EvalLeak(
                            f"training text {n} holds the held-out question {h[:60]!r}: no "
                            "eval-split question of any family may enter a training corpus"
                        )
                    at = norm.find(h, at + 1)


def _leak_views(text: str) -> tuple[str, ...]:
    """The folded texts a held-out question is looked for in. Escapes undone first: the report
    shows model calls with repr() or JSON ("\\n" would become the letter n and hide a prompt
    written across lines; "\\u00e9", "\\x2b" hide a letter or an operator), and HTML entities
    ("&amp;", "&#43;"). Then invisible format characters (zero-width spaces and joiners, the
    soft hyphen) as spaces, and deleted, because either can stand for nothing
    ("ques\u00adtion") or for a space ("17\u200bdivided"). The text as it is is a view too: a
    question may hold a backslash itself ("reverse 'a\\nb'")."""
    views: list[str] = []
    for plain in _decoded(text):
        bare = "".join(c for c in plain if unicodedata.category(c) != "Cf")
        views += (plain, bare)
    return tuple(dict.fromkeys(fold_text(t) for t in views))


def _decoded(text: str) -> list[str]:
    """`text`, and it with one layer of escapes and entities undone, then another, up to
    `_LEVELS`: the report shows a tool call's arguments, text that is already escaped (str()
    of a dict, a JSON string), with repr() again. Bounded: each pass over "\\x5cx5c..." undoes
    one escape and makes the next."""
    out = [text]
    for _ in range(_LEVELS):
        plain = html.unescape(_pair_surrogates(_ESCAPES.sub(_unescape, out[-1])))
        if plain == out[-1]:
            break
        out.append(plain)
    return out


_LEVELS = 3


def _unescape(m: re.Match[str]) -> str:
    if m.group(1):
        return _UNESCAPE[m.group(1)]
    code = int(m.group(2) or m.group(3) or m.group(4), 16)
    return chr(code) if code <= 0x10FFFF else m.group(0)


def _pair_surrogates(text: str) -> str:
    """JSON writes an emoji as two escapes ("\\ud83d\\ude00"): undone one by one they are two
    halves, made one character here, pair by pair (a lone half elsewhere, a string cut
    between its halves, leaves the others paired)."""
    return _PAIR.sub(_paired, text) if _HALF.search(text) else text


def _paired(m: re.Match[str]) -> str:
    hi, lo = m.group()[0], m.group()[1]
    return chr(0x10000 + ((ord(hi) - 0xD800) << 10) + (ord(lo) - 0xDC00))


_HALF = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")

_ESCAPES = re.compile(r"\\(?:([ntr'\"\\])|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")
_UNESCAPE = {"n": "\n", "t": "\t", "r": "\r", "'": "'", '"': '"', "\\": "\\"}


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"
