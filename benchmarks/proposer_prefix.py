"""Prompt prefixes reused (issue 25): one round of G proposals with the prompt processed once
against G times, and whether reusing a prefix changes the solver's greedy replies.

    python -m benchmarks.proposer_prefix [--proposer qwen-coder-1.5b] [--g 4] [--pairs 2]
    python -m benchmarks.proposer_prefix --solver-eval [-n 40] [--workers 4]

Proposals (the default): the real x_t prompt whale sends. A seed harness (`--harness`,
default `interpreter_loop`) runs on `--feedback` questions of `--task` with the embedded
solver (the response cache on: this part is set-up, not measured), `revise.report` builds
the report and `Proposer.prompt` the prompt, as `whale adapt` does in a round. Then, on one
native llama-server of the proposer (4 slots), `--pairs` pairs of rounds of `Proposer.propose`
(G proposals, the default template, grammar and temperature), the two arms interleaved:
"separate" (`prefix_cache = "off"`: G requests, each prompt processed on its own: whale
before issue 25) and "shared" (`"sampled"`, the default: one request with `n` = G, the prompt
processed once and its KV cache copied). Both arms of a pair use the same seeds; before each
round each slot is given an unrelated prompt, so that no round finds its prompt cached by an
earlier one (each round prints the prompt tokens the server evaluated, from its log: 4 × the
prompt for "separate", 1 × for "shared"). Prints the wall time and the server's CPU time of
each round, the ratios separate/shared (target >= 1.5) and how many of the G proposals are the
same text in both arms (sampled with the same seeds: batching's low bits may change them). A
round's wall time is mostly its longest proposal's decoding, which differs between the arms as
their samples do; `--max-tokens 1` times the prompt's evaluation alone.

Solver (`--solver-eval`): `whale.evaluate` of `-n` questions of `--task` with `single_call`
(one system prompt shared by every question) on the embedded solver, greedy, no response
cache, three times on one server: `prefix_cache = "sampled"` (greedy calls reuse nothing: the
default), `"all"` (greedy calls reuse the cached prefix), and `"sampled"` again (the control:
what batching alone changes). Prints, per arm, wall time and the replies that differ from the
first arm's.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import re
import statistics
import string
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from whale.evaluation import evaluate
from whale.harness import Runtime, load_harness
from whale.models import CachedModel, EmbeddedLlama, Sampling
from whale.models.catalog import model_path
from whale.revise.proposer import Proposer, ProposerConfig, task_tools
from whale.revise.report import build_report
from whale.tasks import load_task

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows up when piped


def machine_load() -> str:
    text = f"loadavg {' '.join(open('/proc/loadavg').read().split()[:3])}"
    try:
        some = open("/proc/pressure/cpu").readline().split()
        text += f", cpu pressure {some[1]} {some[2]}"
    except OSError:
        pass
    return text


def build_prompt(args: argparse.Namespace, proposer: Proposer) -> tuple[str, str]:
    """The round's prompt and the harness it edits, as `whale adapt` builds them."""
    task = load_task(args.task, seed=0)
    qs = task.questions()[: args.feedback]
    source = load_harness(args.harness)
    solver = EmbeddedLlama(model_path(args.solver), alias=args.solver, n_ctx=4096,
                           threads=args.threads)  # fmt: skip
    cached = CachedModel(solver, args.cache)
    runtime = Runtime(model=cached)
    try:
        fb = evaluate(runtime, source, task, qs, workers=4)
    finally:
        runtime.close()
        cached.close()
    report = build_report(task, qs, fb.outcomes, fb.trajectories)
    prompt = proposer.prompt(task.description, source, report, runtime.budget,
                             task_tools(task, runtime), runtime.package_names())  # fmt: skip
    return prompt, source


