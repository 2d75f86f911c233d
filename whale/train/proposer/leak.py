"""The held-out leak search: a held-out eval question of any family must never enter a
training corpus (`check_no_eval_text`, run over every training text against every held-out
prompt; `contexts` says what is split and why)."""

from __future__ import annotations

import functools
import html
import itertools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence

from whale.tasks.base import fold_text

# Held-out prompts shorter than this are not looked for in a corpus ("2+2?" occurs anywhere);
# longer ones must match whole (not inside a longer word or number) wherever they occur.
MIN_LEAK_CHARS = 8


class EvalLeak(ValueError):
    """A training corpus holds the text of a held-out question."""


def check_no_eval_text(texts: Iterable[str], held_out: Sequence[str]) -> None:
    """EvalLeak if any text holds a held-out question's prompt (folded, 8+ chars, not
    inside a longer word or number: "what is 3 + 7?" is not in "what is 13 + 7?").

    Looked for in the text as it is (a question may hold a backslash itself) and with escapes
    and entities undone (`_decoded`). A character that shows nothing (`_invisible`) may stand
    for nothing ("ques\u00adtion") or for a space ("17\u200bdivided"), in one text both: in a
    text that holds any, a question matches with a run of them between any two of its
    characters and in place of any of its spaces (`_pattern`), never of a visible character;
    and in the text with them deleted (where a deleted one joins a letter to its accent)."""
    needles = {h for h in map(_visible, set(held_out)) if len(h) >= MIN_LEAK_CHARS}
    flat = {h: h.replace(" ", "") for h in needles}
    patterns: dict[str, re.Pattern[str]] = {}
    for n, text in enumerate(texts):
        for view in _decoded(text):
            marked = view.translate(_invisible())
            hit = None
            if _MARK in marked:
                norm = fold_text(marked)
                squeezed = norm.replace(" ", "").replace(_MARK, "")
                hit = next((h for h in needles if flat[h] in squeezed
                            and _whole(norm, h, _pattern(h, patterns))), None)  # fmt: skip
                view = marked.replace(_MARK, "")
            if hit is None:
                norm = fold_text(view)
                hit = next((h for h in needles if _whole(norm, h)), None)
            if hit is not None:
                raise EvalLeak(
                    f"training text {n} holds the held-out question {hit[:60]!r}: no "
                    "eval-split question of any family may enter a training corpus"
                )


def _whole(norm: str, h: str, pattern: re.Pattern[str] | None = None) -> bool:
    """Whether `h` (or `pattern`, which stands for it) occurs in `norm` not inside a longer
    word or number."""
    for start, end in _spans(norm, h, pattern):
        before = norm[start - 1] if start > 0 else " "
        after = norm[end] if end < len(norm) else " "
        if not (_word(before) and _word(h[0])) and not (_word(after) and _word(h[-1])):
            return True
    return False


def _spans(norm: str, h: str, pattern: re.Pattern[str] | None) -> Iterator[tuple[int, int]]:
    """Where `h` occurs in `norm` (`pattern`'s matches, if given), overlaps included."""
    if pattern is None:
        at = norm.find(h)
        while at >= 0:
            yield at, at + len(h)
            at = norm.find(h, at + 1)
        return
    m = pattern.search(norm)
    while m:
        yield m.span()
        m = pattern.search(norm, m.start() + 1)


def _pattern(h: str, cache: dict[str, re.Pattern[str]]) -> re.Pattern[str]:
    """`h` with any run of `_MARK` between two of its characters, and a run of spaces and
    marks for each of its spaces."""
    if h not in cache:
        skip, gap = f"{_MARK}*", f"[ {_MARK}]+"
        cache[h] = re.compile(gap.join(skip.join(map(re.escape, w)) for w in h.split(" ")))
    return cache[h]


# What a character that shows nothing is made before folding: a private-use character, which
# folding keeps as it is and which is not a word character (a run of them is a boundary).
_MARK = "\ue000"
# Letters and marks that show nothing (Unicode's default-ignorable code points that are not
# format characters), but not the variation selectors: rg:emoji_mystery writes its question
# in them, so two of its questions differ only there.
_IGNORABLE = "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0"


@functools.cache
def _invisible() -> dict[int, str]:
    """str.translate's table: every character that shows nothing -> `_MARK`. Format characters
    (zero-width spaces and joiners, the soft hyphen, bidi controls, tags), control characters
    that are not whitespace, and `_IGNORABLE`."""
    table = dict.fromkeys(map(ord, _IGNORABLE), _MARK)
    for cp in itertools.chain(range(0x20000), range(0xE0000, 0xE1000)):  # where they all are
        c = chr(cp)
        cat = unicodedata.category(c)
        if cat == "Cf" or (cat == "Cc" and not c.isspace()):
            table[cp] = _MARK
    return table


def _visible(h: str) -> str:
    """Held-out prompt `h` (folded) without the characters that show nothing: folding made
    the format and control ones spaces, the others are dropped."""
    return " ".join(h.translate(dict.fromkeys(map(ord, _IGNORABLE + _MARK))).split())


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
