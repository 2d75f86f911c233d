"""The run directory of `whale adapt`, and the outcome store that makes resume free.

Every rollout is appended, as it finishes, to `outcomes.jsonl` (the rollout ledger), keyed by
(harness hash, question id), with its trajectory in `trajectories/<hash>.jsonl`. Any later
request for the same pair is answered from the store, so identical candidates are scored once
and a killed run, resumed, pays for nothing twice. Proposals are stored per round for the same
reason.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from whale.evaluate import EvalResult, JsonlWriter, Outcome, evaluate, read_jsonl
from whale.harness import Runtime, Trajectory, harness_hash
from whale.tasks import Question, Task


class OutcomeStore:
    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "harnesses").mkdir(exist_ok=True)
        (self.dir / "trajectories").mkdir(exist_ok=True)
        self._outcomes: dict[tuple[str, str], Outcome] = {}
        for r in read_jsonl(self.dir / "outcomes.jsonl"):
            h, split = r.pop("harness"), r.pop("split", None)
            del split
            self._outcomes[(h, r["question_id"])] = Outcome(**r)
        self._ledger = JsonlWriter(self.dir / "outcomes.jsonl")
        self.new_rollouts = 0
        self._trajs: dict[str, dict[str, Trajectory]] = {}

    @property
    def rollouts(self) -> int:
        return len(self._outcomes)

    def save_harness(self, source: str) -> str:
        h = harness_hash(source)
        path = self.dir / "harnesses" / f"{h}.py"
        if not path.exists():
            path.write_text(source)
        return h

    def harness(self, h: str) -> str:
        return (self.dir / "harnesses" / f"{h}.py").read_text()

    def trajectories(self, h: str) -> dict[str, Trajectory]:
        """Trajectories of harness `h` by question id: read from disk once, then kept current
        as new runs finish (the parent harness is asked for every round)."""
        if h not in self._trajs:
            rows = read_jsonl(self.dir / "trajectories" / f"{h}.jsonl")
            self._trajs[h] = {r["question_id"]: Trajectory.from_dict(r) for r in rows}
        return self._trajs[h]

    def evaluate(
        self,
        runtime: Runtime,
        source: str,
        task: Task,
        questions: Sequence[Question],
        split: str,
        workers: int,
        on_done: Callable[[], None] | None = None,
    ) -> EvalResult:
        """Outcomes of `source` on `questions`, running only the pairs not yet in the store."""
        h = self.save_harness(source)
        missing = [q for q in questions if (h, q.id) not in self._outcomes]
        if missing:
            traj_f = JsonlWriter(self.dir / "trajectories" / f"{h}.jsonl")

            known = self.trajectories(h)

            def done(o: Outcome, t: Trajectory) -> None:
                traj_f.write(t.to_dict())  # trajectory first: an outcome implies its trajectory
                known[o.question_id] = t
                self._ledger.write({"harness": h, "split": split, **asdict(o)})
                self._outcomes[(h, o.question_id)] = o
                self.new_rollouts += 1
                if on_done is not None:
                    on_done()

            try:
                evaluate(runtime, source, task, missing, workers, on_done=done)
            finally:
                traj_f.close()
        trajs = self.trajectories(h)
        outcomes = [self._outcomes[(h, q.id)] for q in questions]
        return EvalResult(outcomes, [trajs[q.id] for q in questions])

    def close(self) -> None:
        self._ledger.close()


class RoundDir:
    """round_NN/: report, prompt, proposals, candidates with diffs, decision."""

    def __init__(self, run_dir: Path, t: int) -> None:
        self.path = run_dir / f"round_{t:02d}"
        self.path.mkdir(parents=True, exist_ok=True)

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text, encoding="utf-8")

    def write_json(self, name: str, obj: Any) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False), encoding="utf-8")
        tmp.replace(self.path / name)  # atomic: a killed write leaves the old file or none

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text(encoding="utf-8"))


def diff(parent: str, child: str) -> str:
    return "".join(
        difflib.unified_diff(
            parent.splitlines(keepends=True),
            child.splitlines(keepends=True),
            "parent.py",
            "candidate.py",
        )
    )
