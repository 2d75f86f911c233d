"""Reasoning Gym families as whale tasks (`rg:FAMILY`).

Every family the installed `reasoning-gym` offers, by name, with size, seed and the family's
own config overrides. The package's scorer grades: the raw score is kept, and only a score of
1.0 counts as correct (scores are partial, e.g. 0.91 for a near miss). Families whose `answer`
is None (many valid solutions) are graded by the same scorer from the entry's metadata.

Where a scorer may run. Some of reasoning-gym 0.1.25's scorers evaluate the answer as code:
sympy's `parse_expr` (which calls `eval`) or Python's `eval` itself. A harness answer of
`exec("...") or <reference>` would then run in the grading process. So every family is in
exactly one of two audited sets (tests/test_grading.py fails for a family in neither):

- `IN_PROCESS`: scorers read by hand and by a call-graph grep (no eval/exec/sympy/pickle in
  anything reachable from `score_answer`): string, `json`, `float`/`int`/`Decimal` and
  numpy-comparison handling whose cost is at most about quadratic in the answer's length.
  `grade()` runs them here, for answers up to `IN_PROCESS_MAX_CHARS` characters (longer ones
  go to the jail too, which bounds the quadratic ones).
- `JAILED` (family -> why): graded only out of process by `whale.grading` (a jailed process
  with a timeout; only a float comes back). `grade()` refuses them (raises `GradeInJail`), so
  no path runs such a scorer in the evaluator. Answers of the families in `SCREENS` must first
  pass a pure string screen (`passes_screen`, no eval) or score 0 without being sent.

Not covered: a future reasoning-gym whose scorer changes under the same family name (the
version is pinned, and the audit test greps the installed scorers).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from functools import cached_property
from typing import Any

import whale.tasks.rg_entries as rg_entries
from whale.tasks.base import Grade, Question, TaskBase, UnknownTask
from whale.tasks.expr_bounds import bounded_powers

# Longest answer an audited scorer grades in this process; longer ones are graded in the jail
# (with its timeout), so a quadratic scorer cannot stall the evaluator on a huge answer.
IN_PROCESS_MAX_CHARS = 8192

# Audited for reasoning-gym 0.1.25 (see the module docstring).
IN_PROCESS = frozenset(
    """ab acre advanced_geometry aiw arc_1d arc_agi base_conversion basic_arithmetic bf
    binary_alternation caesar_cipher calendar_arithmetic chain_sum circuit_logic
    color_cube_rotation complex_arithmetic count_bits count_primes course_schedule cryptarithm
    decimal_arithmetic decimal_chain_sum dice emoji_mystery family_relationships figlet_font
    fraction_simplification futoshiki game_of_life game_of_life_halting gcd graph_color
    group_anagrams gsm_symbolic isomorphic_strings jugs kakurasu knight_swap knights_knaves
    largest_island lcm leg_counting letter_counting letter_jumble list_functions mahjong_puzzle
    manipulate_matrix maze mini_sudoku modulo_grid needle_haystack number_filtering
    number_format number_sequence palindrome_generation palindrome_partitioning path_star
    polynomial_equations pool_matrix power_function prime_factorization products quantum_lock
    ransom_note rearc rectangle_count rotate_matrix rotten_oranges self_reference
    sentence_reordering shortest_path simple_equations simple_geometry spell_backward
    string_manipulation string_splitting string_synthesis sudoku survo syllogism
    time_intervals tower_of_hanoi tsumego word_ladder word_sequence_reversal word_sorting
    zebra_puzzles""".split()
)

_SYMPY = "sympy parse_expr evaluates the answer"
_EVAL = "Python eval() of the answer"
JAILED: dict[str, str] = {
    "polynomial_multiplication": _SYMPY,
    "simple_integration": _SYMPY,
    "intermediate_integration": _SYMPY,
    "puzzle24": _SYMPY,
    "countdown": _SYMPY,
    "binary_matrix": _EVAL,
    "n_queens": _EVAL,
    "spiral_matrix": _EVAL,
    "string_insertion": _EVAL,
    "bitwise_arithmetic": "the scorer calls eval() (on the reference)",
    "number_sorting": "the scorer calls eval() (on the reference)",
    "propositional_logic": "a recursive hand-written expression parser over the answer",
    "coin_flip": "Fraction(answer): '1e999999999' computes a billion-digit integer",
    "rush_hour": "moves 'A+<4000 digits>' loop that many steps",
    "rubiks_cube": "moves 'R<digits>' build a list that long; magiccube not audited",
    "codeio": "tree edit distance (zss), cubic in the answer's JSON",
    "boxnet": "a backtracking regex over answer-controlled text",
    "sokoban": "the game class is bound at run time, out of the audit's reach",
    "composite": "delegates to the scorer of each mixed family",
}

# Families whose scorer evaluates the answer: the answer must pass this screen before it is
# sent to the jail. "sympy": a plain arithmetic expression; "python": a Python literal, a bare
# name, or text that does not compile (then eval() raises before anything runs).
SCREENS: dict[str, str] = {
    **dict.fromkeys(
        ["polynomial_multiplication", "simple_integration", "intermediate_integration",
         "puzzle24", "countdown"], "sympy"),
    **dict.fromkeys(["binary_matrix", "n_queens", "spiral_matrix", "string_insertion"], "python"),
}  # fmt: skip


class GradeInJail(RuntimeError):
    """`grade()` was asked to run a scorer that must run out of process (`whale.grading`)."""


def families() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@dataclasses.dataclass(frozen=True)
class JailedGrading:
    """What the grading jail needs for one answer: how to build the family's dataset there (a
    scorer may read the dataset's config), the entry to score against, the screen the answer
    must pass first, and why this answer is not graded in process."""

    family: str
    size: int
    seed: int
    config_json: str
    entry: Any = dataclasses.field(repr=False)
    screen: str | None
    reason: str

    @property
    def dataset_key(self) -> str:
        """Same key, same dataset: one jailed grader serves every answer of one dataset."""
        return json.dumps([self.family, self.size, self.seed, self.config_json])

    def passes_screen(self, answer: str) -> bool:
        return passes_screen(self.screen, answer)


class ReasoningGymTask(TaskBase):
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
        try:  # the grading jail rebuilds the dataset from this
            self._config_json = json.dumps(_plain(self.config), sort_keys=True)
        except (TypeError, ValueError) as e:
            raise UnknownTask(f"rg:{family}: config must be plain data (JSON): {e}") from e
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

    @cached_property
    def entries(self) -> list[Any]:
        """The dataset's entries, the same in every process (rg_entries.py: some families'
        generators follow the process's string hashing)."""
        plain = json.loads(self._config_json)
        if rg_entries.needs_child(self.family, plain):
            return rg_entries.made_in_child(self.family, self.size, self.seed, plain)
        return [self.dataset[i] for i in range(len(self.dataset))]

    def questions(self) -> list[Question]:
        out = []
        for i, entry in enumerate(self.entries):
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

    def isolation_reason(self, answer: str) -> str | None:
        """Why this answer must be graded out of process, or None where `grade()` may."""
        if self.family not in IN_PROCESS:
            return JAILED.get(self.family, "scorer not audited")
        if len(answer) > IN_PROCESS_MAX_CHARS:
            return f"answer longer than {IN_PROCESS_MAX_CHARS} characters"
        return None

    def precheck(self, question: Question, answer: str) -> Grade | None:
        """A grade decided by string handling before any scorer runs (see `_PRECHECKS`)."""
        entry = question.reference
        family = self.family
        if family == "composite":
            family = str(entry.get("metadata", {}).get("source_dataset", family))
        check = _PRECHECKS.get(family)
        return None if check is None else check(answer, entry)

    def jailed_grading(self, question: Question, answer: str) -> JailedGrading | None:
        """None: `grade()` scores this answer here. Otherwise what the grading jail needs."""
        reason = self.isolation_reason(answer)
        if reason is None:
            return None
        entry = question.reference
        family = self.family
        if family == "composite":  # screen by the family that made this entry
            family = str(entry.get("metadata", {}).get("source_dataset", family))
        return JailedGrading(
            self.family, self.size, self.seed, self._config_json, entry,
            SCREENS.get(family), reason,
        )  # fmt: skip

    def grade(self, question: Question, answer: str) -> Grade:
        """The audited in-process scorers only; raises GradeInJail for any other (see the
        module docstring), so that no path runs a scorer that evaluates the answer here."""
        reason = self.isolation_reason(answer)
        if reason is not None:
            raise GradeInJail(
                f"rg:{self.family} is graded out of process ({reason}): use whale.grading.grade"
            )
        fixed = _SCORER_FIXES.get(self.family)
        try:
            if fixed is not None:
                score = fixed(answer, question.reference)
            else:
                score = float(self.dataset.score_answer(answer, question.reference))
        except Exception as e:  # noqa: BLE001 - a scorer crash on odd input is a zero, recorded
            return Grade(0.0, False, f"scorer error: {type(e).__name__}: {e}")
        score = min(1.0, max(0.0, score)) if score == score else 0.0  # NaN is a zero
        return Grade(score, score == 1.0)


