"""What a call of the public API returns (`whale.api`): the run directory, the final harness,
the held-out readings and the records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale.stats import wilson_ci


@dataclass(frozen=True)
class Reading:
    """A reading of a harness on a split: `correct` of `n` questions (the task's verifier)."""

    correct: int
    n: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @classmethod
    def of(cls, accuracy: float, n: int) -> Reading:
        """From a recorded accuracy over n questions (a count, so rounding recovers it)."""
        return cls(round(accuracy * n), n)

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% Wilson interval of the accuracy (`whale.stats.wilson_ci`); (0, 1) when
        nothing was read."""
        return wilson_ci(self.correct, self.n) if self.n else (0.0, 1.0)

    def __str__(self) -> str:
        lo, hi = self.interval
        return f"{self.correct}/{self.n} ({self.accuracy:.3f}, 95% CI {lo:.2f}-{hi:.2f})"


@dataclass(frozen=True)
class Run:
    """What a call returns: its run directory (resume it with `resume=run.run_dir`), the
    final harness's source (None where a run has none: cotrain's schedules each keep theirs,
    train-proposer trains a model), the held-out readings by name ("seed" and "final" for
    adapt and search; "harness" for evaluate; "base" and one per schedule for cotrain and
    rsft), the summary the command wrote (summary.json), and the outcomes behind the final
    reading where the call has them in hand."""

    kind: str
    run_dir: Path
    harness: str | None
    held_out: dict[str, Reading]
    records: dict[str, Any]
    outcomes: list[Any] = field(default_factory=list)
