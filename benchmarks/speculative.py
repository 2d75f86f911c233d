"""Speculative decoding from the context's own n-grams (`ModelConfig.speculative = "ngram"`)
against plain decoding, on the embedded native server, for replies that copy their prompt.

    python -m benchmarks.speculative [--model qwen-coder-1.5b] [--pairs 3] [--max-tokens 300]

Two `EmbeddedLlama` servers of `--model` (1 slot, 2 threads each, no prompt cache), one with
`speculative="off"`, one with `"ngram"`. Each pair asks both, in turn, the same two prompts a
proposer gets in kind, sampled (temperature 0.7, the same seed in both arms): "rewrite" (a
seed harness shown whole, the reply the whole file with one change: what the search agent
writes) and "edit" (the same harness, the reply one search/replace block: what the revision
loop's proposer writes). Each server is started (one 1-token call) before any timing. Prints
each call's wall time and completion tokens, and after each pair, per prompt, the ratio of the
arms' median completion tokens per second of wall time so far (target >= 1.5 on "rewrite").
The arms alternate call by call, so that load from other jobs hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from whale.models import EmbeddedLlama, Sampling
from whale.models.catalog import model_path

SEED_HARNESS = Path(__file__).resolve().parents[1] / "whale" / "harness" / "seeds" / (
    "interpreter_loop.py")
PROMPTS = {
    "rewrite": "Rewrite the whole file, changing only the system prompt so that it asks for a "
               "short final answer. Output the complete file in one ```python block.",
    "edit": "Change the system prompt so that it asks for a short final answer. Answer with one "
            "edit block:\n<<<<<<< SEARCH\n(lines copied exactly from the file)\n=======\n"
            "(the new lines)\n>>>>>>> REPLACE",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen-coder-1.5b")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    source = SEED_HARNESS.read_text()
    arms = {kind: EmbeddedLlama(model_path(a.model), alias=a.model, n_ctx=8192, slots=1,
                                threads=a.threads, timeout_s=1800.0, prefix_cache="off",
                                speculative=kind, server="native")
            for kind in ("off", "ngram")}  # fmt: skip
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        for model in arms.values():  # each server starts on its first call: not timed
            model.chat([{"role": "user", "content": "hi"}], Sampling(max_tokens=1))
        for pair in range(a.pairs):
            for task, ask in PROMPTS.items():
                msgs = [{"role": "user", "content": f"```python\n{source}\n```\n\n{ask}"}]
                sampling = Sampling(max_tokens=a.max_tokens, temperature=0.7, seed=pair)
                for kind, model in arms.items():
                    t0 = time.monotonic()
                    c = model.chat(msgs, sampling)  # type: ignore[arg-type]
                    wall = time.monotonic() - t0
                    n = c.usage.get("completion_tokens", 0)
                    rates.setdefault((task, kind), []).append(n / wall)
                    print(f"pair {pair} {task:7s} {kind:5s} {wall:7.1f} s  {n:4d} tokens  "
                          f"{n / wall:6.2f} tok/s", flush=True)
                ratios(rates, task)  # after every pair: a run cut short still says its ratio
    finally:
        for model in arms.values():
            model.close()


def ratios(rates: dict[tuple[str, str], list[float]], task: str) -> None:
    off, on = rates[(task, "off")], rates[(task, "ngram")]
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"  {task}: ngram / off = {m_on / m_off:.2f}x ({m_on:.2f} vs {m_off:.2f} tok/s, "
          f"median of {len(on)})", flush=True)


if __name__ == "__main__":
    main()
