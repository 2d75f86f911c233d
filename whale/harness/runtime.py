"""The Runtime: what runs harnesses, shared by every run of a command, and the executor seam.

A `Runtime` holds a run's settings (model, budget, limits, sandbox, sampling), the warm pool of
fresh workers and the cancel switch; `Runtime.run` hands one run to the broker
(`broker.run_harness`, which sees the Runtime as a `RunHost`). Where many runs go is an
`Executor`, the seam `whale.evaluation.evaluate` streams through: its implementations
(`executor.LocalPool`, `ray_executor.RayExecutor`) take a Runtime and sit above this module;
a Runtime holds one without importing it. `settings.make_runtime` builds the pair.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import whale.harness.cgroups as cgroups
from whale.errors import WhaleError
from whale.harness.broker import Retriever, run_harness
from whale.harness.budget import Budget, Limits, PythonToolLimits
from whale.harness.packages import PackageSet
from whale.harness.pool import WorkerPool
from whale.harness.sandbox import Sandbox
from whale.harness.streams import python_tool
from whale.harness.tools.config import ToolsConfig
from whale.harness.tools.gate import ToolBackend
from whale.harness.tools.host import ToolHost
from whale.harness.tools.spec import ToolSpec
from whale.harness.trajectory import Trajectory
from whale.harness.workers import Worker, spawn_worker
from whale.models.base import ChatModel, prompt_char_limit


class ExecutorUnavailable(WhaleError, RuntimeError):
    """The configured executor cannot run here (Ray not installed, no cluster, a model that
    cannot be reached from the actors)."""


class Rollout(NamedTuple):
    """One run to make: the question's id (for the trajectory) and its prompt."""

    question_id: str
    prompt: str


class Executor(Protocol):
    def stream(
        self,
        runtime: Runtime,
        source: str,
        rollouts: Sequence[Rollout],
        workers: int,
        retriever: Retriever | None,
    ) -> Generator[tuple[int, Trajectory], None, None]:
        """Run `source` on every rollout and yield `(index into rollouts, trajectory)` as each
        run ends, each index exactly once. A run's failure is its trajectory's status, never
        an exception. `workers`: the caller's concurrency (an executor may bound its own).
        On KeyboardInterrupt or SystemExit inside the stream, or `runtime.cancel()`, the runs
        in flight are stopped and not yielded; closing the iterator early stops the rest."""
        ...


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


