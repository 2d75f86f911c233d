"""Concurrent calls on the embedded model: the native llama-server (parallel slots, continuous
batching) against llama-cpp-python's server (one request at a time), in one run.

    python -m benchmarks.embedded_concurrency [--rounds 2] [--max-tokens 128] [--threads 2]
                                              [--servers native,python]

On the real solver (Qwen2.5-Coder-0.5B Q4_K_M), both servers up side by side with the same
threads, n_ctx 1024 per call and 4 slots: at 1, 2 and 4 concurrent calls (threads of this
process through `EmbeddedLlama.chat`, as evaluate()'s workers call it), --rounds rounds of
that many distinct prompts that each ask for a long answer, greedy, up to --max-tokens tokens.
Prints completion tokens/s (all completion tokens of the level / its wall time) of each server
and the native/python ratio at each level; the target is >= 1.5x at 4. Then, per server, what
batching gains on this CPU: the wall time of 4 concurrent calls over that of one call alone
(4.00x: no gain, calls decoded one after the other; 1.00x: four for the price of one). It was
an assertion of tests/models/test_native_server.py (< 0.8 x 4), which failed on a 2-core AMD
EPYC (Zen 5): a speed figure of the CPU, so it is printed here, and the test checks only that
four concurrent calls are served on four slots with the replies they get alone. The two
servers take turns level by level, so that load from other jobs on the machine hits both
alike, and the load is printed before and after.

What it does not measure: prompt processing of long prompts (these are ~40 tokens), a LoRA
adapter (see benchmarks/serve_adapter.py), and more calls than slots.
"""

from __future__ import annotations

import argparse
import functools
import time
from concurrent.futures import ThreadPoolExecutor

from whale.models.base import Sampling
from whale.models.catalog import model_path
from whale.models.embedded import EmbeddedLlama

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up when piped

LEVELS = (1, 2, 4)
_TOPICS = [
    "the water cycle", "how a compiler works", "the history of the bicycle", "photosynthesis",
    "how hash tables work", "the rules of chess", "volcanoes", "how vaccines work",
    "the French revolution", "binary search trees", "the solar system", "how bread is made",
    "plate tectonics", "the TCP handshake", "the life of bees", "how a car engine works",
]  # fmt: skip


def prompts(n: int, offset: int) -> list[str]:
    return [
        f"Write a long, detailed essay about {_TOPICS[(offset + i) % len(_TOPICS)]}."
        for i in range(n)
    ]


def machine_load() -> str:
    text = f"loadavg {' '.join(open('/proc/loadavg').read().split()[:3])}"
    try:
        some = open("/proc/pressure/cpu").readline().split()
        text += f", cpu pressure {some[1]} {some[2]}"
    except OSError:
        pass
    return text


def level(model: EmbeddedLlama, n: int, rounds: int, sampling: Sampling) -> tuple[float, int]:
    """(wall seconds, completion tokens) of `rounds` rounds of `n` concurrent calls."""
    wall, tokens = 0.0, 0
    with ThreadPoolExecutor(n) as pool:
        for r in range(rounds):
            msgs = [[{"role": "user", "content": p}] for p in prompts(n, offset=r * n)]
            t = time.perf_counter()
            done = list(pool.map(lambda m: model.chat(m, sampling), msgs))
            wall += time.perf_counter() - t
            tokens += sum(int(c.usage.get("completion_tokens", 0)) for c in done)
    return wall, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="qwen-coder-0.5b")
    ap.add_argument("--servers", default="native,python", help="comma-separated: native, python")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    if not kinds or any(k not in ("native", "python") for k in kinds):
        ap.error("--servers: native, python or both")
    gguf = model_path(args.model)
    sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0)
    print(f"machine at start: {machine_load()}")
    servers = {
        kind: EmbeddedLlama(gguf, alias=kind, n_ctx=1024, threads=args.threads, timeout_s=600,
                            slots=max(LEVELS), server=kind)
        for kind in kinds
    }  # fmt: skip
    rates: dict[tuple[str, int], float] = {}
    walls: dict[tuple[str, int], float] = {}
    try:
        for kind, m in servers.items():
            t = time.perf_counter()
            m.start()
            m.chat([{"role": "user", "content": "Hi"}], Sampling(max_tokens=8))  # warm
            print(f"{kind}: ready and warm in {time.perf_counter() - t:.1f} s ({m.kind} server)")
        for n in LEVELS:
            for kind, m in servers.items():
                wall, tokens = level(m, n, args.rounds, sampling)
                rates[kind, n], walls[kind, n] = tokens / wall, wall
                print(f"  {kind:6s} {n} concurrent: {tokens} tokens in {wall:.1f} s")
    finally:
        for m in servers.values():
            m.close()
    print(f"machine at end: {machine_load()}")
    print(f"\n{args.model}, {args.max_tokens}-token completions, temperature 0, "
          f"{args.threads} threads, completion tokens/s:")  # fmt: skip
    print(f"{'concurrent':>10} " + " ".join(f"{k:>8}" for k in kinds)
          + (f" {'ratio':>6}" if len(kinds) == 2 else ""))  # fmt: skip
    for n in LEVELS:
        row = f"{n:>10} " + " ".join(f"{rates[k, n]:8.1f}" for k in kinds)
        if len(kinds) == 2:
            row += f" {rates['native', n] / rates['python', n]:6.2f}x"
        print(row)
    top = max(LEVELS)
    if len(kinds) == 2:
        ratio = rates["native", top] / rates["python", top]
        verdict = "meets" if ratio >= 1.5 else "misses"
        print(f"ratio at {top} concurrent: {ratio:.2f}x ({verdict} the 1.5x target)")
    # The same rounds at each level, each call up to --max-tokens: wall over wall.
    for k in kinds:
        print(f"{k}: {top} concurrent took {walls[k, top] / walls[k, 1]:.2f}x the wall time of "
              f"one alone ({top}.00x: no gain from batching)")  # fmt: skip


if __name__ == "__main__":
    main()
