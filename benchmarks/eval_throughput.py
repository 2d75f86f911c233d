"""Rollouts per second of `evaluate` against an OpenAI-compatible server on 127.0.0.1 that
answers every request after a fixed 200 ms (its own process), at 1, 4 and 16 workers, as a
ratio to the ideal
(workers / 0.2 s). Every rollout is a real jailed run of the `single_call` seed harness.

    python -m benchmarks.eval_throughput [--per-worker 20]
Target (issue 3): >= 0.8 of ideal at 16 workers. Also prints the machine's CPU time per rollout
(/proc/stat, assuming 100 ticks/s): jailed processes run at nice 19, so 'nice' is theirs.
"""

from __future__ import annotations

import argparse

from tests.servers import serve_in_subprocess
from whale.evaluation import evaluate
from whale.harness import Runtime, load_harness
from whale.models import OpenAICompatible
from whale.tasks import load_task

DELAY_S = 0.2


def cpu_jiffies() -> tuple[int, int, int]:
    """Machine-wide (user, nice, system) CPU time from /proc/stat, in clock ticks."""
    with open("/proc/stat") as f:
        user, nice, system = (int(x) for x in f.readline().split()[1:4])
    return user, nice, system


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-worker", type=int, default=20, help="rollouts per worker")
    ap.add_argument("--workers", default="1,4,16")
    ap.add_argument("--no-warm", dest="warm", action="store_false", help="no warm worker pool")
    args = ap.parse_args()
    source = load_harness("single_call")
    server, base_url = serve_in_subprocess("Answer: 1", DELAY_S)
    try:
        model = OpenAICompatible("stub", base_url)
        print(
            f"{'workers':>8} {'rollouts':>9} {'wall s':>8} {'rollouts/s':>11} "
            f"{'ideal/s':>8} {'ratio':>6}"
        )
        for w in (int(x) for x in args.workers.split(",")):
            rt = Runtime(model=model, warm=2 * w if args.warm else 0)
            task = load_task("rg:basic_arithmetic", size=w * args.per_worker, seed=w)
            c0 = cpu_jiffies()
            r = evaluate(rt, source, task, task.questions(), workers=w)
            cpu = [(b - a) * 10 / r.n for a, b in zip(c0, cpu_jiffies(), strict=True)]  # ms
            assert r.rho_run == 1.0, r.summary()
            rate = r.n / r.wall_s
            ideal = w / DELAY_S
            rt.close()
            print(
                f"{w:>8} {r.n:>9} {r.wall_s:>8.2f} {rate:>11.1f} {ideal:>8.1f} {rate / ideal:>6.2f}"
                f"   CPU ms/rollout: jailed (nice) {cpu[1]:.1f}, user {cpu[0]:.1f}, "
                f"kernel {cpu[2]:.1f}"
            )
        model.close()
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
