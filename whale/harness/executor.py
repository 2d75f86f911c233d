"""Where rollouts run: the executors of `whale.evaluation.evaluate`, and their config.

An `Executor` (the protocol, in whale.harness.runtime, beside the Runtime that holds one) has
one verb, `stream`: run one harness on many questions for a given Runtime and hand back each
finished run, as `(index, Trajectory)`, in completion order, to the one caller that grades
and records it (the caller stays the single writer of the run directory). Two exist:

- `LocalPool` (the default): a thread pool in this process, each run a fresh jailed worker
  started by `Runtime.run`, model calls brokered here.
- `RayExecutor` (`whale.harness.ray_executor`, `pip install 'whale[ray]'`): Ray actors, each
  running the same isolated Runtime, rebuilt on the actor.

`ExecutorConfig` is the `runtime.executor` part of every command's config
(`--set runtime.executor.kind=ray`); `make_executor` builds what it names, and fails before
any run starts when Ray is asked for and not installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Literal

from whale.config import at_least
from whale.harness.broker import Retriever
from whale.harness.runtime import Executor, ExecutorUnavailable, Rollout, Runtime
from whale.harness.trajectory import Trajectory

ExecutorKind = Literal["local", "ray"]
RAY_MISSING = "the ray executor needs Ray: pip install 'whale[ray]'"


class LocalPool:
    """Today's pool: `workers` threads in this process, each calling `runtime.run` (a fresh
    jailed worker per run). On an interrupt no further run starts, `runtime.cancel()` kills
    the runs in flight, and the exception leaves at once without waiting for them; any other
    exit of the consumer (an exception in its own code, a closed iterator) cancels the queued
    runs and waits for those in flight, as `evaluate` always did."""

    def stream(
        self,
        runtime: Runtime,
        source: str,
        rollouts: Sequence[Rollout],
        workers: int,
        retriever: Retriever | None,
    ) -> Generator[tuple[int, Trajectory], None, None]:
        pool = ThreadPoolExecutor(max_workers=max(1, workers))
        futures: dict[Any, int] = {}
        runtime.expect_runs(len(rollouts))
        try:
            for i, r in enumerate(rollouts):
                futures[pool.submit(runtime.run, source, r.prompt, r.question_id, retriever)] = i
            for fut in as_completed(futures):
                yield futures[fut], fut.result()  # Runtime.run never raises for a harness fault
        except (KeyboardInterrupt, SystemExit):
            pool.shutdown(wait=False, cancel_futures=True)
            runtime.cancel()
            raise
        finally:
            # A cancelled runtime (the interrupt above, or the consumer's own handler that ran
            # cancel() before closing this stream): do not wait for the runs it is killing.
            pool.shutdown(wait=not runtime.cancelled, cancel_futures=True)


@dataclass
class ExecutorConfig:
    """`runtime.executor`: where rollouts run.

    `kind`: "local" (threads in this process; `workers` of the command) or "ray".
    For Ray: `address` None or "local" starts a local cluster of `num_cpus` CPUs (0: the
    machine's, at least `actors`) that whale shuts down when the run ends; "auto" or
    "ray://HOST:PORT" / "HOST:PORT" connects to a running cluster (left running).
    `actors`: rollout actors; `per_actor`: rollouts in flight on each (never more are
    submitted: the backpressure); `actor_start_s`: how long an actor may take to start (a
    cluster without room for it is an error after this, not a hang)."""

    kind: ExecutorKind = "local"
    address: str | None = None
    actors: int = 2
    per_actor: int = 1
    num_cpus: int = 0
    actor_start_s: float = 120.0

    def validate(self) -> None:
        """Ranges, checked by `whale.config.build` (which has checked the types)."""
        if self.kind not in ("local", "ray"):
            raise ValueError(f"kind: unknown {self.kind!r} (local, ray)")
        at_least(self, 1, "actors", "per_actor")
        at_least(self, 0, "num_cpus")
        if self.address in (None, "local") and 0 < self.num_cpus < self.actors:
            raise ValueError(f"num_cpus: a local cluster of {self.num_cpus} CPU(s) has no room "
                             f"for {self.actors} actors (each takes one)")  # fmt: skip
        if not self.actor_start_s > 0:
            raise ValueError(f"actor_start_s: must be greater than 0 (got {self.actor_start_s!r})")
        if self.address is not None and not self.address.strip():
            raise ValueError("address: must not be empty (omit it for a local cluster)")


def remote_fault(model: Any) -> str | None:
    """Why actors on other processes could not call `model` (None: they can), from its type
    alone, before anything starts: what `whale.harness.ray_specs.describe_model` accepts."""
    from whale.models import CachedModel, EmbeddedLlama, Fleet, OpenAICompatible

    if model is None or callable(getattr(model, "resolve_model", None)):
        return None  # no model, or one served later (checked when it is)
    inner = model.inner if isinstance(model, CachedModel) else model
    if isinstance(inner, EmbeddedLlama | OpenAICompatible | Fleet):
        return None
    return (f"the ray executor calls the model from its actors, so it needs an OpenAI-"
            f"compatible server (NAME@URL or endpoints) or an embedded llama.cpp model; "
            f"{getattr(inner, 'name', '?')!r} ({type(inner).__name__}) runs only in this "
            f"process: use runtime.executor.kind=local")  # fmt: skip


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def make_executor(cfg: ExecutorConfig) -> Executor | None:
    """The executor `cfg` names; None for "local" (evaluate's own `LocalPool` of its workers).
    Nothing starts here (a Ray cluster starts on the first stream); a missing Ray is
    `ExecutorUnavailable` now, before any run."""
    cfg.validate()
    if cfg.kind == "local":
        return None
    if not ray_available():
        raise ExecutorUnavailable(RAY_MISSING)
    # Imported here: Ray is optional. ray_executor imports nothing of this module (no cycle).
    from whale.harness.ray_executor import shared_executor

    # One per config and process (its cluster and actors outlive each Runtime; closed at exit)
    return shared_executor(cfg.address, cfg.actors, cfg.per_actor, cfg.num_cpus or None,
                           cfg.actor_start_s)  # fmt: skip

__all__ = ["RAY_MISSING", "Executor", "ExecutorConfig", "ExecutorKind",
           "ExecutorUnavailable", "LocalPool", "Rollout", "make_executor", "ray_available",
           "remote_fault"]  # fmt: skip
