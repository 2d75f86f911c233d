"""Reward and Select.

r = J(h'; Q_score) + v, with the Reasoning Gym validity bonus
v = 0.05·[parses] + 0.10·[runnable] + 0.15·ρ_run. An invalid candidate earns validity credit
only. Select keeps one harness per round: `ratchet` keeps the best candidate only if its score
beats the parent's on the same questions (never lower the kept dev score); `best-of-g`
advances to the best candidate even below the parent (the paper's QA protocol).

Noise-aware Select (`noise_k` = k >= 2; 0 is off): a candidate that either rule would keep is
kept only if it beats the parent by more than the noise of the score. The parent and the
candidate are each scored k times on the same Q_score (the round's own scoring is sample 1;
`whale.revise.loop` pays for k - 1 more, repeat j under sampling seed + j), d_j = c_j - p_j,
and the candidate is kept iff mean(d) > 2·SE(d), SE = sample SD / sqrt(k) (`whale.stats.paired`).
Otherwise the parent is kept, under either rule. Where rescoring gives the same scores (a
solver at temperature 0, whose answer does not depend on the seed) SE is 0 and the rule is
"strictly better than the parent". Not covered: k is small, so SE is itself noisy; the rule
guards against the noise of the solver's sampling, not against that of drawing Q_score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from whale import stats

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
    # The noise check's numbers (`NoiseCheck`, as a dict) when noise_k >= 2 ran it this round.
    noise: dict[str, Any] | None = None


@dataclass(frozen=True)
class NoiseCheck:
    """The k scores of the parent and of the candidate (sample 1 is the round's own scoring),
    d_j = candidate_j - parent_j, their mean, SE, noise = 2·SE, and the verdict."""

    k: int
    parent_scores: tuple[float, ...]
    candidate_scores: tuple[float, ...]
    mean_diff: float
    se: float
    noise: float
    passed: bool
    rollouts: int  # paid (or answered from the ledger) for the k - 1 rescorings


def noise_check(parent_scores: Sequence[float], candidate_scores: Sequence[float],
                rollouts: int = 0) -> NoiseCheck:  # fmt: skip
    """The rule of the module docstring: passed iff mean(d) > 2·SE(d). ValueError unless both
    have the same k >= 2 scores."""
    if len(parent_scores) != len(candidate_scores) or len(parent_scores) < 2:
        raise ValueError(
            f"noise check needs k >= 2 scores of each, got {len(parent_scores)} of the parent "
            f"and {len(candidate_scores)} of the candidate"
        )
    p = stats.paired([c - q for c, q in zip(candidate_scores, parent_scores, strict=True)])
    assert p.se is not None  # k >= 2
    return NoiseCheck(len(parent_scores), tuple(parent_scores), tuple(candidate_scores), p.mean,
                      p.se, 2 * p.se, p.mean > 2 * p.se, rollouts)  # fmt: skip


def apply_noise_check(d: Decision, check: NoiseCheck) -> Decision:
    """`d` (which advanced to a candidate) kept as it is when the check passed, else the
    parent is kept; either way the check's numbers are recorded in the decision."""
    if d.chosen is None:
        raise ValueError("the noise check applies to a decision that advanced to a candidate")
    nums = (f"mean of {check.k} rescorings {sum(check.candidate_scores) / check.k:.3f} vs parent "
            f"{sum(check.parent_scores) / check.k:.3f}: diff {check.mean_diff:+.3f}, noise "
            f"2·SE {check.noise:.3f}")  # fmt: skip
    record = {**asdict(check), "parent_scores": list(check.parent_scores),
              "candidate_scores": list(check.candidate_scores)}  # fmt: skip
    if check.passed:
        return replace(d, why=f"{d.why}; kept over the noise ({nums})", noise=record)
    why = f"candidate {d.chosen} not kept: not above the noise ({nums})"
    return replace(d, kept_hash=d.parent_hash, kept_score=d.parent_score, chosen=None, why=why,
                   noise=record)  # fmt: skip


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
