"""A warm pool of fresh jailed workers.

Starting a jail and an interpreter costs CPU (docs/measurements.md); when many runs end
together (they wait on the same model server) their starts pile up on the CPU. The pool starts
replacement workers in the background while runs wait on the model, so a run takes a worker
that is already up. Every worker still serves exactly one run: a pooled worker has run nothing yet,
it only waits for its first message, so isolation between runs is unchanged.

A jail dies with the thread that started it (PR_SET_PDEATHSIG, see sandbox.py), so the filler
threads live until `close()`, also after a failed start: a worker they started may still be
serving a run.

A caller that knows how many runs are coming says so (`expect`): the pool then keeps no more
workers started than runs remain, rather than `size` of them to the end, which the last runs
left unused (a tenth of the jails `benchmarks/eval_throughput.py` started at 16 workers). A
run nobody announced puts the pool back to `size`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class _Worker(Protocol):
    def alive(self) -> bool: ...

    def discard(self) -> None: ...


W = TypeVar("W", bound=_Worker)


class WorkerPool(Generic[W]):
    def __init__(self, spawn: Callable[[], W], size: int, fillers: int = 2) -> None:
        self._spawn, self.size, self.fillers = spawn, size, fillers
        self._idle: list[W] = []
        self._pending = 0
        self._closed = False
        self._failed = False  # a start failed: fillers stop starting, take() starts (and reports)
        self._coming: int | None = None  # runs announced and not taken yet (None: unknown)
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []

    def expect(self, runs: int) -> None:
        """`runs` more takes are coming (added to those already announced)."""
        with self._cv:
            self._coming = (self._coming or 0) + max(0, runs)
            self._start_filler()

    def _target(self) -> int:
        return self.size if self._coming is None else min(self.size, self._coming)

    def take(self) -> W:
        with self._cv:
            # A take nobody announced: back to keeping `size` workers started.
            self._coming = self._coming - 1 if self._coming else None
            while self._idle:
                w = self._idle.pop()
                self._cv.notify_all()
                if w.alive():
                    return w
                w.discard()
            self._start_filler()
        return self._spawn()

    def _start_filler(self) -> None:
        if not self._threads and self.size > 0 and not self._closed:
            for i in range(self.fillers):
                t = threading.Thread(target=self._fill, name=f"whale-pool-{i}", daemon=True)
                t.start()
                self._threads.append(t)
        self._cv.notify_all()

    def _fill(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (
                    self._failed or len(self._idle) + self._pending >= self._target()
                ):
                    self._cv.wait()
                if self._closed:
                    return
                self._pending += 1
            try:
                w = self._spawn()
            except Exception:  # noqa: BLE001 - a failed start is retried by take()
                with self._cv:
                    self._pending -= 1
                    self._failed = True
                continue
            with self._cv:
                self._pending -= 1
                if self._closed:
                    w.discard()
                    return
                self._idle.append(w)

    def close(self) -> None:
        """Discard the idle workers and end the fillers (and with them every worker they
        started: call it once no run uses them)."""
        with self._cv:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cv.notify_all()
        for w in idle:
            w.discard()
