"""Per-run cost of isolation and the broker.

Measured in one run, so the ratios hold on a noisy machine:
- bare: a `python -c pass` process start;
- isolated: a jailed run whose harness makes 10 model calls to an instant in-process backend;
- round trip: (a 210-call run - a 10-call run) / 200;
- worker RSS: the jailed worker's peak resident memory (ru_maxrss), read by the harness itself.

    python -m benchmarks.runtime_overhead [--runs 30]
Targets (issue 2): isolation adds <= 30 ms per run, a round trip <= 1 ms, worker RSS <= 80 MB.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from whale.harness import Budget, Runtime
from whale.harness.sandbox import python_executable
from whale.models.base import Completion

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


if __name__ == "__main__":
    main()
