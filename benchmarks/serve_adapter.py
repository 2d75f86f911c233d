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
    adapter is on disk, `serve()` (convert to GGUF + server start + a one-token answer:
    "served", target < 1 s) plus the first real completion (target < 5 s), --steps times,
    with where the server's start went, read off its log (llama-server's own timestamps);
(c) with --starts K > 0: the server start with the adapter, whale's flags (`--fit off
    --no-warmup`, issue 25) against llama-server's defaults (a dry-run load to fit memory, a
    warm-up decode), K each, interleaved: spawn to answering, and the one-token reply after.

Why a restart at all: this llama-server loads LoRA files only at start (`--lora`); its
`/lora-adapters` endpoint and a request's `lora` field set the scales of adapters loaded then
(docs/models.md). The served model's name carries the adapter's digest either way.

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
from whale.models import native
from whale.models.base import ChatModel, Sampling
from whale.models.catalog import model_path
from whale.models.embedded import EmbeddedLlama
from whale.train.checkpoint import trainable_checkpoint
from whale.train.lora_gguf import adapter_to_gguf
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


# Lines of llama-server's log (timestamps on, verbosity 4) that open each phase of a start.
_PHASES = [
    ("exec", "llama_server: initializing"),
    ("http", "load_model: loading model"),
    ("metadata+vocab", "loaded meta data"),
    ("tensors", "load_tensors: loading model tensors"),
    ("lora", "loading lora adapter from"),
    ("context+KV", "llama_context: constructing"),
    ("first decode", "llama threadpool init"),
    ("slots", "load_model: initializing, n_slots"),
    ("listening", "listening on"),
]


def phases(log: str) -> dict[str, float]:
    """Seconds of each phase of a server start, from its log's timestamps ("M.SS.mmm.uuu"
    from the process start): a phase lasts until the next one that the log shows. What the
    "fit" dry run costs falls in "http" (the server loads the model once to fit it there)."""
    seen: list[tuple[str, float]] = []
    for line in log.splitlines():
        head = line.split(" ", 1)[0].split(".")
        if len(head) != 4 or not all(x.isdigit() for x in head):
            continue
        t = int(head[0]) * 60 + int(head[1]) + int(head[2]) / 1e3 + int(head[3]) / 1e6
        for name, marker in _PHASES:
            if marker in line and name not in (n for n, _ in seen):
                seen.append((name, t))
    out = {"before the log": seen[0][1]} if seen else {}
    for (name, t), (_, nxt) in zip(seen, seen[1:], strict=False):
        out[name] = round(nxt - t, 3)
    return out


def start_once(gguf: Path, lora: Path, threads: int, defaults: bool) -> tuple[float, float]:
    """One start of the server with `lora`: spawn to answering, then the one-token reply.
    `defaults`: llama-server's own start (its memory-fitting dry run and warm-up on)."""
    command = native.command

    def old(*a: object, **k: object) -> list[str]:
        cmd = command(*a, **k)  # type: ignore[arg-type]
        i = cmd.index("--fit")
        return cmd[:i] + [x for x in cmd[i + 2 :] if x != "--no-warmup"]

    m = EmbeddedLlama(gguf, alias="start", n_ctx=2048, threads=threads, lora=lora)
    native.command = old if defaults else command  # type: ignore[assignment]
    try:
        m.start()
        t = time.perf_counter()
        one(m, "Hi", Sampling(max_tokens=1, temperature=0.0))
        return m.ready_s or 0.0, time.perf_counter() - t
    finally:
        native.command = command  # type: ignore[assignment]
        m.close()


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
    ap.add_argument("--starts", type=int, default=0, help="(c): starts per arm")
    ap.add_argument("--skip-a", action="store_true", help="leave out (a), the decoding speeds")
    args = ap.parse_args()
    # llama-server's timestamps and loader lines in its log, for (b)'s phases
    os.environ.update(LLAMA_ARG_LOG_TIMESTAMPS="1", LLAMA_ARG_LOG_PREFIX="1",
                      LLAMA_ARG_LOG_VERBOSITY="4")  # fmt: skip
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
        tuned = serving.serve(adapter)
        print(f"serve(adapter): {serving.timings}")
        rate: dict[str, float] = {}
        rps: dict[str, float] = {}
        ratio = float("nan")
        if not args.skip_a:
            base.start()
            rate, rps, ratio = decoding(args, base, tuned, sampling, batch)
        base.close()

        print("\n(b) adapter saved -> first completion on the new weights")
        firsts, served = [], []
        for step in range(1, args.steps + 1):
            new = save_random_adapter(ck, work / f"step{step}", std=0.02, seed=step)
            t0 = time.perf_counter()  # the weight step is done: the adapter is on disk
            model = serving.serve(new)
            t_serve = time.perf_counter() - t0
            s, n = one(model, prompts(1)[0], sampling)
            total = time.perf_counter() - t0
            firsts.append(total)
            served.append(t_serve)
            tm = serving.timings
            path = getattr(model, "log_path", None)
            log = path.read_text(errors="replace") if path else ""
            print(f"step {step}: convert {tm['convert_s']:.2f} s + server answering "
                  f"{tm['ready_s']:.2f} s + one-token reply {tm['ping_s']:.2f} s = served "
                  f"{t_serve:.2f} s; first completion ({n} tokens) {s:.2f} s "
                  f"({n / s:.1f} tok/s); total {total:.2f} s")  # fmt: skip
            print(f"  server start, seconds per phase: {phases(log)}")
        print(f"median served {statistics.median(served):.2f} s (target < 1 s); median total "
              f"{statistics.median(firsts):.2f} s (target < 5 s)")  # fmt: skip
        if args.starts:
            print("\n(c) server start with the adapter: whale's flags against llama-server's")
            lora = adapter_to_gguf(adapter)
            got: dict[str, list[tuple[float, float]]] = {"whale": [], "defaults": []}
            for i in range(args.starts):
                for arm in ("whale", "defaults") if i % 2 == 0 else ("defaults", "whale"):
                    got[arm].append(start_once(gguf, lora, args.threads, arm == "defaults"))
                    r, p = got[arm][-1]
                    print(f"  {arm:>8}: answering after {r:.2f} s, one-token reply {p:.2f} s")
            for arm, v in got.items():
                print(f"{arm:>8}: median answering {statistics.median(r for r, _ in v):.2f} s, "
                      f"then one token {statistics.median(p for _, p in v):.2f} s")  # fmt: skip
        print(f"machine at end: {machine_load()}")
        print(json.dumps({"tok_s": rate, "rollouts_s": rps, "ratio": ratio,
                          "served_s": served, "first_completion_s": firsts}))  # fmt: skip
    finally:
        base.close()
        serving.close()
        shutil.rmtree(work, ignore_errors=True)


def decoding(
    args: argparse.Namespace, base: EmbeddedLlama, tuned: ChatModel, sampling: Sampling,
    batch: int,
) -> tuple[dict[str, float], dict[str, float], float]:  # fmt: skip
    """(a): the same prompts on the base and on the adapter, alternating."""
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
    rate = {k: v[1] / v[0] for k, v in stats.items()}
    rps = {k: v[2] / v[0] for k, v in stats.items()}
    print(f"\n(a) {args.rollouts} prompts each, greedy, max_tokens={args.max_tokens}, "
          f"threads={args.threads}, threads_batch={batch or 'all cores'}")  # fmt: skip
    print(f"{'':>8} {'tokens':>7} {'wall s':>7} {'tok/s':>7} {'rollouts/s':>11}")
    for k, v in stats.items():
        print(f"{k:>8} {v[1]:>7} {v[0]:>7.1f} {rate[k]:>7.1f} {rps[k]:>11.3f}")
    ratio = rate["adapter"] / rate["base"]
    print(f"adapter/base tokens/s ratio: {ratio:.2f} (target >= 0.8)")
    return rate, rps, ratio


if __name__ == "__main__":
    main()
