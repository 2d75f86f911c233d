"""What the Ray executor (whale.harness.ray_executor) keeps beside itself: the reaper of a
local cluster, and the tally of the tokens each try of a rollout received.

The reaper: Ray's per-node agents outlive a SIGKILLed driver by about a minute, and a worker
started after `ray.init` (an actor, the tally, an idle worker) is not in the snapshot of the
driver's children; so a small process, started with the cluster, waits on a pipe from the
driver and, once it closes (the driver ended in any way), SIGKILLs the snapshot's processes
(pid and start time, so that a reused pid is spared) and every process whose command line
names this cluster's node id.

The tally: each actor's model reports every completion's tokens to an actor of the driver,
keyed by stream, rollout and try, so that the tokens of a try whose actor died are counted in
the ledger (`Trajectory.lost_tokens`). Not covered: a completion that came back in the instant
before its actor died, before its report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import ray

from whale import procfs
from whale.models.base import ChatModel, Completion, Message, Sampling

# Started with a local cluster: when this process ends in any way (its end of the pipe closes),
# SIGKILL the cluster's processes it was given (pid and start time, so that a reused pid is
# spared). Ray's per-node agents otherwise outlive a SIGKILLed driver by about a minute.
_REAPER = '''
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
procs = json.loads(sys.stdin.readline())
mark = sys.stdin.readline().strip()  # "--node-id=<hex>": the cluster's later workers carry it
sys.stdin.read()

def kill(pid, start):
    try:
        with open(f"/proc/{pid}/stat", errors="replace") as f:
            if start is None or f.read().rsplit(")", 1)[1].split()[19] == start:
                os.kill(pid, signal.SIGKILL)
    except (OSError, IndexError):
        pass

for pid, start in procs:
    kill(pid, start)
if mark:  # workers started after the snapshot (actors, idle workers): found by the node id
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if mark.encode() in f.read().split(b"\\0"):
                    kill(int(d), None)
        except (OSError, ValueError):
            pass
'''


def descendants(root: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live process below `root`, from /proc."""
    return list(procfs.descendants(root).items())


def start_reaper(before: set[tuple[int, str]]) -> subprocess.Popen[str] | None:
    """The reaper of the processes that are below this one now and were not in `before` (the
    snapshot taken just before `ray.init`): the cluster's, never a model server or any other
    child this process had started; and of the workers the cluster starts later (an actor,
    the tally, an idle worker), whose command lines name this cluster's node id."""
    if not os.path.isdir("/proc"):
        return None
    procs = [p for p in descendants(os.getpid()) if p not in before]
    try:
        mark = f"--node-id={ray.get_runtime_context().get_node_id()}"
    except Exception:  # noqa: BLE001 - the snapshot alone still reaps the cluster's core
        mark = ""
    reaper = subprocess.Popen([sys.executable, "-c", _REAPER], stdin=subprocess.PIPE, text=True,
                              start_new_session=True)  # fmt: skip
    assert reaper.stdin is not None
    reaper.stdin.write(json.dumps(procs) + "\n" + mark + "\n")
    reaper.stdin.flush()
    return reaper


class Tally:
    """The driver's count of the tokens each try of a rollout received, reported by the
    actors call by call: what a try whose actor died had already paid."""

    def __init__(self) -> None:
        self._tokens: dict[str, int] = {}

    def add(self, key: str, tokens: int) -> None:
        self._tokens[key] = self._tokens.get(key, 0) + tokens

    def take(self, key: str) -> int:
        return self._tokens.pop(key, 0)

    def drop(self, prefix: str) -> None:
        for key in [k for k in self._tokens if k.startswith(prefix)]:
            del self._tokens[key]


TALLY_S = 10.0  # how long a report or a take may wait for the tally (accounting only)


class Reporting:
    """An actor's model: each completion's tokens are reported to the tally under the key
    of the try running in this thread (the broker calls the model from the thread of the
    run), before the harness sees the reply. Everything else is the inner model's."""

    def __init__(self, inner: ChatModel, current: threading.local) -> None:
        self.inner, self._current = inner, current
        self.name = inner.name

    def chat(self, messages: list[Message], sampling: Sampling,
             timeout: float | None = None) -> Completion:  # fmt: skip
        c = self.inner.chat(messages, sampling, timeout)
        report = getattr(self._current, "report", None)
        if report is not None:
            try:
                tokens = int(c.usage.get("total_tokens", 0))
                if tokens:
                    ray.get(report[0].add.remote(report[1], tokens), timeout=TALLY_S)
            except Exception:  # noqa: BLE001, S110 - accounting only: the rollout goes on
                pass
        return c

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def take(tally: Any, key: str) -> int:
    """The tokens the tally holds for `key` (a lost try), removed; 0 when it cannot say."""
    if tally is None:
        return 0
    try:
        return int(ray.get(tally.take.remote(key), timeout=TALLY_S))
    except Exception:  # noqa: BLE001 - accounting only: the rollout is retried regardless
        return 0