def cpu_s(model: EmbeddedLlama) -> float:
    """CPU seconds the model's server process has used (user + system): the work a round
    costs, which a busy machine's scheduling does not inflate as it does wall time (the
    server's threads sleep while they wait: `--poll 0`)."""
    proc = model._proc
    if proc is None:
        return 0.0
    with open(f"/proc/{proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def flush(model: EmbeddedLlama, slots: int, rng: random.Random) -> None:
    """Put an unrelated prompt in every slot (llama-server's `id_slot` names the slot: left
    to choose, short requests share slots by similarity and leave the round's prompt cached
    in others, which a later round then reuses)."""
    client = model.start()

    def one(i: int) -> None:
        words = " ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(40))
        body = {"messages": [{"role": "user", "content": words}], "max_tokens": 1,
                "id_slot": i, "cache_prompt": False}  # fmt: skip
        httpx.post(f"{client.base_url}/chat/completions", json=body, timeout=600).raise_for_status()

    with ThreadPoolExecutor(slots) as pool:
        list(pool.map(one, range(slots)))


def evaluated(log: str) -> int:
    """Prompt tokens the server evaluated in `log` (a part of its log), its requests' own:
    a request with `n` copies its first sample's KV to the others, which log the first's."""
    children = set(re.findall(r"task (\d+) \| processing task, is_child = 1", log))
    evals = re.findall(r"task (\d+) \| prompt eval time = +[\d.]+ ms / +(\d+) tokens", log)
    return sum(int(n) for task, n in evals if task not in children)


def proposals(args: argparse.Namespace) -> None:
    cfg = ProposerConfig(max_tokens=args.max_tokens)
    gguf = model_path(args.proposer)
    model = EmbeddedLlama(gguf, alias=args.proposer, n_ctx=args.n_ctx, threads=args.threads,
                          slots=4, timeout_s=3600)  # fmt: skip
    proposer = Proposer(model, cfg)
    print(f"machine at start: {machine_load()}")
    t = time.perf_counter()
    prompt, parent = build_prompt(args, proposer)
    print(f"prompt built in {time.perf_counter() - t:.1f} s: {len(prompt)} characters")
    try:
        c = model.chat([{"role": "user", "content": prompt}], Sampling(max_tokens=1))
        tokens = c.usage.get("prompt_tokens", 0)
        print(f"proposer {args.proposer}, prompt {tokens} tokens (chat template included); "
              f"G = {args.g}, max_tokens {cfg.max_tokens}, temperature {cfg.temperature}, "
              f"threads {args.threads}")  # fmt: skip
        rng = random.Random(0)
        times: dict[str, list[float]] = {"separate": [], "shared": []}
        cpu: dict[str, list[float]] = {"separate": [], "shared": []}
        same = 0
        for pair in range(args.pairs):
            seed = 1000 * (pair + 1)
            texts = {}
            order = ("separate", "shared") if pair % 2 == 0 else ("shared", "separate")
            for arm in order:
                model.prefix_cache = "off" if arm == "separate" else "sampled"
                flush(model, model.slots, rng)
                assert model.log_path is not None
                mark = model.log_path.stat().st_size
                c0, t0 = cpu_s(model), time.perf_counter()
                out = proposer.propose(prompt, args.g, seed, parent)
                wall = time.perf_counter() - t0
                times[arm].append(wall)
                cpu[arm].append(cpu_s(model) - c0)
                with open(model.log_path, errors="replace") as f:
                    f.seek(mark)
                    n_eval = evaluated(f.read())
                texts[arm] = [p.text for p in out]
                errors = sum(p.error is not None for p in out)
                print(f"pair {pair + 1} {arm:>8}: {wall:7.1f} s wall, {cpu[arm][-1]:7.1f} s "
                      f"server CPU, prompt tokens evaluated {n_eval}, tokens "
                      f"{[p.tokens for p in out]}, errors {errors}; {machine_load()}")  # fmt: skip
            n_same = sum(a == b for a, b in zip(texts["separate"], texts["shared"], strict=True))
            same += n_same
            print(f"pair {pair + 1}: {n_same}/{args.g} proposals the same text in both arms; "
                  f"ratio {times['separate'][-1] / times['shared'][-1]:.2f}")  # fmt: skip
        sep, sh = statistics.median(times["separate"]), statistics.median(times["shared"])
        csep, csh = statistics.median(cpu["separate"]), statistics.median(cpu["shared"])
        print(f"\nmedian round: separate {sep:.1f} s, shared {sh:.1f} s: ratio {sep / sh:.2f} "
              f"(target >= 1.5); server CPU {csep:.1f} s against {csh:.1f} s: ratio "
              f"{csep / csh:.2f}; same text {same}/{args.g * args.pairs}")  # fmt: skip
        print(f"machine at end: {machine_load()}")
    finally:
        model.close()


def solver_eval(args: argparse.Namespace) -> None:
    task = load_task(args.task, seed=0)
    qs = task.questions()[: args.n]
    source = load_harness("single_call")
    model = EmbeddedLlama(model_path(args.solver), alias=args.solver, n_ctx=4096,
                          threads=args.threads, slots=4)  # fmt: skip
    print(f"machine at start: {machine_load()}")
    arms = [("sampled", "default: greedy calls reuse nothing"),
            ("all", "greedy calls reuse the prefix"),
            ("sampled", "control: the default again")]  # fmt: skip
    replies: list[list[list[str]]] = []
    try:
        for policy, what in arms:
            model.prefix_cache = policy
            runtime = Runtime(model=model)
            t0 = time.perf_counter()
            res = evaluate(runtime, source, task, qs, workers=args.workers)
            wall = time.perf_counter() - t0
            runtime.close()
            got = [[c.text for c in t.model_calls()] for t in res.trajectories]
            replies.append(got)
            differ = sum(a != b for a, b in zip(replies[0], got, strict=True))
            print(f"{policy:>8} ({what}): {wall:6.1f} s, accuracy {res.accuracy:.3f}, "
                  f"replies differing from the first arm: {differ}/{len(qs)}")  # fmt: skip
        print(f"machine at end: {machine_load()}")
    finally:
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--solver-eval", action="store_true", help="the solver's greedy replies")
    ap.add_argument("--proposer", default="qwen-coder-1.5b")
    ap.add_argument("--solver", default="qwen-coder-0.5b")
    ap.add_argument("--task", default="rg:maze")
    ap.add_argument("--harness", default="interpreter_loop", help="the harness the round edits")
    ap.add_argument("--feedback", type=int, default=8, help="questions of the report")
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=2, help="rounds per arm, interleaved")
    ap.add_argument("--max-tokens", type=int, default=ProposerConfig().max_tokens,
                    help="per proposal (1: the prompt's evaluation alone)")  # fmt: skip
    ap.add_argument("--n-ctx", type=int, default=4096, help="tokens per slot of the proposer")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=40, help="questions of --solver-eval")
    ap.add_argument("--workers", type=int, default=4, help="runs at once in --solver-eval")
    ap.add_argument("--cache", default="/tmp/whale-proposer-prefix.sqlite",
                    help="response cache of the feedback runs (set-up only)")  # fmt: skip
    args = ap.parse_args()
    if args.solver_eval:
        solver_eval(args)
    else:
        proposals(args)


if __name__ == "__main__":
    main()
