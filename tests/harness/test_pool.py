"""The warm pool starts no more workers than the runs announced to it (`expect`), and keeps its
full size for runs nobody announced."""

import threading
import time

from whale.harness.pool import WorkerPool


class _Fake:
    def __init__(self) -> None:
        self.discarded = False

    def alive(self) -> bool:
        return not self.discarded

    def discard(self) -> None:
        self.discarded = True


def _pool(size: int) -> tuple[WorkerPool[_Fake], list[_Fake]]:
    started: list[_Fake] = []
    lock = threading.Lock()

    def spawn() -> _Fake:
        w = _Fake()
        with lock:
            started.append(w)
        return w

    return WorkerPool(spawn, size=size, fillers=2), started


def _settle(pool: WorkerPool[_Fake], want: int) -> None:
    deadline = time.monotonic() + 5
    while len(pool._idle) < want and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # long enough for a filler that would start one more


def test_announced_runs_leave_no_worker_started_for_nothing():
    pool, started = _pool(size=8)
    try:
        pool.expect(5)
        _settle(pool, 5)
        taken = [pool.take() for _ in range(5)]
        time.sleep(0.2)
        assert len(started) == 5 and not pool._idle
        assert all(not w.discarded for w in taken)
    finally:
        pool.close()


def test_the_pool_never_holds_more_than_its_size_of_announced_runs():
    pool, started = _pool(size=3)
    try:
        pool.expect(100)
        _settle(pool, 3)
        assert len(pool._idle) == 3 and len(started) == 3
    finally:
        pool.close()


def test_a_run_nobody_announced_brings_back_the_full_pool():
    pool, started = _pool(size=4)
    try:
        pool.expect(1)
        pool.take()
        time.sleep(0.2)
        assert not pool._idle  # the one announced run took its worker; nothing more started
        pool.take()  # unannounced
        _settle(pool, 4)
        assert len(pool._idle) == 4
    finally:
        pool.close()


def test_without_announcements_the_pool_keeps_its_size():
    pool, started = _pool(size=4)
    try:
        pool.take()
        _settle(pool, 4)
        assert len(pool._idle) == 4
    finally:
        pool.close()


def test_a_cancel_that_lands_while_runs_are_announced_leaves_no_pool_filling():
    """cancel() from a signal handler (Ctrl-C) runs between any two lines of the main thread:
    here between expect_runs' check and the pool it makes."""
    from whale.harness.runtime import Runtime

    rt = Runtime(model=None, warm=3)
    started: list[_Fake] = []
    rt._spawn = lambda: started.append(_Fake()) or started[-1]  # type: ignore[method-assign]
    make = rt._new_pool

    def cancelled_first() -> None:
        rt.cancel()
        make()

    rt._new_pool = cancelled_first  # type: ignore[method-assign]
    try:
        rt.expect_runs(5)
        time.sleep(0.3)
        assert all(w.discarded for w in started)  # none kept, or none started at all
        assert rt._pool is None or rt._pool._closed
    finally:
        rt.close()


def test_concurrent_first_calls_make_one_pool_not_orphans(monkeypatch):
    """Two evaluations announcing their runs at once (or the first takes of many run threads):
    a pool made twice leaves one no Runtime holds, its workers kept until exit."""
    import whale.harness.runtime as runtime_mod
    from whale.harness.runtime import Runtime

    made: list[WorkerPool[_Fake]] = []

    class SlowPool(WorkerPool[_Fake]):
        def __init__(self, *a, **kw) -> None:
            time.sleep(0.05)  # the window between `_pool is None` and its assignment, widened
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(runtime_mod, "WorkerPool", SlowPool)
    rt = Runtime(model=None, warm=2)
    started: list[_Fake] = []
    lock = threading.Lock()

    def spawn() -> _Fake:
        with lock:
            started.append(_Fake())
            return started[-1]

    rt._spawn = spawn  # type: ignore[method-assign]
    go = threading.Barrier(3)

    def announce() -> None:
        go.wait()
        rt.expect_runs(2)

    threads = [threading.Thread(target=announce) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rt.close()
    time.sleep(0.2)
    assert len(made) == 1
    assert all(w.discarded for w in started)
