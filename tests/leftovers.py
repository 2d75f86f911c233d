"""Run after the test suite (`make test`): exit 1, naming them, if a process of a whale sandbox
uid, a llama.cpp server, a tools process (whale.harness.tools) or a process of a Ray cluster
(raylet, gcs_server, an actor) is still alive. Nothing a run or a test started may outlive it.

`--outside PID` (repeatable): processes descended from PID are not the suite's (a long run
started beside it, such as `whale experiment run`); they are listed apart and do not fail the
check. A leftover of the suite is an orphan or a descendant of something else. A PID that is
this check or one of its ancestors (PID 1, the shell running the suite) is refused (exit 2):
every orphan of the suite ends up under one of them. Each root's command line is printed, so
that a PID reused by another process shows; a root that is gone is said."""

from __future__ import annotations

import argparse
import os
import sys
import time

from whale.harness.sandbox import leftovers
from whale.procfs import ancestors


def servers() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(s in args for s in ("llama_cpp.server", "llama-server", "llama_server", "raylet",
                                   "gcs_server", "ray::", "whale.harness.tools.child")):
            found.append(f"{pid} {args[:160]}")
    return found


def _pid(line: str) -> int:
    """The process id a line of `leftovers()` ("pid N ...") or `servers()` ("N ...") names."""
    words = line.split()
    return int(words[1] if words[0] == "pid" else words[0])


def split_outside(lines: list[str], roots: set[int]) -> tuple[list[str], list[str]]:
    """(the suite's lines, the lines of processes that are `roots` or descend from one)."""
    outside = [x for x in lines if roots & {_pid(x), *ancestors(_pid(x))}]
    return [x for x in lines if x not in outside], outside


def command(pid: int) -> str | None:
    """The command line of `pid` (cut), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.leftovers")
    ap.add_argument("--outside", type=int, action="append", default=[], metavar="PID",
                    help="a process tree that is not the suite's (repeatable)")
    roots = set(ap.parse_args(argv).outside)
    mine = {1, os.getpid(), *ancestors(os.getpid())}
    if roots & mine:
        ap.error(f"--outside {min(roots & mine)}: this check or an ancestor of it; every "
                 f"orphan of the suite descends from it, so no leftover would be found")
    for root in sorted(roots):
        what = command(root)
        print(f"--outside {root}: no such process" if what is None else
              f"--outside {root}: {root} ({what})")  # fmt: skip
    for _ in range(10):  # a server killed at exit may take a moment to be reaped
        left, outside = split_outside(leftovers() + servers(), roots)
        if not left:
            break
        time.sleep(0.5)
    if outside:
        print(f"not the suite's (descended from {sorted(roots)}):", *outside, sep="\n  ")
    if not left:
        print("leftovers: none (no whale sandbox uid process, no llama.cpp server, no Ray)")
        return 0
    print("leftovers after the test suite:", *left, sep="\n  ")
    return 1


if __name__ == "__main__":
    sys.exit(main())
