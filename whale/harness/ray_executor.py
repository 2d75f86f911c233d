"""Rollouts on Ray actors (`runtime.executor.kind = "ray"`, `pip install 'whale[ray]'`).

Each actor holds a Runtime rebuilt from a picklable description of the driver's
(`RuntimeSpec`: budget, limits, python tool limits, sandbox, sampling, and `ModelSpec`, the
solver's OpenAI-compatible URL), so a rollout on an actor is the same fresh jailed worker as
a local one, its model calls brokered by the actor. Only the trajectory comes back; grading
and recording stay in the driver (`whale.evaluation`). The driver keeps at most `per_actor`
rollouts in flight on each actor (the rest wait in the driver, never all N submitted) and
takes results with `ray.wait` as they finish. The allowed packages (`runtime.packages`) go
as the folder the driver built: the actors mount it from the same path.

Failures: an actor process that dies (OOM, SIGKILL, a lost node) costs only its in-flight
rollouts; each is run once more on a replacement actor and its trajectory says `retries=1`;
lost a second time, it is a `crashed` trajectory, "ray worker lost twice ...". A rollout's
model calls made before a loss were paid and are paid again by the retry; they are counted:
each actor's broker reports the tokens of every completion it receives, as the call returns,
to a tally actor of the driver (keyed by stream, rollout and try), and the tokens of a lost
try are added to the rollout's trajectory (`lost_tokens`, in `tokens()` and so in the
ledger's tokens). Not covered there: a completion received in the instant before the actor
died, whose report had not reached the tally. `Runtime.cancel()`
(and Ctrl-C in `evaluate`) cancels the in-flight tasks and kills the actors at once (their
jailed workers die with them: the jails' parent-death signal) when no other stream is using
them; when other streams are (Runtimes of one config share one executor), only the cancelled
stream's rollouts stop: queued ones are dropped, running ones finish unread on their actors
and keep their places until then.

The model: an OpenAI-compatible backend is handed over as its URL (and API key, sent
through Ray to the actors); an embedded llama.cpp model is started on the driver and handed
over as `name@http://127.0.0.1:PORT/v1`, so actors then call it directly (its calls are not
queued one at a time by the driver as local runs' are; the server still answers one at a
time, and a call's timeout then includes its wait). A response cache (CachedModel) is opened
by each actor at the same path, keyed by the same backend name. A model that only exists in
this process (a transformers checkpoint, a test double) is ExecutorUnavailable.

The cluster: `address` None or "local" starts a local cluster (`num_cpus`, no dashboard) that
`close()` and an atexit hook shut down; when Ray was already initialized in this process
(a test's shared cluster), that one is used and left running; any other address connects
to a running cluster, which is left running (only this executor's actors are killed).
After the driver is SIGKILLed, gcs_server, raylet, the actors and their jails exit by
themselves, but Ray's DashboardAgent and RuntimeEnvAgent were seen to live on far longer
(ray 2.60, docs/measurements.md). So a local cluster comes with a reaper
(whale.harness.ray_support, beside the tally of a lost try's tokens), a small
process that waits on a pipe from the driver and, once it closes (the driver ended in any
way), SIGKILLs the cluster's processes that were up after `ray.init` (pid and start time),
and the workers started later, found by the node id on their command line (a worker the
tally actor needed outlived the driver by more than 5 s before): nothing is left 5 s after
the SIGKILL (tests/harness/test_ray_executor.py).
Not covered: a connected cluster (not started by whale) is never reaped; what Ray does there
with the actors of a SIGKILLed driver was not measured.

A multi-node cluster needs, on every node: the same Python and whale installed (actors
import whale; nothing is shipped by runtime_env), a jail backend (nsjail or bubblewrap), the
folder of `runtime.packages` at the driver's path (a rollout on a node without it is
`crashed`, saying so),
the model server reachable at the URL the driver has (a server listening on 127.0.0.1 is
reachable only on the driver's node, so actors are then placed on the driver's node; serve
the model on a routable address for them to spread), the retriever picklable (it is put
in the object store once per `stream`), and the environment the workers need (WHALE_CACHE,
API keys other than the one sent) set on the nodes: the driver's environment is not copied.
Not covered: a node lost between `ray.wait` and `ray.get` of a result is a loss like any
other; a cluster that never has room for an actor is ExecutorUnavailable after
`actor_start_s`.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, TaskCancelledError

from whale.harness.broker import Retriever, harness_hash
from whale.harness.ray_specs import ModelSpec, RuntimeSpec, describe_model
from whale.harness.ray_support import Reporting, Tally, descendants, start_reaper, take
from whale.harness.runtime import ExecutorUnavailable, Rollout, Runtime
from whale.harness.trajectory import Status, Trajectory

# How long one ray.wait blocks: the loop checks cancel() and lets signals in between.
POLL_S = 0.1


class _RolloutActor:
    """Runs rollouts on a Runtime built from the spec each call brings (rebuilt when it
    changes: WHALE swaps the solver's adapter between evaluations)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spec: RuntimeSpec | None = None
        self._rt: Runtime | None = None
        self._retrievers: dict[str, Any] = {}
        self._current = threading.local()  # (tally, key) of the try this thread runs

    def pid(self) -> int:
        return os.getpid()

    def _runtime(self, spec: RuntimeSpec) -> Runtime:
        with self._lock:
            if self._rt is None or self._spec != spec:
                old, self._rt, self._spec = self._rt, spec.build(), spec
                if self._rt.model is not None:
                    self._rt.model = Reporting(self._rt.model, self._current)
                if old is not None:
                    old.close()  # its runs in flight keep their own workers
            return self._rt

    def run(self, spec: RuntimeSpec, source: str, prompt: str, question_id: str,
            retriever: list[Any] | None, report: tuple[Any, str] | None = None,
            ) -> Trajectory:  # fmt: skip
        rt = self._runtime(spec)
        r = None
        if retriever is not None:  # [ObjectRef], boxed so that Ray does not fetch it per call
            key = retriever[0].hex()
            with self._lock:
                if key not in self._retrievers:
                    self._retrievers = {key: ray.get(retriever[0])}
                r = self._retrievers[key]
        self._current.report = report
        try:
            return rt.run(source, prompt, question_id, r)
        finally:
            self._current.report = None


@dataclass
class _Slot:
    actor: Any
    pid: int
    running: dict[Any, str] = field(default_factory=dict)  # ObjectRef -> question id
    # Refs of streams that stopped reading them (closed early, cancelled while another stream
    # shares the actors): still running on the actor, so they keep their place until done.
    orphans: set[Any] = field(default_factory=set)
    dead: bool = False  # lost: takes no new rollouts; dropped once its running ones are back


_Actor: Any = ray.remote(_RolloutActor)
_TallyActor: Any = ray.remote(Tally)


# The reaper of a local cluster this process started and has not shut down.
_STARTED: list[subprocess.Popen[str] | None] = []


def _shutdown_local() -> None:
    if _STARTED and ray.is_initialized():
        ray.shutdown()
    for reaper in _STARTED:
        if reaper is not None and reaper.stdin is not None:
            reaper.stdin.close()  # it kills what shutdown left, and exits
            reaper.wait(timeout=10)
    _STARTED.clear()


class RayExecutor:
    """Rollouts on `actors` Ray actors, `per_actor` in flight on each (see the module)."""

    def __init__(self, address: str | None = None, actors: int = 2, per_actor: int = 1,
                 num_cpus: int | None = None, actor_start_s: float = 120.0) -> None:  # fmt: skip
        self.address = None if address in (None, "local") else address
        self.actors, self.per_actor = actors, per_actor
        self.num_cpus, self.actor_start_s = num_cpus, actor_start_s
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._starting = threading.Lock()
        self._streams = 0  # streams running now (several threads may share this executor)
        self._owns = False
        self._tally: Any = None  # the Tally actor, made with the first stream
        # Made by make_executor for a config: shared by every Runtime of this process with
        # that config, so Runtime.close() leaves it running; closed at exit.
        self.shared = False

    # -- cluster and actors ------------------------------------------------------------------
    def _connect(self) -> None:
        if ray.is_initialized():
            return
        if self.address is None:
            n = self.num_cpus or max(os.cpu_count() or 1, self.actors)
            before = set(descendants(os.getpid())) if os.path.isdir("/proc") else set()
            ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)  # fmt: skip
            self._owns = True
            if not _STARTED:
                _STARTED.append(start_reaper(before))
                atexit.register(_shutdown_local)
        else:
            ray.init(address=self.address, log_to_driver=False, configure_logging=False)

    def _start_actors(self, spec: RuntimeSpec) -> None:
        """Fill the slots up to `actors`, waiting until each new actor answers (one stream at
        a time: two streams that both lost an actor start one replacement, not two)."""
        with self._starting:
            self._start_actors_now(spec)

    def _start_actors_now(self, spec: RuntimeSpec) -> None:
        options: dict[str, Any] = {"num_cpus": 1, "max_concurrency": self.per_actor,
                                   "max_restarts": 0, "max_task_retries": 0}  # fmt: skip
        if spec.model is not None and spec.model.loopback():
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(here, soft=False)
        with self._lock:
            missing = self.actors - sum(not s.dead for s in self._slots)
        new = [_Actor.options(**options).remote() for _ in range(missing)]
        if not new:
            return
        try:
            pids = ray.get([a.pid.remote() for a in new], timeout=self.actor_start_s)
        except GetTimeoutError:
            for a in new:
                ray.kill(a, no_restart=True)
            raise ExecutorUnavailable(
                f"ray: {len(new)} actor(s) not started after {self.actor_start_s:g} s (does "
                f"the cluster have {len(new)} free CPU(s)?)"
            ) from None
        with self._lock:
            self._slots += [_Slot(a, int(p)) for a, p in zip(new, pids, strict=True)]

    def actor_pids(self) -> list[int]:
        """Process ids of the live actors (on their nodes)."""
        with self._lock:
            return [s.pid for s in self._slots if not s.dead]

    def in_flight(self) -> dict[int, list[str]]:
        """Question ids of the rollouts in flight, by actor pid."""
        with self._lock:
            return {s.pid: list(s.running.values()) for s in self._slots}

    def cancel(self) -> None:
        """Cancel the in-flight tasks and kill every actor now (no waiting)."""
        with self._lock:
            slots, self._slots = self._slots, []
        for s in slots:
            for ref in s.running:
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001, S110 - it is being killed anyway
                    pass
            try:
                ray.kill(s.actor, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - already dead
                pass

    def close(self) -> None:
        """Kill the actors; shut down the local cluster if this executor started it. A shared
        executor (make_executor's) is closed only at exit (`close_shared`)."""
        if not self.shared:
            self.shutdown()

    def shutdown(self) -> None:
        if ray.is_initialized():
            self.cancel()
            if self._tally is not None:
                try:
                    ray.kill(self._tally, no_restart=True)
                except Exception:  # noqa: BLE001, S110 - already gone
                    pass
        self._tally = None
        if self._owns:
            self._owns = False
            _shutdown_local()

    # -- the verb ------------------------------------------------------------------------------
    def stream(
        self,
        runtime: Runtime,
        source: str,
        rollouts: Sequence[Rollout],
        workers: int,
        retriever: Retriever | None,
    ) -> Generator[tuple[int, Trajectory], None, None]:
        """See `Executor.stream`. `workers` is not used: `actors` x `per_actor` bound the
        rollouts in flight, shared by every stream of this executor (several threads may
        stream at once: each waits only on its own rollouts). Closing a stream early cancels
        its own rollouts; a cancel or an interrupt kills the actors when no other stream uses them
        (started again by the next stream), else stops only this stream's rollouts."""
        h = harness_hash(source)
        if runtime.cancelled:
            for i, r in enumerate(rollouts):
                yield i, _stopped(r, h, "killed", "cancelled")
            return
        spec = RuntimeSpec.of(runtime, self.per_actor)  # refuses a model actors cannot call
        self._connect()
        self._drop_idle_dead()  # an actor that died while idle must not cost anyone a try
        self._start_actors(spec)
        try:
            box = None if retriever is None else [ray.put(retriever)]
        except Exception as e:  # noqa: BLE001 - pickling a user's object fails in many ways
            raise ExecutorUnavailable(f"ray: the task's retriever cannot be sent to the "
                                      f"actors ({type(e).__name__}: {e})") from None  # fmt: skip
        queue, tries = deque(range(len(rollouts))), [0] * len(rollouts)
        lost_tokens = [0] * len(rollouts)  # paid by tries whose actor died
        tally = self._tally_actor()
        token = f"{uuid.uuid4().hex}/"  # this stream's keys in the tally: token/index/try
        mine: dict[Any, tuple[_Slot, int]] = {}  # this stream's refs in flight
        # On cancel(), from any thread: kill the actors at once if this stream is alone on
        # them; else the loop below drops only its own rollouts at its next turn (<= POLL_S).
        remove_hook = runtime.on_cancel(self._on_cancel)
        with self._lock:
            self._streams += 1
        finished = False
        try:
            while queue or mine:
                if runtime.cancelled:  # cancel() from elsewhere: the rest end as killed
                    flying = [i for _, i in mine.values()]
                    self._orphan(mine)
                    for i in [*flying, *queue]:
                        yield i, _stopped(rollouts[i], h, "killed", "cancelled")
                    queue.clear()
                    break
                self._submit(queue, mine, spec, source, rollouts, box,
                             lambda i: None if tally is None else (tally, f"{token}{i}/{tries[i]}"))
                if not mine:  # every slot is busy with other streams' rollouts, or gone
                    if self._live() < self.actors:
                        self._start_actors(spec)  # killed by another stream's cancel
                    time.sleep(POLL_S / 10)
                    continue
                ready, _ = ray.wait(list(mine), num_returns=1, timeout=POLL_S)
                if ready:
                    more, _ = ray.wait(list(mine), num_returns=len(mine), timeout=0)
                    ready = list({*ready, *more})
                lost = False
                for ref in ready:
                    slot, i = mine.pop(ref)
                    with self._lock:
                        slot.running.pop(ref, None)
                    try:
                        traj: Trajectory = ray.get(ref)
                    except RayActorError as e:
                        lost = True
                        slot.dead = True
                        lost_tokens[i] += take(tally, f"{token}{i}/{tries[i]}")
                        if runtime.cancelled:
                            t = _stopped(rollouts[i], h, "killed", "cancelled")
                        elif tries[i] == 0:
                            tries[i] = 1
                            queue.appendleft(i)
                            continue
                        else:
                            why = str(e).strip().splitlines()[0][:300] if str(e) else ""
                            t = _stopped(rollouts[i], h, "crashed",
                                         f"ray worker lost twice (the actor running this "
                                         f"rollout died on both tries): {why}")  # fmt: skip
                        t.retries, t.lost_tokens = tries[i], lost_tokens[i]
                        yield i, t
                        continue
                    except TaskCancelledError:
                        yield i, _stopped(rollouts[i], h, "killed", "cancelled")
                        continue
                    except Exception as e:  # noqa: BLE001 - the actor's own code failed
                        yield i, _stopped(rollouts[i], h, "crashed",
                                          f"ray: {type(e).__name__}: {str(e)[:1000]}")  # fmt: skip
                        continue
                    traj.retries, traj.lost_tokens = tries[i], lost_tokens[i]
                    yield i, traj
                with self._lock:
                    self._slots = [s for s in self._slots if not (s.dead and not s.running)]
                    for s in self._slots:
                        if s.dead:
                            s.orphans.clear()  # died with their actor
                if lost and not runtime.cancelled:
                    self._start_actors(spec)  # replacements for the lost ones
            finished = True
        except (KeyboardInterrupt, SystemExit):
            self._stop_stream(mine)
            runtime.cancel()
            raise
        finally:
            remove_hook()
            with self._lock:
                self._streams -= 1
            if not finished:  # a closed stream: stop what runs for nobody (only its own)
                self._orphan(mine)
            if tally is not None:  # the counts of tries that were not lost
                try:
                    tally.drop.remote(token)
                except Exception:  # noqa: BLE001, S110 - the cluster is gone
                    pass

    def _tally_actor(self) -> Any:
        """The tally of this executor's streams (None when it cannot be made: the tokens of
        lost tries are then not counted, the rollouts run as before)."""
        with self._lock:
            if self._tally is None:
                try:
                    self._tally = _TallyActor.options(num_cpus=0).remote()
                except Exception:  # noqa: BLE001 - accounting only
                    return None
            return self._tally

    def _cancel_if_alone(self) -> bool:
        """Kill the actors if at most one stream runs on them (a running rollout cannot be
        cancelled on its actor; killing the actor kills its jail at once; the next stream
        starts new actors). With other streams on them, leave them: the stopping stream
        cancels its own refs only (the running ones finish unread and keep their places until
        then), so the other streams lose nothing. Takes only this executor's lock."""
        with self._lock:
            alone = self._streams <= 1
        if alone:
            self.cancel()
        return alone

    def _on_cancel(self) -> None:
        self._cancel_if_alone()

    def _stop_stream(self, mine: dict[Any, tuple[_Slot, int]]) -> None:
        """Stop one stream's rollouts now, from its own thread (Ctrl-C in it)."""
        if not self._cancel_if_alone():
            self._orphan(mine)

    def _orphan(self, mine: dict[Any, tuple[_Slot, int]]) -> None:
        for ref, (slot, _) in list(mine.items()):
            try:
                ray.cancel(ref)  # a queued one is dropped; a running one finishes unread
            except Exception:  # noqa: BLE001, S110 - already done
                pass
            with self._lock:
                if slot.running.pop(ref, None) is not None:
                    slot.orphans.add(ref)
        mine.clear()

    def _live(self) -> int:
        with self._lock:
            return sum(not s.dead for s in self._slots)

    def _drop_idle_dead(self) -> None:
        """Ping every actor; the ones that do not answer (died while no rollout ran on them)
        are dropped now, before any rollout is sent to them."""
        with self._lock:
            slots = [s for s in self._slots if not s.dead and not s.running and not s.orphans]
        if not slots:  # busy actors are not pinged (a ping would wait behind their rollouts)
            return
        pings = {s.actor.pid.remote(): s for s in slots}
        ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=2.0)
        for ref, s in pings.items():
            if ref not in ready:
                continue  # busy or slow: it keeps its slot
            try:
                ray.get(ref)
            except RayActorError:
                s.dead = True
        with self._lock:
            self._slots = [s for s in self._slots if not (s.dead and not s.running)]

    def _submit(self, queue: deque[int], mine: dict[Any, tuple[_Slot, int]],
                spec: RuntimeSpec, source: str, rollouts: Sequence[Rollout],
                box: list[Any] | None,
                report: Callable[[int], tuple[Any, str] | None]) -> None:  # fmt: skip
        with self._lock:
            for s in self._slots:
                if s.orphans:  # finished orphans free their places
                    done, _ = ray.wait(list(s.orphans), num_returns=len(s.orphans), timeout=0)
                    s.orphans.difference_update(done)
                while queue and not s.dead and len(s.running) + len(s.orphans) < self.per_actor:
                    i = queue.popleft()
                    r = rollouts[i]
                    ref = s.actor.run.remote(spec, source, r.prompt, r.question_id, box,
                                             report(i))  # fmt: skip
                    s.running[ref] = r.question_id
                    mine[ref] = (s, i)


