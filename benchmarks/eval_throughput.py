"""Rollouts per second of `evaluate` against an OpenAI-compatible server on 127.0.0.1 that
answers every request after a fixed 200 ms (its own process), at 1, 4 and 16 workers, as a
ratio to the ideal
(workers / 0.2 s). Every rollout is a real jailed run of the `single_call` seed harness.

    python -m benchmarks.eval_throughput [--per-worker 20]
    python -m benchmarks.eval_throughput --arms helper,chain+scan --repeats 3
Target (issue 25): >= 0.85 of ideal at 16 workers, >= 0.9 at 4.

`--arms` compares ways of starting the jails in one run, interleaved (helper, chain, chain,
helper, ... at each worker count), each with its median over `--repeats`: a launcher of
whale.harness.launcher ("helper", "chain", "preexec", "auto"), and "+scan" to scan /proc at
every uid taken, as whale did before the pool's clean marks (issue 25): "chain+scan" is the
start as it was before issue 25. A sandbox kind may come first: "nsjail:auto,bwrap:auto"
compares the two jails.

CPU per rollout: "own" is every process of this benchmark (whale's, the jails, the stub server;
the benchmark moves itself into a cgroup v1 `cpuacct` group of its own where it can, else "-"),
"whale" is whale's own process, and "machine" is the whole machine's from /proc/stat, assuming
100 ticks/s (nsjail runs its jails at nice 19, so 'nice' is theirs; bubblewrap's are 'user').
"own" excludes kernel threads (a jail's network namespace is freed by one).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.servers import serve_in_subprocess
from whale.evaluation import evaluate
from whale.harness import Runtime, load_harness, uids
from whale.harness.sandbox import Sandbox
from whale.models import OpenAICompatible
from whale.tasks import load_task

DELAY_S = 0.2


def cpu_jiffies() -> tuple[int, int, int]:
    """Machine-wide (user, nice, system) CPU time from /proc/stat, in clock ticks."""
    with open("/proc/stat") as f:
        user, nice, system = (int(x) for x in f.readline().split()[1:4])
    return user, nice, system


def own_cpu_group() -> str | None:
    """A cpuacct group holding this process (and so everything it starts), or None."""
    root = "/sys/fs/cgroup/cpuacct"
    if os.geteuid() != 0 or not os.path.exists(os.path.join(root, "cpuacct.usage")):
        return None
    path = os.path.join(root, f"whale-bench-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return None
    return path


def own_cpu_ms(group: str | None) -> float:
    if group is None:
        return float("nan")
    with open(os.path.join(group, "cpuacct.usage")) as f:
        return int(f.read()) / 1e6


def whale_cpu_ms() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e3


class _ScanEveryTake:
    """The uid pool's take as before its clean marks: a /proc scan for the uid every time."""

    def __init__(self, pool: uids.UidPool) -> None:
        self.pool, self.take_marked = pool, pool.take

    def __enter__(self) -> None:
        def take() -> uids.UidLease:
            lease = self.take_marked()
            uids.scan((lease.uid,))
            return lease

        self.pool.take = take  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        self.pool.take = self.take_marked  # type: ignore[method-assign]


@dataclass(frozen=True)
class Measured:
    ratio: float  # rollouts/s over the ideal
    wall_s: float
    own_ms: float  # CPU per rollout of every process of the benchmark
    whale_ms: float  # of whale's own process
    machine_ms: tuple[float, float, float]  # of the machine: user, nice, system


def one_arm(
    arm: str, model: OpenAICompatible, source: str, w: int, args: argparse.Namespace,
    group: str | None,
) -> Measured:  # fmt: skip
    kind, _, rest = arm.rpartition(":")
    launch, _, extra = rest.partition("+")
    sandbox = Sandbox(kind or "auto", launch=launch)  # type: ignore[arg-type]
    rt = Runtime(model=model, warm=2 * w if args.warm else 0, sandbox=sandbox)
    task = load_task("rg:basic_arithmetic", size=w * args.per_worker, seed=w)
    scan = _ScanEveryTake(uids.POOL) if extra == "scan" else None
    if scan is not None:
        scan.__enter__()
    try:
        c0, o0, s0 = cpu_jiffies(), own_cpu_ms(group), whale_cpu_ms()
        r = evaluate(rt, source, task, task.questions(), workers=w)
        rt.close()
        c1, o1, s1 = cpu_jiffies(), own_cpu_ms(group), whale_cpu_ms()
    finally:
        if scan is not None:
            scan.__exit__()
    assert r.rho_run == 1.0, r.summary()
    user, nice, system = ((b - a) * 10 / r.n for a, b in zip(c0, c1, strict=True))
    return Measured(
        r.n / r.wall_s / (w / DELAY_S), r.wall_s, (o1 - o0) / r.n, (s1 - s0) / r.n,
        (user, nice, system),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-worker", type=int, default=20, help="rollouts per worker")
    ap.add_argument("--workers", default="1,4,16")
    ap.add_argument("--no-warm", dest="warm", action="store_false", help="no warm worker pool")
    ap.add_argument("--arms", default="auto", help="launchers to compare, e.g. helper,chain+scan")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each arm per worker count")
    args = ap.parse_args()
    arms = args.arms.split(",")
    source = load_harness("single_call")
    group = own_cpu_group()
    server, base_url = serve_in_subprocess("Answer: 1", DELAY_S)
    try:
        model = OpenAICompatible("stub", base_url)
        print(f"{'workers':>8} {'arm':>12} {'rollouts':>9} {'wall s':>7} {'ratio':>6}   "
              "CPU ms/rollout: own, whale; machine nice/user/kernel")  # fmt: skip
        for w in (int(x) for x in args.workers.split(",")):
            runs: dict[str, list[Measured]] = {a: [] for a in arms}
            for i in range(args.repeats):
                for arm in arms if i % 2 == 0 else arms[::-1]:  # ABBA: neither arm always first
                    runs[arm].append(one_arm(arm, model, source, w, args, group))
            for arm in arms:
                rs = runs[arm]

                def med(f: Callable[[Measured], float], rs: list[Measured] = rs) -> float:
                    return statistics.median(f(x) for x in rs)

                user, nice, system = (
                    statistics.median(x.machine_ms[k] for x in rs) for k in range(3)
                )
                ratios = " ".join(f"{x.ratio:.2f}" for x in rs)
                print(
                    f"{w:>8} {arm:>12} {w * args.per_worker:>9} {med(lambda x: x.wall_s):>7.2f} "
                    f"{med(lambda x: x.ratio):>6.2f}   {med(lambda x: x.own_ms):.1f}, "
                    f"{med(lambda x: x.whale_ms):.1f}; {nice:.1f}/{user:.1f}/{system:.1f}"
                    + (f"   (ratios {ratios})" if len(rs) > 1 else "")
                )
        model.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
        if group is not None:
            with open(os.path.join(os.path.dirname(group), "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            for _ in range(100):  # until the last jails have exited
                try:
                    os.rmdir(group)
                    break
                except OSError:
                    time.sleep(0.05)


if __name__ == "__main__":
    main()
