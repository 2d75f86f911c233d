"""Reward and Select.

r = J(h'; Q_score) + v, with the Reasoning Gym validity bonus
v = 0.05·[parses] + 0.10·[runnable] + 0.15·ρ_run. An invalid candidate earns validity credit
only. Select keeps one harness per round: `ratchet` keeps the best candidate only if its score
beats the parent's on the same questions (never lower the kept dev score); `best-of-g`
advances to the best candidate even below the parent (the paper's QA protocol).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SelectRule = Literal["ratchet", "best-of-g"]
SELECT_RULES: tuple[str, ...] = ("ratchet", "best-of-g")


@dataclass(frozen=True)
class ValidityWeights:
    parses: float = 0.05
    runnable: float = 0.10
    rho_run: float = 0.15


def validity(
    parses: bool, runnable: bool, rho_run: float, w: ValidityWeights = ValidityWeights()
) -> float:
    return w.parses * parses + w.runnable * runnable + w.rho_run * rho_run


def reward(score: float | None, parses: bool, runnable: bool, rho_run: float,
           w: ValidityWeights = ValidityWeights()) -> float:  # fmt: skip
    """`score` is J on Q_score (None for a candidate that could not be scored)."""
    return (score or 0.0) + validity(parses, runnable, rho_run, w)


@dataclass
class Candidate:
    """One archive row: a proposal, what Apply made of it, and how it scored."""

    round: int
    index: int
    parent_hash: str
    hash: str | None  # None when Apply failed
    valid: bool
    reason: str
    mode: str
    parses: bool = False
    runnable: bool = False
    rho_run: float = 0.0
    score: float | None = None  # J(h'; Q_score)
    reward: float = 0.0
    n_scored: int = 0


@dataclass(frozen=True)
class Decision:
    kept_hash: str
    kept_score: float
    parent_hash: str
    parent_score: float
    chosen: int | None  # index of the candidate advanced to, None if the parent is kept
    rule: str
    why: str


def select(rule: SelectRule, parent_hash: str, parent_score: float,
           candidates: Sequence[Candidate]) -> Decision:  # fmt: skip
    """The round's decision. An unknown `rule` is a ValueError (it used to fall through to
    best-of-g, which may lower the kept score: a typo must not change the protocol)."""
    if rule not in SELECT_RULES:
        raise ValueError(f"unknown Select rule {rule!r}; known: {', '.join(SELECT_RULES)}")
    scored = [c for c in candidates if c.valid and c.score is not None and c.hash is not None]
    if not scored:
        return Decision(parent_hash, parent_score, parent_hash, parent_score, None, rule,
                        "no valid candidate: the parent is kept")  # fmt: skip
    best = max(scored, key=lambda c: (c.score, c.reward, -c.index))
    assert best.score is not None and best.hash is not None
    if rule == "ratchet" and best.score <= parent_score:
        why = f"best candidate scores {best.score:.3f}, not above the parent's {parent_score:.3f}"
        return Decision(parent_hash, parent_score, parent_hash, parent_score, None, rule, why)
    why = f"candidate {best.index} scores {best.score:.3f} (parent {parent_score:.3f})"
    return Decision(best.hash, best.score, parent_hash, parent_score, best.index, rule, why)
