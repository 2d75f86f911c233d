"""CPU time of one jail's start and end, by backend and launcher (whale.harness.launcher): a
jailed `python -I -S -c pass` started, waited for and killed, with its cgroups and uid, as
every run's worker is. Interleaved batches (ABBA), medians over the batches.

    python -m benchmarks.jail_start [--batches 15] [--per-batch 10] [--arms helper,chain+scan]

"all" is every process of the start (whale's, the launcher, the jail, the interpreter), from a
cgroup v1 `cpuacct` group the script moves itself into (root only); "whale" is whale's own
process. An arm is a launcher ("helper", "chain", "preexec"), with "+scan" to scan /proc at
every uid taken as whale did before the uid pool's clean marks: "chain+scan" is a start as it
was before issue 25. A scan reads every process's status, so its cost grows with the number of
processes on the machine (printed).
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchmarks.eval_throughput import _ScanEveryTake, own_cpu_group, own_cpu_ms, whale_cpu_ms
from whale.harness import Limits, uids
from whale.harness.sandbox import Sandbox, nsjail_binary, python_executable


def start_and_end(kind: str, launch: str) -> None:
    j = Sandbox(kind, launch=launch).spawn(  # type: ignore[arg-type]
        [python_executable(), "-I", "-S", "-c", "pass"], Limits()
    )
    j.proc.wait()
    j.kill()


def batch(kind: str, arm: str, n: int, group: str | None) -> tuple[float, float]:
    launch, _, extra = arm.partition("+")
    scan = _ScanEveryTake(uids.POOL) if extra == "scan" else None
    if scan is not None:
        scan.__enter__()
    try:
        a0, w0 = own_cpu_ms(group), whale_cpu_ms()
        for _ in range(n):
            start_and_end(kind, launch)
        return (own_cpu_ms(group) - a0) / n, (whale_cpu_ms() - w0) / n
    finally:
        if scan is not None:
            scan.__exit__()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--per-batch", type=int, default=10)
    ap.add_argument("--arms", default="helper,chain,chain+scan")
    ap.add_argument("--kinds", default="nsjail,bwrap" if nsjail_binary() else "bwrap")
    args = ap.parse_args()
    group = own_cpu_group()
    if group is None:
        print("no cpuacct group of its own here (root and cgroup v1 cpuacct needed): 'all' is nan")
    arms = [(k, a) for k in args.kinds.split(",") for a in args.arms.split(",")]
    got: dict[tuple[str, str], list[tuple[float, float]]] = {a: [] for a in arms}
    for k, a in arms:  # warm: caches, compiled worker, lock files
        batch(k, a, 2, group)
    for i in range(args.batches):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            got[arm].append(batch(*arm, args.per_batch, group))
    procs = sum(1 for e in os.listdir("/proc") if e.isdigit())
    print(f"{args.batches} batches of {args.per_batch} starts per arm; {procs} processes now")
    print(f"{'backend':>8} {'arm':>12}  CPU ms per start: all (median, quartiles), whale")
    for arm, rs in got.items():
        q = statistics.quantiles([r[0] for r in rs], n=4)
        med_w = statistics.median(r[1] for r in rs)
        print(f"{arm[0]:>8} {arm[1]:>12}  {q[1]:6.2f} ({q[0]:.2f}-{q[2]:.2f}), {med_w:5.2f}")
    if group is not None:
        with open(os.path.join(os.path.dirname(group), "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(group)


if __name__ == "__main__":
    main()
