"""Run after the test suite (`make test`): exit 1, naming them, if a process of a whale sandbox
uid, a llama.cpp server, a tools process (whale.harness.tools) or a process of a Ray cluster
(raylet, gcs_server, an actor) is still alive. Nothing a run or a test started may outlive it."""

from __future__ import annotations

import os
import sys
import time

from whale.harness.sandbox import leftovers


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


def main() -> int:
    for _ in range(10):  # a server killed at exit may take a moment to be reaped
        left = leftovers() + servers()
        if not left:
            print("leftovers: none (no whale sandbox uid process, no llama.cpp server, no Ray)")
            return 0
        time.sleep(0.5)
    print("leftovers after the test suite:", *left, sep="\n  ")
    return 1


if __name__ == "__main__":
    sys.exit(main())
