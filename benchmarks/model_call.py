"""CPU time of one chat call in whale's process: `OpenAICompatible.chat` (one httpx client, the
reply read as plain data) against the same request through the `openai` SDK, as whale made it
before issue 25, on a server on 127.0.0.1 that answers at once (its own process, not counted).
Interleaved batches, medians.

    python -m benchmarks.model_call [--batches 6] [--per-batch 300]

Every rollout pays this once per model call, in the one process that also runs the broker and
the grading of every worker (benchmarks/eval_throughput.py).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import openai

from tests.servers import serve_in_subprocess
from whale.models import OpenAICompatible, Sampling

MESSAGES = [
    {"role": "system",
     "content": "Solve the problem. End your reply with a line 'Answer: <answer>'."},
    {"role": "user", "content": "What is 3 + 4 * 2? " * 5},
]


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def batch(call: Callable[[], object], n: int) -> tuple[float, float]:
    c, t = cpu_s(), time.perf_counter()
    for _ in range(n):
        call()
    return (cpu_s() - c) / n * 1e3, (time.perf_counter() - t) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--per-batch", type=int, default=300)
    args = ap.parse_args()
    server, url = serve_in_subprocess("Answer: 11", 0.0)
    try:
        whale = OpenAICompatible("stub", url)
        sampling = Sampling(max_tokens=256, temperature=0.0, seed=3)
        sdk = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120.0)
        body = whale._body(MESSAGES, sampling, {})  # the very request whale sends

        def through_sdk() -> str:
            r = sdk.chat.completions.create(**body, timeout=120.0)
            return r.choices[0].message.content or ""

        arms: dict[str, Callable[[], object]] = {
            "whale": lambda: whale.chat(MESSAGES, sampling).text,
            "openai SDK": through_sdk,
        }
        assert whale.chat(MESSAGES, sampling).text == through_sdk() == "Answer: 11"
        got: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
        for a in arms:  # warm: connections, imports, the SDK's lazy resources
            batch(arms[a], 20)
        for i in range(args.batches):
            for a in list(arms) if i % 2 == 0 else list(arms)[::-1]:
                got[a].append(batch(arms[a], args.per_batch))
        print(f"{args.batches} batches of {args.per_batch} calls per arm")
        print(f"{'arm':>12}  CPU ms per call (median, quartiles)  wall ms per call")
        med = {}
        for a, rs in got.items():
            q = statistics.quantiles([r[0] for r in rs], n=4)
            med[a] = q[1]
            wall = statistics.median(r[1] for r in rs)
            print(f"{a:>12}  {q[1]:6.3f} ({q[0]:.3f}-{q[2]:.3f})  {wall:8.3f}")
        print(f"openai SDK / whale, CPU per call: {med['openai SDK'] / med['whale']:.2f}x "
              f"({med['openai SDK'] - med['whale']:.3f} ms less per call)")  # fmt: skip
        whale.close()
        sdk.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
