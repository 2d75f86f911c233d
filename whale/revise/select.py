"""Reward and Select.

r = J(h'; Q_score) + v, with the Reasoning Gym validity bonus
v = 0.05·[parses] + 0.10·[runnable] + 0.15·ρ_run. An invalid candidate earns validity credit
only. Select keeps one harness per round: `ratchet` keeps the best candidate only if its J
beats the parent's on the same questions (never lower the kept dev J); `best-of-g` advances to
the best candidate even below the parent (the paper's QA protocol).

One verifier (WHALE: one binary R(x, τ) per domain for acceptance, harness scoring and test):
J is the *accuracy*, the fraction of Q_score the task's verifier accepts (`Outcome.correct`),
never the mean partial score (Reasoning Gym's partial credit, F1 on multi-hop QA). That mean
(`mean_score`) is recorded beside J as an extra column and decides nothing. Ties are ties: the
ratchet keeps the parent when the best candidate's accuracy only equals it, and among
candidates of equal accuracy best-of-g takes the earliest (lowest index), so that neither the
partial score nor the validity bonus ever decides what the verifier did not.

Noise-aware Select (`noise_k` = k >= 2; 0 is off): a candidate that either rule would keep is
kept only if it beats the parent by more than the noise of J (accuracy). The parent and the
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
Binomial(12, 0.5)/12, Select by ratchet, then this check; 2000 trials): figures in
docs/measurements.md, against the first version of this option (selection score as sample 1,
2·SE); the test asserts <= 0.06. The price is power: k = 2 (t = 12.7) keeps
almost only gains that every rescoring reproduces. Not covered: the test guards against the
noise of the solver's sampling, not against that of drawing Q_score (every rescoring reads the
same questions).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from whale import stats

SelectRule = Literal["ratchet", "best-of-g"]
SELECT_RULES: tuple[SelectRule, ...] = typing.get_args(SelectRule)


@dataclass(frozen=True)
class ValidityWeights:
    parses: float = 0.05
    runnable: float = 0.10
    rho_run: float = 0.15


def validity(
    parses: bool, runnable: bool, rho_run: float, w: ValidityWeights = ValidityWeights()
) -> float:
    return w.parses * parses + w.runnable * runnable + w.rho_run * rho_run


def reward(accuracy: float | None, parses: bool, runnable: bool, rho_run: float,
           w: ValidityWeights = ValidityWeights()) -> float:  # fmt: skip
    """r = J + v. `accuracy` is J on Q_score: the fraction the task's binary verifier accepts
    (`EvalResult.accuracy`), never the mean partial score; None for a candidate that could not
    be scored."""
    return (accuracy or 0.0) + validity(parses, runnable, rho_run, w)


@dataclass
class Candidate:
    """One archive row: a proposal, what Apply made of it, and how it scored. `accuracy` is J
    (the decision: Select, the reward); `mean_score` is the mean partial score, an extra column
    that decides nothing."""

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
    accuracy: float | None = None  # J(h'; Q_score): the fraction correct (binary verifier)
    reward: float = 0.0  # J + v
    n_scored: int = 0
    mean_score: float | None = None  # mean partial score on Q_score: shown, never decides


@dataclass(frozen=True)
class Decision:
    """The round's Select. `*_accuracy` is J, on which it decided; `*_mean_score` the mean
    partial scores of the same harnesses, recorded beside it (None where unknown)."""

    kept_hash: str
    kept_accuracy: float
    parent_hash: str
    parent_accuracy: float
    chosen: int | None  # index of the candidate advanced to, None if the parent is kept
    rule: str
    why: str
    # The noise check's numbers (`NoiseCheck`, as a dict) when noise_k >= 2 ran it this round.
    noise: dict[str, Any] | None = None
    kept_mean_score: float | None = None
    parent_mean_score: float | None = None


@dataclass(frozen=True)
class NoiseCheck:
    """The k fresh rescorings of the parent and of the candidate (not the round's own scoring),
    each a J (accuracy on Q_score), d_j = candidate_j - parent_j, their mean, SE,
    t = t_(k-1, 0.975), noise = t·SE, and the verdict."""

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
    (parent J, candidate J), accuracies, which the loop runs under sampling seed + j; j = 0, the
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
    cand, par = sum(check.candidate_scores) / check.k, sum(check.parent_scores) / check.k
    nums = (f"mean accuracy of {check.k} rescorings {cand:.3f} vs parent {par:.3f}: diff "
            f"{check.mean_diff:+.3f}, noise "
            f"t·SE = {check.t:.2f}·{check.se:.3f} = {check.noise:.3f}")  # fmt: skip
    record = {**asdict(check), "parent_scores": list(check.parent_scores),
              "candidate_scores": list(check.candidate_scores)}  # fmt: skip
    if check.passed:
        return replace(d, why=f"{d.why}; kept over the noise ({nums})", noise=record)
    why = f"candidate {d.chosen} not kept: not above the noise ({nums})"
    return replace(d, kept_hash=d.parent_hash, kept_accuracy=d.parent_accuracy, chosen=None,
                   why=why, noise=record, kept_mean_score=d.parent_mean_score)  # fmt: skip


def select(rule: SelectRule, parent_hash: str, parent_accuracy: float,
           candidates: Sequence[Candidate],
           parent_mean_score: float | None = None) -> Decision:  # fmt: skip
    """The round's decision, on J = accuracy (the module docstring: ties are ties, the earliest
    candidate first among equals; `mean_score` and the reward's validity bonus never decide).
    An unknown `rule` is a ValueError (it used to fall through to best-of-g, which may lower the
    kept J: a typo must not change the protocol)."""
    if rule not in SELECT_RULES:
        raise ValueError(f"unknown Select rule {rule!r}; known: {', '.join(SELECT_RULES)}")
    parent = Decision(parent_hash, parent_accuracy, parent_hash, parent_accuracy, None, rule, "",
                      kept_mean_score=parent_mean_score, parent_mean_score=parent_mean_score)
    scored = [c for c in candidates if c.valid and c.accuracy is not None and c.hash is not None]
    if not scored:
        return replace(parent, why="no valid candidate: the parent is kept")
    # max() returns the first of equal maxima: candidates come in index order, so a tie on
    # accuracy goes to the earliest; sorting by index makes that hold for any order given.
    best = max(sorted(scored, key=lambda c: c.index), key=lambda c: c.accuracy or 0.0)
    assert best.accuracy is not None and best.hash is not None
    if rule == "ratchet" and best.accuracy <= parent_accuracy:
        return replace(parent, why=f"best candidate's accuracy {best.accuracy:.3f} is not above "
                                   f"the parent's {parent_accuracy:.3f}")  # fmt: skip
    why = f"candidate {best.index}: accuracy {best.accuracy:.3f} (parent {parent_accuracy:.3f})"
    return replace(parent, kept_hash=best.hash, kept_accuracy=best.accuracy, chosen=best.index,
                   why=why, kept_mean_score=best.mean_score)
