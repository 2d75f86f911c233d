"""Wall time of one jailed run from `Runtime.run` to its return, past the model's own time: a
warm worker, the `single_call` seed harness, one call to a server on 127.0.0.1 that answers at
once (its own process). This is what each rollout adds to the model's latency at a few
workers (benchmarks/eval_throughput.py at 4 workers).

    python -m benchmarks.run_latency [--runs 60] [--kinds auto]

Two arms, interleaved run by run, each a median:
- "now": the run's end as whale ends it;
- "before": as before issue 25's latency work: the run's cgroup folders removed in the run's
  path (an rmdir waits on the kernel's cgroup mutex while a warm pool's filler joins a new
  jail to its cgroups), `cgroup.kill` written even to an empty group, and the jail's exit
  waited for by Popen's polling (sleeps that double from 1 ms).
A pause after each run (`--pause-ms`, default 50) lets the warm pool start the next worker, as
the model's time would.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import time
from collections.abc import Iterator

import whale.harness.cgroups as cgroups
import whale.harness.sandbox as sandbox
from tests.servers import serve_in_subprocess
from whale.harness import Runtime, load_harness
from whale.harness.sandbox import Sandbox
from whale.models import OpenAICompatible


def _popen_wait(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_always(self: cgroups.RunGroup) -> None:
    if self.kill_file is not None:
        with contextlib.suppress(OSError):
            cgroups._write(self.kill_file, "1")


@contextlib.contextmanager
def before() -> Iterator[None]:
    """The run's end as it was before: patched in for the duration of one run."""
    saved = (cgroups.remove_later, sandbox.wait_exit, cgroups.RunGroup.kill)
    cgroups.remove_later = lambda g: g.remove()  # type: ignore[assignment]
    sandbox.wait_exit = _popen_wait  # type: ignore[assignment]
    cgroups.RunGroup.kill = _kill_always  # type: ignore[method-assign]
    try:
        yield
    finally:
        cgroups.remove_later, sandbox.wait_exit, cgroups.RunGroup.kill = saved  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60, help="runs per arm")
    ap.add_argument("--pause-ms", type=float, default=50.0)
    ap.add_argument("--kinds", default="auto", help="sandbox kinds, e.g. nsjail,bwrap")
    args = ap.parse_args()
    server, url = serve_in_subprocess("Answer: 1", 0.0)
    source = load_harness("single_call")
    try:
        model = OpenAICompatible("stub", url)
        print(f"{args.runs} runs per arm, interleaved; wall ms per run past the model's time")
        for kind in args.kinds.split(","):
            rt = Runtime(model=model, warm=4, sandbox=Sandbox(kind))  # type: ignore[arg-type]
            walls: dict[str, list[float]] = {"now": [], "before": []}
            for i in range(args.runs + 5):
                for arm in ("now", "before") if i % 2 == 0 else ("before", "now"):
                    time.sleep(args.pause_ms / 1000)
                    with before() if arm == "before" else contextlib.nullcontext():
                        t = time.perf_counter()
                        traj = rt.run(source, "What is 1 + 1?")
                        wall = time.perf_counter() - t
                    assert traj.status == "ok", (arm, traj.error, traj.stderr_tail)
                    if i >= 5:  # the first runs warm the pool and the caches
                        walls[arm].append(wall * 1e3)
            rt.close()
            med = {a: statistics.median(w) for a, w in walls.items()}
            q = {a: statistics.quantiles(w, n=4) for a, w in walls.items()}
            for a in ("before", "now"):
                print(f"{rt.sandbox.resolved():>7} {a:>7}: {med[a]:6.2f} ms "
                      f"(quartiles {q[a][0]:.2f}-{q[a][2]:.2f})")  # fmt: skip
            print(f"{rt.sandbox.resolved():>7} before / now: {med['before'] / med['now']:.2f}x")
        model.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