# --- the screens: pure string handling, nothing is evaluated ------------------------------

# Names a plain answer of the sympy families may use besides single letters and letter+digits
# (x, C, x1): the functions and constants their reference answers use, and a few more.
MATH_NAMES = frozenset(
    """sin cos tan cot sec csc asin acos atan acot sinh cosh tanh asinh acosh atanh exp log ln
    sqrt Abs abs pi oo""".split()
)
PLAIN_MAX_CHARS = 4096
_PLAIN_CHARS = re.compile(r"[0-9A-Za-z \t\n+\-*/^()=,.]*\Z")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_LETTER_DIGITS = re.compile(r"[A-Za-z][0-9]*\Z")


def plain_expression(text: str) -> bool:
    """An arithmetic expression and nothing more: ASCII digits, letters, whitespace,
    `+ - * / ^ ( ) = ,`; a '.' only inside a number (no attribute access); names only single
    letters, a letter and digits, or `MATH_NAMES` (so no keyword, builtin or sympy helper
    beyond those: no `exec`, `or`, `lambda`); no quotes, brackets, underscores, ';' or '\\'.
    At most PLAIN_MAX_CHARS characters."""
    if len(text) > PLAIN_MAX_CHARS or not _PLAIN_CHARS.match(text):
        return False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isdigit():
            m = _NUMBER.match(text, i)
            assert m is not None
            if re.search(r"[eE][+-]?[0-9]{4}", m.group(0)):  # 1e99999: a float too big to hold
                return False
            i = m.end()
        elif c.isalpha():
            m = _NAME.match(text, i)
            assert m is not None
            name = m.group(0)
            if not (_LETTER_DIGITS.match(name) or name in MATH_NAMES):
                return False
            i = m.end()
            # Only MATH_NAMES may be called: sympy's one-letter names N, S, O, Q are functions
            # (N(pi, 10**8) computes 10**8 digits).
            if text[i:].lstrip()[:1] == "(" and name not in MATH_NAMES:
                return False
        elif c == ".":  # a number's '.' was consumed with the number
            return False
        else:
            i += 1
    return bounded_powers(text)  # powers bounded whatever the parenthesization (issue 20)


