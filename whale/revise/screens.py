"""Select's answer-echo screen: a candidate that hard-codes the dev questions is not a harness.

With the default shared dev pool the report shows the expected answers of the very questions
that score candidates, so a proposer can climb by writing `{"What is 3 + 7?": "10"}` or
`if "3 + 7" in q: return "10"`. Before a candidate is scored, `AnswerEchoScreen.check` reads
its constants (the `ast.Constant` values of its syntax tree: strings, ints, floats, with `-n`
folded, and bytes decoded to text, including `bytes([...])` / `bytearray(...)` / `fromhex` of
constants; never substrings of the code) and looks for evidence about each dev question q:

- answer (A): a constant equal to q's reference answer (or an alias): numerically for numbers
  (int 10, "10", "10.0"), after `normalize_answer` for text; an answer of 12+ normalized chars
  also counts when it occurs as whole words inside a longer string constant.
- fragment (F): a string constant of 3+ chars, with a letter or digit, that is a substring of
  q's prompt and of at most `FRAGMENT_MAX_PROMPTS` dev prompts (template text is shared by
  many prompts and does not count).
- question literal (Q): a string constant holding q's whole prompt (10+ chars, a prompt that is
  no substring of another dev prompt), or a common substring of `LITERAL_CHARS`+ chars of q's
  prompt that spans at least `LITERAL_TOKENS` words found in no other dev prompt (so that
  copied template text, or a few-shot example on the same template with other names, does not).

A candidate is invalid, reason "answer echo", when it has evidence the seed harness did not have
(the loops compare with the seed, never the parent, so that a chain of candidates each adding
a little cannot launder an echo) for
(1) any question with both A and F (a keyed lookup), (2) any question with Q, or (3) at least
`DISTINCT_ANSWERS` questions with A on a *distinctive* answer: a number of magnitude 10 or more
that is not a round knob (a multiple of 5, a power of two, 12/24/36/60/365), a non-integer
with 4+ significant digits, or text of 4+ normalized chars that is not a common word. Short
answers (single digits, yes/no, True/False) therefore never count alone.

Measured (benchmarks/screen_false_positives.py): no false positive on the three seeds against
the 25 dev questions of rg:basic_arithmetic, rg:maze and mhqa, nor on 21 hand-written
legitimate edits of them; it catches lookup tables, `in`-tests and copied dev questions.
Not covered: answers computed or encoded at run time (`"1" + "0"`, base64, arithmetic on
constants), answers read from files or the network, echoes split across constants, and answers
of questions outside the dev pool. It is a screen against a careless or greedy proposer, not a
proof against an adversary; the sealed eval split is the final check.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from whale.harness.bundle import syntax_tree
from whale.tasks import Question, Task
from whale.tasks.answers import normalize_answer, parse_number

LITERAL_CHARS = 40
LITERAL_TOKENS = 2
WHOLE_PROMPT_CHARS = 10
FRAGMENT_CHARS = 3
FRAGMENT_MAX_PROMPTS = 2
DISTINCT_ANSWERS = 3
LONG_ANSWER_CHARS = 12
_KNOB_NUMBERS = {12, 24, 36, 60, 365}
_COMMON_WORDS = set(
    """yes no true false none null nan unknown left right up down north south east west
    answer final result output error correct incorrect valid invalid empty
    one two three four five six seven eight nine ten zero first second third last next
    the and for with from that this there here what which who when where why how
    text code python number numbers list string value values step steps total sum
    question questions reply message messages system user assistant content role
    stop length model prompt solve solution example examples""".split()
)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class _Dev:
    qid: str
    prompt: str
    answers: tuple[str, ...]  # the reference answer and its aliases, as text
    numbers: frozenset[Fraction]  # the answers that read as numbers
    texts: frozenset[str]  # the normalized answers that are not numbers
    distinctive: bool


def _answers_of(task: Task, q: Question) -> list[str]:
    out: list[str] = []
    e = task.expected(q)
    if e is not None:
        out.append(str(e))
    ref = q.reference
    if isinstance(ref, dict):
        if not out and ref.get("answer") is not None:
            out.append(str(ref["answer"]))
        out += [str(a) for a in ref.get("aliases", []) if isinstance(a, str)]
    elif not out and isinstance(ref, str | int | float) and not isinstance(ref, bool):
        out.append(str(ref))
    return [a for a in dict.fromkeys(x.strip() for x in out) if a]


def _number(text: str) -> Fraction | None:
    try:
        return parse_number(text) if len(text) < 64 else None
    except (ValueError, ArithmeticError):
        return None


def _distinctive_number(v: Fraction) -> bool:
    if v.denominator == 1:
        n = abs(v.numerator)
        return n >= 10 and n % 5 != 0 and n & (n - 1) != 0 and n not in _KNOB_NUMBERS
    digits = re.sub(r"[^0-9]", "", f"{float(v):.12g}").strip("0")
    return len(digits) >= 4


def _distinctive_text(t: str) -> bool:
    return len(t) >= 4 and t not in _COMMON_WORDS


def _constants(source: str) -> tuple[set[str], set[Fraction], set[str]]:
    """(string constants, numeric constants, normalized string constants) of `source`'s AST;
    empty sets for a source that does not parse (Apply has refused it already). Bytes count
    as the text they decode to (`b'-4'`, `bytes([45, 52])`, `bytearray(b'-4')`,
    `bytes.fromhex('2d34')`: a table keyed by `question.encode()` is a table of strings), and
    so does every item of a folded tuple or frozenset constant."""
    try:
        tree = syntax_tree(source)  # a bundle's files as one module
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set(), set(), set()
    strings: set[str] = set()
    numbers: set[Fraction] = set()
    negated: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
        ):
            v = node.operand.value
            if isinstance(v, int | float) and not isinstance(v, bool):
                numbers.add(-_fraction(v))
                negated.add(id(node.operand))
        if isinstance(node, ast.Call) and (data := _bytes_call(node)) is not None:
            strings.update(_decoded(data))
        if isinstance(node, ast.Constant) and id(node) not in negated:
            _collect(node.value, strings, numbers)
    for s in strings:
        n = _number(s.strip())
        if n is not None:
            numbers.add(n)
    return strings, numbers, {normalize_answer(s) for s in strings if len(s) < 1000}


def _collect(value: object, strings: set[str], numbers: set[Fraction], depth: int = 0) -> None:
    """One constant's text and numbers: str, bytes (decoded), int and float, and the items
    of a tuple or frozenset constant (the compiler folds those; `ast.parse` may not)."""
    if isinstance(value, str):
        strings.add(value)
    elif isinstance(value, bytes | bytearray):
        strings.update(_decoded(bytes(value)))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        numbers.add(_fraction(value))
    elif isinstance(value, tuple | frozenset) and depth < 20:
        for item in value:
            _collect(item, strings, numbers, depth + 1)


# The encodings tried on a bytes constant besides Latin-1 (which decodes any bytes).
_ENCODINGS = ("utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be")


def _decoded(data: bytes) -> set[str]:
    """The texts bytes may stand for: Latin-1 (every byte one character) and each of the
    UTF encodings where they decode, so that the encoding a table was written in does not
    hide an answer. Not covered (the screen reads constants, not what code computes from
    them): reversed, XOR-ed or hashed texts, and any encoding not listed."""
    out = {data.decode("latin-1")}
    for enc in _ENCODINGS:
        try:
            out.add(data.decode(enc))
        except UnicodeDecodeError:
            pass
    return out


_BYTES_TYPES = ("bytes", "bytearray")


def _bytes_call(node: ast.Call) -> bytes | None:
    """The bytes a call of constants builds: `bytes([45, 52])`, `bytearray((45, 52))` (a
    list or tuple of ints 0-255), `bytes.fromhex("2d34")`; None for anything else.
    (`bytearray(b"-4")` needs nothing: its bytes constant is read where it stands.)"""
    if len(node.args) != 1 or node.keywords:
        return None
    arg, f = node.args[0], node.func
    if isinstance(f, ast.Name) and f.id in _BYTES_TYPES:
        if isinstance(arg, ast.List | ast.Tuple) and len(arg.elts) <= 100_000:
            items = [e.value for e in arg.elts if isinstance(e, ast.Constant)]
            ints = [v for v in items if type(v) is int and 0 <= v < 256]
            if len(ints) == len(arg.elts):
                return bytes(ints)
        return None
    if (
        isinstance(f, ast.Attribute)
        and f.attr == "fromhex"
        and isinstance(f.value, ast.Name)
        and f.value.id in _BYTES_TYPES
        and isinstance(arg, ast.Constant)
        and isinstance(arg.value, str)
    ):
        try:
            return bytes.fromhex(arg.value)
        except ValueError:
            return None
    return None


def _fraction(v: int | float) -> Fraction:
    try:
        return Fraction(v)
    except (ValueError, OverflowError):  # nan, inf: match nothing
        return Fraction(-(10**30) - 7)


class AnswerEchoScreen:
    """The screen over a fixed set of dev questions (the scoring set and the feedback pool the
    proposer saw). Building it reads every prompt once; `check` costs one parse of each source
    plus a scan of the string constants."""

    def __init__(self, task: Task, questions: Iterable[Question], baseline: str = "") -> None:
        self.baseline = baseline
        seen: dict[str, Question] = {}
        for q in questions:
            seen.setdefault(q.id, q)
        self.devs: list[_Dev] = []
        for q in seen.values():
            answers = _answers_of(task, q)
            nums = {n for a in answers if (n := _number(a)) is not None}
            texts = {normalize_answer(a) for a in answers if _number(a) is None}
            texts.discard("")
            dist = any(_distinctive_number(n) for n in nums) or any(
                _distinctive_text(t) for t in texts
            )
            self.devs.append(_Dev(q.id, q.prompt, tuple(answers), frozenset(nums),
                                  frozenset(texts), dist))  # fmt: skip
        prompts = [d.prompt for d in self.devs]
        df: dict[str, int] = {}
        for p in prompts:
            for w in set(_WORD.findall(p)):
                df[w] = df.get(w, 0) + 1
        # Words that single out one prompt; window index of every prompt for long literals.
        self._own = [{w for w in set(_WORD.findall(p)) if df[w] == 1} for p in prompts]
        self._windows: dict[str, list[int]] = {}
        for k, p in enumerate(prompts):
            for j in range(0, max(0, len(p) - LITERAL_CHARS + 1)):
                self._windows.setdefault(p[j : j + LITERAL_CHARS], []).append(k)
        self._whole = [
            len(p.strip()) >= WHOLE_PROMPT_CHARS
            and not any(p.strip() in o for i, o in enumerate(prompts) if i != k)
            for k, p in enumerate(prompts)
        ]

    def evidence(self, source: str) -> dict[str, set[str]]:
        """question id -> the kinds of evidence ("answer", "fragment", "question") in source.
        One pass over the constants: cost grows with (dev questions x constants), not with
        their square."""
        strings, numbers, norm = _constants(source)
        kinds: dict[int, set[str]] = {}
        padded = [f" {normalize_answer(s)} " for s in strings if len(s) >= LONG_ANSWER_CHARS]
        for k, d in enumerate(self.devs):
            if d.numbers & numbers or d.texts & norm:
                kinds.setdefault(k, set()).add("answer")
            elif any(len(t) >= LONG_ANSWER_CHARS and any(f" {t} " in s for s in padded)
                     for t in d.texts):  # fmt: skip
                kinds.setdefault(k, set()).add("answer")
        for k in self._fragments(strings):
            kinds.setdefault(k, set()).add("fragment")
        for k in self._literals(strings):
            kinds.setdefault(k, set()).add("question")
        return {self.devs[k].qid: v for k, v in kinds.items()}

    def _fragments(self, strings: set[str]) -> set[int]:
        """Dev questions whose prompt holds a string constant that few dev prompts hold."""
        out: set[int] = set()
        for s in strings:
            t = s.strip()
            if len(t) < FRAGMENT_CHARS or not _WORD.search(t):
                continue
            ks = [k for k, d in enumerate(self.devs) if t in d.prompt]
            if 0 < len(ks) <= FRAGMENT_MAX_PROMPTS:
                out.update(ks)
        return out

    def _literals(self, strings: set[str]) -> set[int]:
        """Dev questions whose prompt a string constant copies (see the module docstring)."""
        out: set[int] = set()
        for k, d in enumerate(self.devs):
            p = d.prompt.strip()
            if self._whole[k] and any(p in s for s in strings if len(s) >= len(p)):
                out.add(k)
        for s in strings:
            covered: dict[int, int] = {}  # k -> first position not inside a run already judged
            for i in range(len(s) - LITERAL_CHARS + 1):
                window = s[i : i + LITERAL_CHARS]
                for k in set(self._windows.get(window, ())) - out:
                    if i < covered.get(k, 0):
                        continue
                    p, longest = self.devs[k].prompt, 0
                    for j in _all_at(p, window):  # the longest common run from here
                        n = LITERAL_CHARS
                        while i + n < len(s) and j + n < len(p) and s[i + n] == p[j + n]:
                            n += 1
                        if len(set(_WORD.findall(p[j : j + n])) & self._own[k]) >= LITERAL_TOKENS:
                            out.add(k)
                            break
                        longest = max(longest, n)
                    covered[k] = i + longest - LITERAL_CHARS + 1
        return out

    def check(self, candidate: str, parent: str | None = None) -> str | None:
        """The reason `candidate` is an answer echo (naming the question ids), or None. What
        counts is what it holds that `parent` does not; `parent` defaults to the screen's
        `baseline` (the loops pass the seed, so that echoes cannot be laundered through a
        chain of candidates that each add a little)."""
        if parent is None:
            parent = self.baseline
        new, old = self.evidence(candidate), self.evidence(parent)
        keyed = sorted(q for q, k in new.items() if {"answer", "fragment"} <= k
                       and not {"answer", "fragment"} <= old.get(q, set()))  # fmt: skip
        literal = sorted(q for q, k in new.items()
                         if "question" in k and "question" not in old.get(q, set()))  # fmt: skip
        by_id = {d.qid: d for d in self.devs}
        answers = sorted(
            q
            for q, k in new.items()
            if "answer" in k and by_id[q].distinctive and "answer" not in old.get(q, set())
        )
        parts = []
        if keyed:
            parts.append(f"the answer together with question text of {_ids(keyed)}")
        if literal:
            parts.append(f"question text of {_ids(literal)}")
        if len(answers) >= DISTINCT_ANSWERS:
            parts.append(f"the reference answers of {len(answers)} questions: {_ids(answers)}")
        if not parts:
            return None
        return "answer echo: the candidate hard-codes what the seed did not: " + "; ".join(parts)


def _all_at(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i >= 0:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def _ids(ids: Sequence[str], shown: int = 6) -> str:
    more = f" (+{len(ids) - shown} more)" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


def screen_questions(*pools: Sequence[Question]) -> list[Question]:
    """The dev questions a screen guards: every pool the proposer or Select saw, once each."""
    seen: dict[str, Question] = {}
    for pool in pools:
        for q in pool:
            seen.setdefault(q.id, q)
    return list(seen.values())
