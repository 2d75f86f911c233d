"""The search's own time, as a fraction of wall time, at 100 archived candidates.

Fills an archive with 100 scored candidates (each with its outcomes and trajectories on the
search split), then runs `search` with a solver and an agent model that answer instantly. The
agent makes the usual read-only calls (top, list, read, failures, grep, diff) and then submits a
new valid edit, so every candidate is scored. Wall time splits into rollouts (jailed runs,
grading, ledger appends, inside `whale.evaluation.evaluate`), agent model calls, and the rest:
the search's own time (archive reads and writes, agent tool calls, Apply, sessions on disk).

    python -m benchmarks.search_overhead [--iterations 3 --m 2 --search 25 --archived 100]
Target (issue 9): the search's own time < 5% of wall time at 100 archived candidates.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

from benchmarks.adapt_overhead import InstantSolver, RolloutClock
from whale.harness import Runtime, harness_hash, load_harness
from whale.metaharness import Archive, ArchiveTools, CandidateMeta
from whale.metaharness.agent import ProposerAgent
from whale.metaharness.loop import SearchSettings, search
from whale.models.base import Completion
from whale.runs import OutcomeStore
from whale.runs import ledger as store_module
from whale.tasks import load_task

COUNTER = itertools.count()
SCRIPT = [
    'CALL top {"k": 5}',
    'CALL list {"path": "."}',
    'CALL read {"path": "c0000/harness.py"}',
    'CALL failures {"id": "c0000", "n": 3}',
    'CALL grep {"pattern": "env.llm"}',
    'CALL diff {"a": "c0000", "b": "c0001"}',
]


class InstantAgent:
    """Six read-only calls, then a submit of a new valid edit of the seed."""

    name = "instant-agent"

    def __init__(self) -> None:
        self.spent = 0.0

    def chat(self, messages, sampling, timeout=None):  # noqa: ANN001
        t = time.perf_counter()
        step = sum(m["role"] == "assistant" for m in messages)
        if step < len(SCRIPT):
            text = SCRIPT[step]
        else:
            n = next(COUNTER)
            text = (f'CALL submit {{"base": "c0000", "hypothesis": "variant {n}"}}\n'
                    "<<<<<<< SEARCH\ndef run(question, env):\n=======\n"
                    f"VARIANT = {n}\n\n\ndef run(question, env):\n>>>>>>> REPLACE\n")  # fmt: skip
        self.spent += time.perf_counter() - t
        return Completion(text, "stop", {"completion_tokens": 20, "total_tokens": 900})


def fill(archive: Archive, seed: str, store: OutcomeStore, runtime: Runtime, task, qs,  # noqa: ANN001
         n: int, workers: int) -> None:  # fmt: skip
    """n archived candidates with real outcomes and trajectories (scored once, then copied)."""
    ev = store.evaluate(runtime, seed, task, qs, "search", workers)
    outcomes = [o.__dict__ for o in ev.outcomes]
    for i in range(n):
        src = seed if i == 0 else f"FILLER = {i}\n\n\n{seed}"
        meta = CandidateMeta(f"c{i:04d}", None, 0, f"filler {i}", harness_hash(src), True,
                             score=ev.score, accuracy=ev.accuracy, rho_run=ev.rho_run,
                             n_scored=ev.n)  # fmt: skip
        archive.add(meta, src, outcomes, ev.trajectories)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--m", type=int, default=2)
    ap.add_argument("--search", type=int, default=25)
    ap.add_argument("--archived", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    task = load_task("rg:basic_arithmetic", size=args.search, seed=0)
    qs = task.questions()
    seed = load_harness("single_call")
    with tempfile.TemporaryDirectory() as tmp:
        store = OutcomeStore(Path(tmp))
        rt = Runtime(model=InstantSolver(), warm=2 * args.workers)
        archive = Archive(Path(tmp) / "archive", [q.id for q in qs])
        fill(archive, seed, store, rt, task, qs, args.archived, args.workers)
        clock = RolloutClock()
        store_module.evaluate = clock  # type: ignore[assignment]
        agent_model = InstantAgent()
        agent = ProposerAgent(agent_model, ArchiveTools(archive, task.description))
        settings = SearchSettings(iterations=args.iterations, m=args.m, workers=args.workers)
        t = time.perf_counter()
        result = search(task, seed, qs, rt, agent, store, archive, settings)
        wall = time.perf_counter() - t
        rt.close()
        store.close()
        store_module.evaluate = clock.inner  # type: ignore[assignment]
    own = wall - clock.spent - agent_model.spent
    valid = sum(r.valid for r in result.iterations)
    calls = sum(r.tool_calls for r in result.iterations)
    print(f"archived before: {args.archived}; iterations {args.iterations}, M {args.m}, "
          f"search split {args.search}: {valid} valid candidates, {calls} agent calls")  # fmt: skip
    print(f"wall:                   {wall:8.2f} s")
    print(f"rollouts (jailed runs): {clock.spent:8.2f} s  ({clock.spent / wall:6.1%})")
    print(f"agent model calls:      {agent_model.spent:8.2f} s  ({agent_model.spent / wall:6.1%})")
    print(f"search's own time:      {own:8.2f} s  ({own / wall:6.1%})   target < 5%")
    per = own / max(1, args.iterations * args.m) * 1000
    print(f"per candidate (own):    {per:8.1f} ms")


if __name__ == "__main__":
    main()
