"""Serving a freshly trained LoRA adapter with llama.cpp: decoding speed against the base, and
the time from a finished weight step to the first completion on the new weights.

    python -m benchmarks.serve_adapter [--rollouts 12] [--max-tokens 96] [--threads 2]

On the real solver (Qwen2.5-Coder-0.5B Q4_K_M): builds (or reuses) its trainable checkpoint,
makes a PEFT adapter of it (r = 32 on all seven projections, lora_B random N(0, 0.02): small
enough that replies stay fluent, large enough to change them), then

(a) runs the same N short prompts, greedy, up to --max-tokens tokens, on the base
    (`EmbeddedLlama`) and on `EmbeddedServing.serve(adapter)`, alternating prompt by prompt so
    that load from other jobs on the machine hits both alike; prints completion tokens/s and
    rollouts/s of each and the adapter/base ratio (target >= 0.8);
(b) saves new adapters (other seeds: "the next weight step") and measures, from the moment the
    adapter is on disk, `serve()` (convert to GGUF + server start + a one-token answer) plus
    the first real completion (target < 5 s), --steps times.

Prompt processing: llama-cpp-python's server runs it on all cores (`n_threads_batch`) whatever
`--n_threads` says, and on this shared 2-core machine a second OpenMP thread waits a scheduler
slice at every graph node when the other core is busy: measured, 17 prompt tokens took 8.7 s
with the adapter (1,614 graph nodes) against 0.31 s with one batch thread. So the servers here
get `N_THREADS_BATCH` = --threads through the environment (llama_cpp.server reads its settings
from it); `--threads-batch 0` measures the default.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tests.train.test_lora_gguf import save_random_adapter
from whale.models.base import ChatModel, Sampling
from whale.models.catalog import model_path
from whale.models.embedded import EmbeddedLlama
from whale.train.checkpoint import trainable_checkpoint
from whale.train.serving import EmbeddedServing

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up when piped

_TOPICS = [
    "reverses a string", "checks whether a number is prime", "sums a list",
    "counts vowels in a word", "returns the largest of three numbers", "computes a factorial",
    "removes duplicates from a list", "converts Celsius to Fahrenheit",
]  # fmt: skip


def prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(f"Write a short Python function that {_TOPICS[(i // 2) % len(_TOPICS)]}.")
        else:
            a, b = 17 + 7 * i, 5 + 3 * i
            out.append(f"What is {a} * {b}? Show the steps briefly.")
    return out


def one(model: ChatModel, prompt: str, sampling: Sampling) -> tuple[float, int]:
    t = time.perf_counter()
    c = model.chat([{"role": "user", "content": prompt}], sampling)
    return time.perf_counter() - t, int(c.usage.get("completion_tokens", 0))


def machine_load() -> str:
    """Load average and CPU pressure: the machine is shared, and numbers mean little without."""
    text = f"loadavg {' '.join(open('/proc/loadavg').read().split()[:3])}"
    try:
        some = open("/proc/pressure/cpu").readline().split()
        text += f", cpu pressure {some[1]} {some[2]}"
    except OSError:
        pass
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--threads-batch", type=int, default=None,
        help="prompt-processing threads of the servers (default: --threads; 0: llama-cpp-python's "
        "default, all cores)",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, default=3, help="weight steps timed in (b)")
    ap.add_argument("--model", default="qwen-coder-0.5b")
    args = ap.parse_args()
    batch = args.threads if args.threads_batch is None else args.threads_batch
    if batch:  # llama_cpp.server reads its settings from the environment (EmbeddedLlama: no flag)
        os.environ["N_THREADS_BATCH"] = str(batch)
    gguf = model_path(args.model)
    sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0)
    work = Path(tempfile.mkdtemp(prefix="whale-serve-adapter-"))
    print(f"machine at start: {machine_load()}")
    ck = trainable_checkpoint(args.model)
    t = time.perf_counter()
    adapter = save_random_adapter(ck, work / "step0", std=0.02, seed=0)
    print(f"adapter (r=32, all projections) made and saved in {time.perf_counter() - t:.1f} s")

    base = EmbeddedLlama(gguf, alias="base", n_ctx=2048, threads=args.threads, timeout_s=600)
    serving = EmbeddedServing(gguf, "tuned", n_ctx=2048, threads=args.threads, timeout_s=600)
    try:
        base.start()
        tuned = serving.serve(adapter)
        print(f"serve(adapter): {serving.timings}")
        for m in (base, tuned):  # warm both (first-request costs are not decoding speed)
            one(m, "Hi", Sampling(max_tokens=8, temperature=0.0))
        stats = {"base": [0.0, 0, 0], "adapter": [0.0, 0, 0]}  # seconds, tokens, rollouts
        for i, p in enumerate(prompts(args.rollouts)):
            row = []
            for label, m in (("base", base), ("adapter", tuned)):
                s, n = one(m, p, sampling)
                stats[label][0] += s
                stats[label][1] += n
                stats[label][2] += 1
                row.append(f"{label} {n} tok in {s:.1f} s")
            print(f"  prompt {i + 1}: " + ", ".join(row), flush=True)
        base.close()
        rate = {k: v[1] / v[0] for k, v in stats.items()}
        rps = {k: v[2] / v[0] for k, v in stats.items()}
        print(f"\n(a) {args.rollouts} prompts each, greedy, max_tokens={args.max_tokens}, "
              f"threads={args.threads}, threads_batch={batch or 'all cores'}")  # fmt: skip
        print(f"{'':>8} {'tokens':>7} {'wall s':>7} {'tok/s':>7} {'rollouts/s':>11}")
        for k, v in stats.items():
            print(f"{k:>8} {v[1]:>7} {v[0]:>7.1f} {rate[k]:>7.1f} {rps[k]:>11.3f}")
        ratio = rate["adapter"] / rate["base"]
        print(f"adapter/base tokens/s ratio: {ratio:.2f} (target >= 0.8)")

        print("\n(b) adapter saved -> first completion on the new weights")
        firsts = []
        for step in range(1, args.steps + 1):
            new = save_random_adapter(ck, work / f"step{step}", std=0.02, seed=step)
            t0 = time.perf_counter()  # the weight step is done: the adapter is on disk
            model = serving.serve(new)
            t_serve = time.perf_counter() - t0
            s, n = one(model, prompts(1)[0], sampling)
            total = time.perf_counter() - t0
            firsts.append(total)
            tm = serving.timings
            print(f"step {step}: convert {tm['convert_s']:.2f} s + server start and first "
                  f"answer {tm['start_s']:.2f} s = serve {t_serve:.2f} s; first completion "
                  f"({n} tokens) {s:.2f} s; total {total:.2f} s")  # fmt: skip
        print(f"median total {statistics.median(firsts):.2f} s (target < 5 s)")
        print(f"machine at end: {machine_load()}")
        print(json.dumps({"tok_s": rate, "rollouts_s": rps, "ratio": ratio,
                          "first_completion_s": firsts}))  # fmt: skip
    finally:
        base.close()
        serving.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
