"""Reward and Select.

r = J(h'; Q_score) + v, with the Reasoning Gym validity bonus
v = 0.05·[parses] + 0.10·[runnable] + 0.15·ρ_run. An invalid candidate earns validity credit
only. Select keeps one harness per round: `ratchet` keeps the best candidate only if its score
beats the parent's on the same questions (never lower the kept dev score); `best-of-g`
advances to the best candidate even below the parent (the paper's QA protocol).

Noise-aware Select (`noise_k` = k >= 2; 0 is off): a candidate that either rule would keep is
kept only if it beats the parent by more than the noise of the score. The parent and the
candidate are each rescored k more times on the same Q_score, all of them fresh: repeat
j = 1..k runs under the solver's sampling seed + j (`whale.revise.loop` pays for them), never
the round's own scoring (seed + 0). That scoring is the one on which the candidate won Select
(the best of g, and above the parent under `ratchet`), so it is biased up: reused as a sample
(the winner's curse), it let no-better candidates through twice as often. With
d_j = c_j - p_j, the candidate is kept iff mean(d) > t_(k-1, 0.975)·SE(d), SE = sample SD /
sqrt(k) (`whale.stats.paired`, `whale.stats.t_quantile`: 12.71 at k = 2, 4.30 at k = 3, 2.78
at k = 5), a one-sided t test at 2.5%. With k = 2 or 3 the SD is estimated from 1 or 2
degrees of freedom, so a fixed 2·SE would be a test at P(t_1 > 2) = 0.15 or P(t_2 > 2) = 0.09.
Otherwise the parent is kept, under either rule. Where rescoring gives the same d every time
(a solver at temperature 0, whose answer does not depend on the seed) SE is 0 and the rule is
"strictly better than the parent".

Cost: 2·k·n rollouts (n = |Q_score|) for each round whose rule advanced to a candidate, kept
or not; rescorings the ledger already holds (a resumed run, a parent that was rescored as the
previous round's candidate) cost nothing. False-keep rate, measured by the seeded simulation of
`test_the_false_keep_rate_under_the_null_is_small` (tests/revise/test_select_noise.py; null:
the parent and g = 4 candidates have the same true accuracy 0.5, each scoring is
Binomial(12, 0.5)/12, Select by ratchet, then this check; 2000 trials): 0.032 at k = 2 and
0.019 at k = 3, where the first version of this option (selection score as sample 1, 2·SE)
kept 0.1135 at k = 3; the test asserts <= 0.06. The price is power: k = 2 (t = 12.7) keeps
almost only gains that every rescoring reproduces. Not covered: the test guards against the
noise of the solver's sampling, not against that of drawing Q_score (every rescoring reads the
same questions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    """The k fresh rescorings of the parent and of the candidate (not the round's own scoring),
    d_j = candidate_j - parent_j, their mean, SE, t = t_(k-1, 0.975), noise = t·SE, and the
    verdict."""

    k: int
    parent_scores: tuple[float, ...]
    candidate_scores: tuple[float, ...]
    mean_diff: float
    se: float
    t: float
    noise: float
    passed: bool
    rollouts: int  # paid (or answered from the ledger) for the k rescorings of both


def noise_check(parent_scores: Sequence[float], candidate_scores: Sequence[float],
                rollouts: int = 0) -> NoiseCheck:  # fmt: skip
    """The rule of the module docstring on k fresh scores of each: passed iff
    mean(d) > t_(k-1, 0.975)·SE(d) (with SE = 0: iff mean(d) > 0). ValueError unless both have
    the same k >= 2 scores."""
    if len(parent_scores) != len(candidate_scores) or len(parent_scores) < 2:
        raise ValueError(
            f"noise check needs k >= 2 scores of each, got {len(parent_scores)} of the parent "
            f"and {len(candidate_scores)} of the candidate"
        )
    k = len(parent_scores)
    p = stats.paired([c - q for c, q in zip(candidate_scores, parent_scores, strict=True)])
    assert p.se is not None  # k >= 2
    t = stats.t_quantile(k - 1)
    return NoiseCheck(k, tuple(parent_scores), tuple(candidate_scores), p.mean, p.se, t,
                      t * p.se, p.mean > t * p.se, rollouts)  # fmt: skip


def rescored_check(k: int, rescore: Callable[[int], tuple[float, float]]) -> NoiseCheck:
    """The noise check on k fresh rescorings: `rescore(j)` for j = 1..k gives the j-th
    (parent score, candidate score), which the loop runs under sampling seed + j; j = 0, the
    round's own scoring, is never asked for. ValueError for k < 2."""
    if k < 2:
        raise ValueError(f"noise check needs k >= 2 rescorings, not {k}")
    pairs = [rescore(j) for j in range(1, k + 1)]
    return noise_check([p for p, _ in pairs], [c for _, c in pairs])


def apply_noise_check(d: Decision, check: NoiseCheck) -> Decision:
    """`d` (which advanced to a candidate) kept as it is when the check passed, else the
    parent is kept; either way the check's numbers are recorded in the decision."""
    if d.chosen is None:
        raise ValueError("the noise check applies to a decision that advanced to a candidate")
    nums = (f"mean of {check.k} rescorings {sum(check.candidate_scores) / check.k:.3f} vs parent "
            f"{sum(check.parent_scores) / check.k:.3f}: diff {check.mean_diff:+.3f}, noise "
            f"t·SE = {check.t:.2f}·{check.se:.3f} = {check.noise:.3f}")  # fmt: skip
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
