"""What the broker's prompt bound saves (issue 20): a harness that sends three calls of one
7.5 MB message each, on the embedded model, with the bound (refused before sending) and
without it (sent: the server tokenizes each, then refuses it as over its context).

    python -m benchmarks.prompt_bound [--model qwen-coder-0.5b]

Each run gets a fresh server; prints the run's wall time and the server's resident memory
after it, for both, and the ratios (without / with). One run each: the figures are rough.
"""

from __future__ import annotations

import argparse
import time

import psutil

from whale.harness import Runtime
from whale.models import EmbeddedLlama, Sampling
from whale.models.catalog import model_path

HARNESS = (
    "def run(q, env):\n"
    "    r = env.llm('Say OK.', max_tokens=4)\n"
    "    big = 'x' * (15 * 1024 * 1024 // 2)\n"
    "    errs = []\n"
    "    for _ in range(3):\n"
    "        try:\n"
    "            env.llm(big)\n"
    "        except Exception as e:\n"
    "            errs.append(type(e).__name__)\n"
    "    return r.text + ' | ' + ' '.join(errs)\n"
)


def one(model: str, bounded: bool) -> tuple[float, int, str]:
    m = EmbeddedLlama(model_path(model), alias=model)
    try:
        m.chat([{"role": "user", "content": "hi"}], Sampling(max_tokens=1))  # server up
        rt = Runtime(model=m, prompt_chars=None if bounded else 10**9)
        t0 = time.monotonic()
        t = rt.run(HARNESS, "x")
        wall = time.monotonic() - t0
        assert m._proc is not None
        rss = psutil.Process(m._proc.pid).memory_info().rss // 2**20
        refused = sum(e["kind"] == "refused" for e in t.events)
        return wall, rss, f"status {t.status}, {refused} refused by the broker"
    finally:
        m.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen-coder-0.5b")
    a = ap.parse_args()
    with_b = one(a.model, True)
    without = one(a.model, False)
    for name, (wall, rss, what) in (("bounded", with_b), ("unbounded", without)):
        print(f"{name:9s}: run {wall:6.1f} s, server RSS after {rss:5d} MB ({what})")
    print(f"ratio unbounded/bounded: wall {without[0] / with_b[0]:.1f}x, "
          f"RSS {without[1] / with_b[1]:.2f}x")


if __name__ == "__main__":
    main()