@dataclass
class Runtime:
    """Runs harnesses. One Runtime is shared by many concurrent runs (it holds no run state
    but the cancel switch); each `run` is served by the broker (`broker.run_harness`), which
    reads this Runtime's settings through `broker.RunHost`."""

    model: ChatModel | None = None
    budget: Budget = field(default_factory=Budget)
    limits: Limits = field(default_factory=Limits)
    python_limits: PythonToolLimits = field(default_factory=PythonToolLimits)
    sandbox: Sandbox = field(default_factory=Sandbox)
    temperature: float = 0.0
    seed: int | None = 0
    # The most characters of message text one model call may carry (more is refused before
    # sending); None: the model's own bound (models.base.prompt_char_limit), where it has one.
    prompt_chars: int | None = None
    # Fresh workers kept started ahead of need (see pool.py); 0 starts each on demand.
    warm: int = 0
    # Where evaluate() runs this Runtime's rollouts (an `Executor`: whale.harness.executor,
    # whale.harness.ray_executor); None: a local thread pool of the command's workers.
    # Closed by close().
    executor: Executor | None = field(default=None, repr=False, compare=False)
    # The user's tools (whale.harness.tools): served by one tools process outside the jail,
    # started on first need, ended by close().
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    # The packages a harness may import beside the standard library (runtime.packages,
    # resolved by whale.harness.packages): mounted read-only in every worker; None: none.
    packages: PackageSet | None = None
    _on_cancel: list[Callable[[], None]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    _pool: WorkerPool[Worker] | None = field(default=None, init=False, repr=False, compare=False)
    _cancelled: bool = field(default=False, init=False, repr=False, compare=False)
    # A pipe that becomes readable, for good, on cancel(): every wait of every run watches it.
    _wake: tuple[int, int] = field(default=(-1, -1), init=False, repr=False, compare=False)
    _tool_host: ToolHost | None = field(default=None, init=False, repr=False, compare=False)
    _tool_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False,
                                       compare=False)  # fmt: skip
    # Held while the warm pool is made (cancel() does not take it: it only closes the pool).
    _pool_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False,
                                       compare=False)  # fmt: skip

    def __post_init__(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wake = (r, w)
        weakref.finalize(self, _close_fds, r, w)

    def _spawn(self) -> Worker:
        folder = None if self.packages is None else self.packages.folder
        return spawn_worker(self.sandbox, self.limits, folder)

    def _take_worker(self) -> Worker:
        if self.warm <= 0:
            return self._spawn()
        with self._pool_lock:  # one pool, however many runs ask for their first worker at once
            if self._pool is None:
                self._new_pool()
            pool = self._pool
        assert pool is not None
        w = pool.take()
        if self._cancelled:  # cancel() came while this pool was being made: stop its fillers
            pool.close()
        return w

    def expect_runs(self, runs: int) -> None:
        """`runs` more runs are coming (an executor that knows how many): the warm pool starts
        no more workers than that (pool.py). Optional; without it the pool keeps `warm`."""
        if self.warm <= 0 or self._cancelled:
            return
        with self._pool_lock:
            if self._pool is None:
                self._new_pool()
            pool = self._pool
        assert pool is not None
        pool.expect(runs)
        if self._cancelled:  # cancel() came while this pool was being made: stop its fillers
            pool.close()

    def _new_pool(self) -> None:
        self._pool = WorkerPool(self._spawn, self.warm, fillers=min(4, os.cpu_count() or 1))
        atexit.register(self._pool.close)

    def tool_backend(self) -> ToolBackend | None:
        """The host of the user's tools (None: this Runtime has none); its process starts on
        the first call or listing."""
        if not self.tools:
            return None
        with self._tool_lock:
            if self._tool_host is None:
                self._tool_host = ToolHost(self.tools)
                atexit.register(self._tool_host.close)
                if self._cancelled:
                    self._tool_host.cancel()
            return self._tool_host

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """Every user and MCP tool a harness may call (starts the tools process if needed;
        ToolsUnavailable when it cannot start); () without tools."""
        backend = self.tool_backend()
        return () if backend is None else backend.specs()

    def close(self) -> None:
        """Stop the warm workers (they also exit by themselves when this process ends), the
        tools process, and close the executor (a Ray cluster whale started is shut down)."""
        self._close_pool()
        with self._tool_lock:
            host, self._tool_host = self._tool_host, None
        if host is not None:
            host.close()
            atexit.unregister(host.close)
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()
        cgroups.flush()  # the run folders still queued for removal (cgroups.remove_later)

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def on_cancel(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call `hook` on cancel() (at once if cancel() came already); returns the function
        that removes it. An executor uses it to stop rollouts that run elsewhere."""
        self._on_cancel.append(hook)
        if self._cancelled:
            hook()

        def remove() -> None:
            try:
                self._on_cancel.remove(hook)
            except ValueError:
                pass

        return remove

    def package_names(self) -> tuple[str, ...]:
        """The packages a harness may import beside the standard library, as a proposer is
        told them; () without runtime.packages."""
        return () if self.packages is None else self.packages.names

    def prompt_char_limit(self) -> int | None:
        """The bound `_llm` applies to a call's message text (None: none)."""
        return self.prompt_chars if self.prompt_chars is not None else prompt_char_limit(self.model)

    def wake_fd(self) -> int:
        """The read end of the cancel pipe: readable once cancel() was called."""
        return self._wake[0]

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Kill every in-flight run of this Runtime and refuse new ones (for Ctrl-C).

        Each run's `run()` returns a Trajectory with status `killed`, error `cancelled`: at
        once from a wait on its worker, a stalled reply or the python tool; a run inside a
        model call returns when that call does (its timeout bounds it). Later `run()` calls
        return the same without starting a worker. There is no undo. Safe from any thread
        and from a signal handler (it takes no lock but the warm pool's reentrant one); the
        `on_cancel` hooks run in the calling thread (an executor's: no waiting either)."""
        self._cancelled = True
        try:
            os.write(self._wake[1], b"x")  # never read: it stays readable
        except BlockingIOError:  # already full of earlier cancels
            pass
        self._close_pool()
        host = self._tool_host
        if host is not None:
            host.cancel()  # sets a flag: no lock
        for hook in list(self._on_cancel):
            try:
                hook()
            except Exception:  # noqa: BLE001, S110 - one hook's failure must not skip the rest
                pass

    def run(
        self,
        source: str,
        question: str,
        question_id: str = "q",
        retriever: Retriever | None = None,
    ) -> Trajectory:
        return run_harness(self, source, question, question_id, retriever)

    def run_python(self, code: str, timeout: float | None) -> dict[str, Any]:
        """The nested python tool: a fresh jailed interpreter per call (streams.python_tool)."""
        return python_tool(self.sandbox, self.python_limits, code, timeout, self.wake_fd())
