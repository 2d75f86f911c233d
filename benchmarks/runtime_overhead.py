"""Per-run cost of isolation and the broker.

Measured in one run, so the ratios hold on a noisy machine:
- bare: a `python -c pass` process start;
- isolated: a jailed run whose harness makes 10 model calls to an instant in-process backend;
- round trip: (a 210-call run - a 10-call run) / 200;
- worker RSS: the jailed worker's peak resident memory (ru_maxrss), read by the harness itself;
- grading (issue 8): one answer graded in process (an audited scorer, basic_arithmetic) and
  one graded in the grading jail (countdown, whose scorer runs sympy's parse_expr: the screen,
  the pickled request, a fork of the warm jailed grader and its reply), both medians; and the
  one-off start of a jailed grader (import reasoning_gym, build the dataset), paid once per
  dataset per process.

    python -m benchmarks.runtime_overhead [--runs 30]
Targets (issue 2): isolation adds <= 30 ms per run, a round trip <= 1 ms, worker RSS <= 80 MB.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from whale import grading
from whale.harness import Budget, Runtime
from whale.harness.sandbox import python_executable
from whale.models.base import Completion
from whale.tasks import load_task

CALLS = (
    "def run(q, env):\n"
    "    for i in range(int(q)):\n"
    "        env.llm('hi')\n"
    "    import resource\n"
    "    return str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
)


class Instant:
    name = "instant"

    def chat(self, messages, sampling, timeout=None):  # noqa: ANN001
        return Completion(
            "ok", "stop", {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        )


def median_s(fn, runs: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    py = python_executable()
    rt = Runtime(model=Instant(), budget=Budget(model_calls=1000))
    rt.run(CALLS, "1")  # warm the page cache
    bare = median_s(lambda: subprocess.run([py, "-c", "pass"], check=True), args.runs)
    bare_is = median_s(
        lambda: subprocess.run([py, "-I", "-S", "-c", "pass"], check=True), args.runs
    )
    iso = median_s(lambda: rt.run(CALLS, "10"), args.runs)
    many = median_s(lambda: rt.run(CALLS, "210"), max(5, args.runs // 3))
    t = rt.run(CALLS, "10")
    assert t.status == "ok", t.error
    rss_mb = int(t.answer) / 1024
    rtt_us = (many - iso) / 200 * 1e6
    print(f"sandbox: {t.sandbox}   runs: {args.runs}")
    print(f"bare `python -c pass`:           {bare * 1000:8.1f} ms (median)")
    print(f"bare `python -I -S -c pass`:     {bare_is * 1000:8.1f} ms (median; the worker's mode)")
    print(f"isolated run, 10 model calls:    {iso * 1000:8.1f} ms (median)")
    print(f"overhead (isolated - bare):      {(iso - bare) * 1000:8.1f} ms   target <= 30 ms")
    print(f"overhead vs `-I -S` start:       {(iso - bare_is) * 1000:8.1f} ms")
    print(f"ratio isolated / bare:           {iso / bare:8.2f}x")
    print(f"broker round trip per call:      {rtt_us:8.0f} us   target <= 1000 us")
    print(f"worker peak RSS:                 {rss_mb:8.1f} MB   target <= 80 MB")
    grading_lines(t.sandbox, args.runs)


def grading_lines(sandbox: str, runs: int) -> None:
    pure = load_task("rg:basic_arithmetic", size=20, seed=0)
    pq = pure.questions()[0]
    pa = str(pq.reference["answer"])
    jailed = load_task("rg:countdown", size=20, seed=0)
    jq = jailed.questions()[0]
    ja = str(jq.reference["answer"])
    grading.close_all()
    t = time.perf_counter()
    assert grading.grade(jailed, jq, ja, sandbox).correct  # starts the jailed grader
    start = time.perf_counter() - t
    in_proc = median_s(lambda: grading.grade(pure, pq, pa, sandbox), max(runs, 100))
    in_jail = median_s(lambda: grading.grade(jailed, jq, ja, sandbox), runs)
    grading.close_all()
    print(f"grade in process (audited):      {in_proc * 1e6:8.0f} us (median, basic_arithmetic)")
    print(f"grade in the jail:               {in_jail * 1000:8.1f} ms (median, countdown)")
    print(f"jailed grader start (once):      {start * 1000:8.0f} ms (per dataset per process)")


if __name__ == "__main__":
    main()
