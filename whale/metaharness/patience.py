"""The harness phase's patience rule (WHALE, (J_min, P_h) = (6, 2)).

Stop when the archive's best search accuracy (the verifier's: fraction correct, the ranking of
`Archive`) has not set a new best for `p_h` iterations, once at least `j_min` iterations have
run. Any improvement, however small, is a new best. The accuracies are those of the search
split only, under the phase's solver: validation never drives the stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Patience:
    j_min: int = 6
    p_h: int = 2

    def __post_init__(self) -> None:
        if self.j_min < 0 or self.p_h < 1:
            raise ValueError(f"patience needs j_min >= 0 and p_h >= 1 (got {self})")

    def should_stop(self, best_after: Sequence[float], start: float) -> bool:
        """`best_after[i]` is the archive's best accuracy after iteration i + 1; `start` is
        the best before the phase's first iteration (its start harness, or an earlier
        candidate that beats it under the same solver)."""
        t = len(best_after)
        if t < self.j_min:
            return False
        best, last_gain = start, 0
        for i, b in enumerate(best_after, 1):
            if b > best:
                best, last_gain = b, i
        return t - last_gain >= self.p_h