_LITERAL_NODES = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Load,
                  ast.UnaryOp, ast.USub, ast.UAdd)  # fmt: skip


def python_literal_or_not_code(text: str) -> bool:
    """What `eval(text)` may see: a Python literal (numbers, strings, lists, tuples, signed
    numbers) or text that does not compile, so that eval raises before anything runs. No
    name: the scorers eval in a scope that holds `oracle_answer` (the reference), so a bare
    name is a lookup of it. (string_insertion's references are bare names: the exact answer
    is scored by `_exact_reference` before the screen.) Checked
    as eval reads it (eval drops leading spaces and tabs) and stripped; anything the parser
    cannot even read (deep nesting, NUL) is refused."""
    if "\x00" in text:
        return False
    for variant in {text, text.lstrip(" \t"), text.strip()}:
        try:
            tree = ast.parse(variant, mode="eval")
        except SyntaxError:
            continue
        except Exception:  # noqa: BLE001 - RecursionError, MemoryError: refuse
            return False
        for node in ast.walk(tree):
            if not isinstance(node, _LITERAL_NODES):
                return False
            if isinstance(node, ast.Name):  # eval("oracle_answer") reads the scorer's locals
                return False
            if isinstance(node, ast.UnaryOp) and not isinstance(node.operand, ast.Constant):
                return False
    return True


def passes_screen(kind: str | None, answer: str) -> bool:
    if kind is None:
        return True
    if kind == "sympy":
        return plain_expression(answer)
    if kind == "python":
        return python_literal_or_not_code(answer)
    return False  # an unknown screen lets nothing through


# --- helpers ---------------------------------------------------------------------------------


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


def _plain(value: Any) -> Any:
    """The config as JSON data (composite's DatasetSpec objects as dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _bool_answer(answer: str, entry: dict[str, Any]) -> float:
    """reasoning-gym 0.1.25's game_of_life_halting scorer compares bool(str), so any non-empty
    answer scores 1.0 (bool("False") is True). whale compares the words instead."""
    word = answer.strip().strip(".").casefold()
    return 1.0 if word == str(entry["answer"]).strip().casefold() else 0.0


_SCORER_FIXES = {"game_of_life_halting": _bool_answer}


def _puzzle24_numbers(answer: str, entry: dict[str, Any]) -> Grade | None:
    """reasoning-gym 0.1.25's puzzle24 scorer checks that an answer uses four numbers in range
    and makes 24, not that they are the puzzle's numbers: `4*3*2*1` scores 1.0 on every
    question. whale first checks (by string, nothing is evaluated) that the answer's numbers
    are the puzzle's, as the countdown scorer does; else 0.01, the scorer's own wrong score."""
    used = sorted(int(n) for n in re.findall(r"\b\d+\b", answer[:PLAIN_MAX_CHARS]))
    if used != sorted(int(n) for n in entry.get("metadata", {}).get("numbers", [])):
        return Grade(0.01, False, "the answer does not use exactly the puzzle's numbers")
    return None


def _exact_reference(answer: str, entry: dict[str, Any]) -> Grade | None:
    """string_insertion's scorer gives 1.0 to `answer == entry["answer"]` before it evals
    anything; whale does that comparison here, so that the screen may refuse every bare name
    (its references are bare names, `ABCDAEB`)."""
    return Grade(1.0, True) if answer == entry.get("answer") else None


# Pure-string verdicts that come before any scorer, in process or jailed (whale's fixes).
_PRECHECKS = {"puzzle24": _puzzle24_numbers, "string_insertion": _exact_reference}


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