_SHARED: dict[tuple[Any, ...], RayExecutor] = {}
_SHARED_LOCK = threading.Lock()


def shared_executor(address: str | None, actors: int, per_actor: int, num_cpus: int | None,
                    actor_start_s: float) -> RayExecutor:  # fmt: skip
    """One RayExecutor per config in this process: the runtimes a command makes one after the
    other (a weight phase makes one per sample group) reuse its cluster and actors instead of
    starting their own. Shut down at exit."""
    key = (address, actors, per_actor, num_cpus, actor_start_s)
    with _SHARED_LOCK:
        ex = _SHARED.get(key)
        if ex is None:
            ex = _SHARED[key] = RayExecutor(address, actors, per_actor, num_cpus, actor_start_s)
            ex.shared = True
            if len(_SHARED) == 1:
                atexit.register(close_shared)
        return ex


def close_shared() -> None:
    with _SHARED_LOCK:
        shared = list(_SHARED.values())
        _SHARED.clear()
    for ex in shared:
        ex.shutdown()


def _stopped(r: Rollout, h: str, status: Status, error: str) -> Trajectory:
    t = Trajectory(question_id=r.question_id, harness_hash=h, status=status, error=error)
    t.started_at = time.time()
    return t


__all__ = ["ModelSpec", "RayExecutor", "RuntimeSpec", "close_shared", "describe_model",
           "shared_executor"]
