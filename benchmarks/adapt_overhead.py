"""The revision loop's own time, as a fraction of wall time, with instant model backends.

Runs `adapt` (rounds of feedback, G proposals, Apply, scoring, Select, then the held-out eval)
with a solver and a proposer that answer instantly, and splits the wall time into rollouts
(jailed harness runs, grading and ledger appends, inside `whale.evaluation.evaluate`), proposer
calls, and the rest: the loop's own work (reports, prompts, Apply, diffs, rewards, Select,
reading back trajectories, writing the run directory).

    python -m benchmarks.adapt_overhead [--rounds 3 --g 4 --dev 25 --eval 25]
Target (issue 4): the loop's own time < 5% of a round's wall time.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

from whale.harness import Runtime, load_harness
from whale.models.base import Completion
from whale.revise.loop import LoopSettings, adapt
from whale.revise.proposer import Proposer
from whale.runs import OutcomeStore
from whale.runs import ledger as store_module
from whale.tasks import SealedSplit, load_task

COUNTER = itertools.count()


class InstantSolver:
    name = "instant-solver"

    def chat(self, messages, sampling, timeout=None):  # noqa: ANN001
        return Completion("Answer: 1", "stop", {"completion_tokens": 2, "total_tokens": 9})


class InstantProposer:
    """Each proposal is a new, valid edit, so every candidate must be scored."""

    name = "instant-proposer"

    def chat(self, messages, sampling, timeout=None):  # noqa: ANN001
        n = next(COUNTER)
        text = (
            f"Try variant {n}.\n<<<<<<< SEARCH\ndef run(question, env):\n=======\n"
            f"VARIANT = {n}\n\n\ndef run(question, env):\n>>>>>>> REPLACE\n"
        )
        return Completion(text, "stop", {"completion_tokens": 30, "total_tokens": 900})


class RolloutClock:
    """Wall time spent inside `whale.evaluation.evaluate` (the jailed runs and their grading),
    measured by wrapping the function the store calls. Instrumentation only."""

    spent = 0.0

    def __init__(self) -> None:
        self.inner = store_module.evaluate

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        t = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - t


class TimedProposer(Proposer):
    spent = 0.0

    def propose(self, *args, **kwargs):  # noqa: ANN002, ANN003
        t = time.perf_counter()
        try:
            return super().propose(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--dev", type=int, default=25)
    ap.add_argument("--eval", type=int, default=25)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    task = load_task("rg:basic_arithmetic", size=args.dev + args.eval, seed=0)
    qs = task.questions()
    dev, held = qs[: args.dev], qs[args.dev :]
    with tempfile.TemporaryDirectory() as tmp:
        clock = RolloutClock()
        store_module.evaluate = clock  # type: ignore[assignment]
        store = OutcomeStore(Path(tmp))
        proposer = TimedProposer(InstantProposer())
        rt = Runtime(model=InstantSolver(), warm=2 * args.workers)
        settings = LoopSettings(rounds=args.rounds, g=args.g, workers=args.workers, feedback=8)
        t = time.perf_counter()
        result = adapt(task, load_harness("single_call"), dev, dev,
                       SealedSplit(held, Path(tmp) / "eval_read.json"), rt, proposer, store,
                       settings)  # fmt: skip
        wall = time.perf_counter() - t
        rt.close()
        store.close()
    store_module.evaluate = clock.inner  # type: ignore[assignment]
    own = wall - clock.spent - proposer.spent
    applicable = f"{result.applicable}/{result.proposals} applicable"
    print(
        f"rounds {args.rounds}, G {args.g}, dev {args.dev}, eval {args.eval}: "
        f"{store.rollouts} rollouts, {applicable}"
    )
    print(f"wall:                   {wall:8.2f} s")
    print(f"rollouts (jailed runs): {clock.spent:8.2f} s  ({clock.spent / wall:6.1%})")
    print(f"proposer calls:         {proposer.spent:8.2f} s  ({proposer.spent / wall:6.1%})")
    print(f"loop's own time:        {own:8.2f} s  ({own / wall:6.1%})   target < 5%")
    print(f"per round (own):        {own / args.rounds * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
