"""Task variants: the same questions, graders and references, in other words.

`task.variant = "canonical"` is the task as its family makes it. `"format"` is the Harness
Learning paper's format-varied questions (its Table 13): every question's text is rewritten by
its family's rule (`RULES`), which

- rewords the answer-format instruction the family writes into its questions ("Give only the
  GCD as your final answer.") with one of several phrasings that ask for the same answer form,
  so the family's grader and the expected answer stay valid unchanged;
- rephrases the question around its content ("Find the ... of these numbers: 98, 54" becomes
  "What is the ... of 98, 54?") and frames it (`FRAMES`: a "Question:" prefix, the instruction
  before the question, ...).

Only wording changes. A rule reads a question with a pattern whose named groups are the content
the answer depends on (numbers, words, the maze grid, the legend), and every rewording uses
each group verbatim, exactly once (tests check it for every rule). A family whose questions
carry no answer-format instruction (lcm, count_bits, mhqa, ...) gets none added: adding one
would hint at a format the canonical task leaves to the harness. The QA and math datasets'
questions are free text with no fixed wording, so their rule only frames them (`FRAME_ONLY`).

The wording is drawn from `random.Random` seeded by the task seed and the canonical text, so one
question always gets one wording (resumes and ledgers stay stable), and two questions with the
same canonical text get the same variant text (the split's de-duplication and the held-out
leak checks, which compare texts, still see them as one). Question ids are unchanged: the
variant is a field of `TaskConfig`, so the outcome fingerprint (built from the whole
TaskConfig) keeps the ledgers of the two variants apart, and a resume refuses a changed
variant. The task's description is the family's own: it does not mention the variant.

A task with no rule refuses `"format"` (`VariantRefused`, naming the task and the offered
ones); so does a question whose text the family's rule does not recognise (a `task.config`
that changes the family's wording is not covered), rather than being passed through unchanged.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

from whale.config import ConfigError
from whale.tasks.base import Question, Task, UnknownTask, WrappedTask

VARIANTS = ("canonical", "format")


class VariantRefused(ConfigError, UnknownTask):
    """A variant the task does not offer (a ConfigError for configs, an UnknownTask for the
    commands that report bad task ids)."""


@dataclass(frozen=True)
class Rule:
    """How one family's questions are reworded.

    patterns: the family's canonical wordings (full match, DOTALL); the named groups are the
        content every rewording keeps verbatim.
    questions: rephrasings of the question, `{group}` fields.
    instructions: equivalent answer-format instructions (the same answer form); empty when the
        family's questions carry none.
    replaced: the family's fixed wording that no rewording keeps (what a test checks is gone).
    """

    patterns: tuple[str, ...]
    questions: tuple[str, ...]
    instructions: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()

    def compiled(self) -> list[re.Pattern[str]]:
        return [re.compile(p, re.DOTALL) for p in self.patterns]


# How a reworded question and its instruction are put together. No digits, no content: only
# the layout and the lead-in change. FRAMES_BARE serve questions without an instruction.
FRAMES = (
    "{core}\n{instr}",
    "{instr}\n\n{core}",
    "Question: {core}\n\n{instr}",
    "Here is a question for you.\n\n{core}\n\n{instr}",
    "{core}\n\nAnswer format: {instr}",
    "Instructions: {instr}\n\nQuestion: {core}",
)
FRAMES_BARE = (
    "Question: {core}",
    "Here is a question for you.\n\n{core}",
    "Please answer the following.\n\n{core}",
    "Consider the following.\n{core}",
)

_GIVE_ONLY = ("Your final answer should be the {what} alone.", "Reply with only the {what}.",
              "State just the {what} as your final answer, nothing else.")  # fmt: skip


def _only(what: str) -> tuple[str, ...]:
    return tuple(s.format(what=what) for s in _GIVE_ONLY)


# Reasoning Gym 0.1.25, each family's default config (checked by tests/tasks/test_variants.py).
RG_RULES: dict[str, Rule] = {
    "basic_arithmetic": Rule(
        (r"Calculate (?P<expr>.+)\.",),
        (
            "What is the value of {expr}?",
            "Work out {expr}.",
            "Evaluate the expression {expr}.",
            "Find the result of {expr}.",
        ),
        replaced=("Calculate ",),
    ),
    "chain_sum": Rule(
        (r"State the final answer to the following arithmetic problem: (?P<expr>.+) =",),
        ("{expr} = ?", "Work out {expr}.", "What is {expr}?"),
        (
            "Give the final answer to this arithmetic problem.",
            "Provide the final answer to this arithmetic problem.",
            "What is the final answer to this arithmetic problem?",
        ),
        ("State the final answer to the following arithmetic problem:",),
    ),
    "gcd": Rule(
        (
            r"Find the Greatest Common Divisor \(GCD\) of these numbers: (?P<numbers>.+?)\. "
            r"Give only the GCD as your final answer\.",
        ),
        (
            "What is the greatest common divisor of {numbers}?",
            "Compute the GCD (greatest common divisor) of the numbers {numbers}.",
            "Determine the largest integer that divides each of {numbers}.",
        ),
        _only("GCD"),
        (
            "Find the Greatest Common Divisor (GCD) of these numbers:",
            "Give only the GCD as your final answer.",
        ),
    ),
    "lcm": Rule(
        (r"Find the Least Common Multiple \(LCM\) of these numbers: (?P<numbers>.+)",),
        (
            "What is the least common multiple of {numbers}?",
            "Compute the LCM (least common multiple) of the numbers {numbers}.",
            "Determine the smallest positive integer that is a multiple of each of {numbers}.",
        ),
        replaced=("Find the Least Common Multiple (LCM) of these numbers:",),
    ),
    "count_bits": Rule(
        (r"How many 1 bits are there in the binary representation of the number (?P<n>\d+)\?",),
        (
            "Count the bits set to 1 in the binary representation of {n}.",
            "When {n} is written in binary, how many of its digits are 1?",
            "What is the number of 1s in the binary form of the number {n}?",
        ),
        replaced=("How many 1 bits are there in the binary representation of the number",),
    ),
    "letter_counting": Rule(
        (r'How many times does the letter "(?P<letter>.)" appear in the text: "(?P<text>.*)"\?',),
        (
            'Count how often the letter "{letter}" occurs in this text: "{text}"',
            'In the text "{text}", count the occurrences of the letter "{letter}".',
            'What is the number of occurrences of the letter "{letter}" in the text "{text}"?',
        ),
        replaced=("How many times does the letter",),
    ),
    "leg_counting": Rule(
        (
            r"Your task is to count how many legs there are in total when given a list of "
            r"animals\.\n\nNow, how many legs are there in total if you have (?P<animals>.+)\?\s*",
        ),
        (
            "Count the total number of legs of these animals: {animals}.",
            "Suppose you have {animals}. How many legs do they have altogether?",
            "What is the total leg count for {animals}?",
        ),
        replaced=(
            "Your task is to count how many legs",
            "how many legs are there in total if you have",
        ),
    ),
    "maze": Rule(
        (
            r"Navigate from '(?P<start>.)' \(start\) to '(?P<goal>.)' \(goal\):\n\n```\n"
            r"(?P<grid>.*?)\n```\nLegend: (?P<legend>[^\n]*)\n\n"
            r"What is the minimum number of steps to reach the goal\?\n"
            r"Give only the number of steps as your final answer, no other text or formatting\.",
        ),
        (
            "Find the shortest path from '{start}' (start) to '{goal}' (goal) in this maze:\n\n"
            "```\n{grid}\n```\nLegend: {legend}\n\nHow many steps does it take at minimum?",
            "Below is a maze. The start is marked '{start}' and the goal is marked '{goal}'.\n\n"
            "```\n{grid}\n```\nLegend: {legend}\n\n"
            "What is the fewest number of steps needed to go from the start to the goal?",
            "Consider this maze:\n\n```\n{grid}\n```\nLegend: {legend}\n\nCount the minimum "
            "number of steps from '{start}' (start) to '{goal}' (goal) in it.",
        ),
        (
            "Reply with the number of steps only, without any other text or formatting.",
            "Your final answer must be just the step count: no other text, no formatting.",
            "Answer with the number of steps and nothing else.",
        ),
        (
            "Navigate from",
            "What is the minimum number of steps to reach the goal?",
            "Give only the number of steps as your final answer, no other text or formatting.",
        ),
    ),
    "word_sorting": Rule(
        (
            r"Your task is to sort words in ascending or descending order using ASCII/Unicode "
            r"ordering\.\n\nYour output should be a comma-separated list of words, e\.g\. "
            r"(?P<example>[^\n]+)\n\nNow, sort these words in (?P<order>ascending|descending) "
            r"order \(using ASCII/Unicode ordering\) and return them as a comma-separated list: "
            r"(?P<words>.*?)\s*",
        ),
        (
            "Sort the following words in {order} order by ASCII/Unicode ordering: {words}",
            "Arrange these words in {order} ASCII/Unicode order: {words}",
            "Here are some words: {words}\nPut them in {order} order, comparing them by "
            "ASCII/Unicode ordering.",
        ),
        (
            "Write the sorted words as one comma-separated list, e.g. {example}",
            "Give your answer as a comma-separated list of words (for example: {example}).",
            "Respond with the words separated by commas, like {example}",
        ),
        (
            "Your task is to sort words",
            "Your output should be a comma-separated list of words",
            "and return them as a comma-separated list:",
        ),
    ),
    "spell_backward": Rule(
        (r"Spell this word backward \(example: (?P<example>[^)]+)\): (?P<word>.+)",),
        (
            "Write the word {word} backward.",
            "Reverse the letters of this word: {word}",
            "What is {word} spelled backward?",
        ),
        (
            "Answer with the reversed word, as in the example {example}.",
            "(For instance: {example})",
            "Give the word spelled backward, e.g. {example}.",
        ),
        ("Spell this word backward (example:",),
    ),
    "prime_factorization": Rule(
        (
            r"Find the prime factorization of (?P<n>\d+)\. Write the factors separated by × "
            r"\(Example: for (?P<ex_n>\d+) the answer would be: (?P<ex_ans>[^)]+)\)",
        ),
        (
            "What is the prime factorization of {n}?",
            "Factor {n} into primes.",
            "Break {n} down into its prime factors.",
        ),
        (
            "List the factors separated by ×; for example, for {ex_n} the answer is {ex_ans}.",
            "Write your answer as the prime factors joined by × (e.g. {ex_n} -> {ex_ans}).",
            "Separate the factors with ×, as in: for {ex_n}, the answer would be {ex_ans}.",
        ),
        ("Find the prime factorization of", "Write the factors separated by ×"),
    ),
    "simple_equations": Rule(
        (
            r"Find the value of (?P<var>\w+) in the equation: (?P<eq>.+)",
            r"Solve for (?P<var>\w+): (?P<eq>.+)",
            r"Determine the value of (?P<var>\w+) that satisfies: (?P<eq>.+)",
        ),
        (
            "What value of {var} makes {eq} true?",
            "Given the equation {eq}, what is {var}?",
            "Compute {var} from the equation {eq}.",
        ),
        replaced=("Find the value of", "Solve for", "Determine the value of"),
    ),
    "fraction_simplification": Rule(
        (
            r"Simplify the fraction (?P<fraction>.+?) to its lowest terms\. "
            r"Give only the simplified fraction as your final answer\.",
        ),
        (
            "Reduce the fraction {fraction} to lowest terms.",
            "Write {fraction} in simplest form.",
            "What is {fraction} reduced to its lowest terms?",
        ),
        _only("simplified fraction"),
        ("Simplify the fraction", "Give only the simplified fraction as your final answer."),
    ),
    "products": Rule(
        (
            r"Solve the following multiplication: (?P<expr>.+?)\. "
            r"Give only the result as your final answer\.",
        ),
        ("Multiply: {expr}.", "What is the product {expr}?", "Compute the multiplication {expr}."),
        _only("result"),
        ("Solve the following multiplication:", "Give only the result as your final answer."),
    ),
}

# Free-text questions (QA datasets, math problems) with no fixed wording and no format
# instruction of their own: framed only, the text kept whole.
FRAME_ONLY = Rule((r"(?P<question>.+)",), ("{question}",))
FRAME_ONLY_KINDS = ("mhqa", "hotpotqa", "musique", "2wiki", "math", "champ")
_KIND_SHOWN = {"mhqa": "mhqa", "champ": "champ"}


def offered() -> list[str]:
    """The task ids (patterns) that offer `variant = "format"`."""
    kinds = [_KIND_SHOWN.get(k, f"{k}:PATH") for k in FRAME_ONLY_KINDS]
    return [*(f"rg:{f}" for f in sorted(RG_RULES)), *kinds]


def rule_for(task_id: str) -> Rule | None:
    kind, _, rest = task_id.partition(":")
    if kind == "rg":
        return RG_RULES.get(rest)
    if kind in FRAME_ONLY_KINDS and bool(rest) == (kind not in _KIND_SHOWN):
        return FRAME_ONLY
    return None


def refusal(task_id: str, variant: str) -> str | None:
    """Why `variant` cannot be used with `task_id`, or None when it can."""
    if variant not in VARIANTS:
        return f"variant: {variant!r} is not one of {', '.join(map(repr, VARIANTS))}"
    if variant == "format" and rule_for(task_id) is None:
        return (f"variant: 'format' is not offered for task {task_id!r} (no rewording rule for "
                f"it is verified); offered: {', '.join(offered())}")  # fmt: skip
    return None


def reword(rule: Rule, prompt: str, salt: str) -> str | None:
    """The variant text of `prompt` under `rule` (drawn with `salt` + the text), or None when
    no pattern of the rule reads it."""
    for pattern in rule.compiled():
        m = pattern.fullmatch(prompt)
        if m is None:
            continue
        groups = m.groupdict()
        rng = random.Random(f"whale-format:{salt}:{prompt}")
        core = rng.choice(rule.questions).format(**groups)
        instr = rng.choice(rule.instructions).format(**groups) if rule.instructions else ""
        frame = rng.choice(FRAMES if instr else FRAMES_BARE)
        return frame.format(core=core.strip(), instr=instr)
    return None


class VariantTask(WrappedTask):
    """`inner` with its questions reworded; everything else (grader, references, description,
    and every capability: `expected`, `format_ok`, the retriever, jailed grading, ...) is the
    inner task's."""

    def __init__(self, inner: Task, task_id: str, rule: Rule, seed: int) -> None:
        super().__init__(inner)
        self._task_id, self._rule, self._seed = task_id, rule, seed
        self._questions: list[Question] | None = None

    def questions(self) -> list[Question]:
        if self._questions is None:
            self._questions = [self._reworded(q) for q in self.inner.questions()]
        return list(self._questions)

    def _reworded(self, q: Question) -> Question:
        text = reword(self._rule, q.prompt, str(self._seed))
        if text is None:
            raise VariantRefused(
                f"task {self._task_id}: question {q.id} does not have the wording the 'format' "
                "variant rewrites (the family's default wording; a task.config that changes it "
                f"is not covered): {q.prompt[:160]!r}"
            )
        return replace(q, prompt=text, metadata={**q.metadata, "variant": "format"})


def with_variant(task: Task, task_id: str, variant: str, seed: int) -> Task:
    """`task` as `variant` asks (VariantRefused naming the task when it is not offered)."""
    why = refusal(task_id, variant)
    if why is not None:
        raise VariantRefused(why)
    if variant == "canonical":
        return task
    rule = rule_for(task_id)
    assert rule is not None  # refusal() checked it
    return VariantTask(task, task_id, rule, seed)
