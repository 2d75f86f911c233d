"""The weight phase's patience rule (WHALE, W = T_min = P_w = 0.2 epoch).

The phase ends when the verifier reward averaged over the most recent window of W epochs has
not set a new best for P_w epochs, once at least T_min epochs have run. Any improvement, however
small, is a new best. The reward is that of the weight phase's own samples (the training
signal): validation never drives the stop (the rule is handed nothing else).

Each step's reward is placed at the epoch where the step ends, and so is "now": the earliest end
is one step after P_w, since the first step sets the first best. With the default step of 0.05
epoch that is 0.25 epoch (0.24 where the pool rounds a step to 0.04, e.g. 2 prompts of 50); with
a step as long as W (0.2) it was 0.4. Placing a reward at its step's start (the weights that
drew the samples) moves both ends alike and ends no sooner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EPS = 1e-9  # epoch positions are sums of fractions: compare with a tolerance


@dataclass(frozen=True)
class WeightPatience:
    window: float = 0.2  # W, epochs
    t_min: float = 0.2  # T_min, epochs
    p_w: float = 0.2  # P_w, epochs

    def __post_init__(self) -> None:
        if not (self.window > 0 and self.t_min >= 0 and self.p_w > 0):
            raise ValueError(f"weight patience needs W > 0, T_min >= 0, P_w > 0 (got {self})")

    def window_rewards(self, steps: Sequence[tuple[float, float, int]]) -> list[float]:
        """`steps[i]` = (epochs done after step i, in this phase; mean reward of its samples;
        its number of samples). The reward over the window ending at each step: the sample-
        weighted mean over the steps whose end lies within the last W epochs."""
        out = []
        for i, (end, _, _) in enumerate(steps):
            inside = [s for s in steps[: i + 1] if s[0] > end - self.window + EPS]
            n = sum(s[2] for s in inside)
            out.append(sum(s[1] * s[2] for s in inside) / n if n else 0.0)
        return out

    def should_stop(self, steps: Sequence[tuple[float, float, int]]) -> bool:
        if not steps:
            return False
        now = steps[-1][0]
        if now + EPS < self.t_min:
            return False
        best, best_at = float("-inf"), 0.0
        for (end, _, _), r in zip(steps, self.window_rewards(steps), strict=True):
            if r > best:
                best, best_at = r, end
        return now - best_at + EPS >= self.p_w
