"""One control group per jailed run: the run is killed whole, and its memory and process count
are capped as a whole rather than per process.

Per run, in every hierarchy that is mounted and writable, a folder
`<mount>/<whale's own cgroup>/whale/<pid>.<start time>.<n>`:
- cgroup v2 with `cgroup.kill` (Linux >= 5.14): the kill. Where the v2 `memory` and `pids`
  controllers can be enabled there, also `memory.max`, `memory.swap.max` and `pids.max`
  (that branch is not exercised on the machine the tests were written on, which binds those
  controllers to v1).
- cgroup v1 `memory`: `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap
  is accounted).
- cgroup v1 `pids`: `pids.max`.
The jail's first process joins them before it execs the jail (launcher.py), so everything
the jail starts is inside from its first instruction; a jailed process cannot leave (the cgroup
files belong to root and the jail mounts no /sys). The memory cap counts all of the run: the
jail's own process, every child, and the pages of its tmpfs scratch folder.

Groups left by a whale process that died are killed and removed by the next whale process on
its first run (`reap_stale`). Where no hierarchy is writable (not root, no cgroups) `create`
returns None and the caller falls back to rlimits and a kill by uid.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
from dataclasses import dataclass, field

from whale import procfs

_V1 = ("memory", "pids")


@dataclass(frozen=True)
class _Hierarchy:
    kind: str  # "v2", "memory" or "pids"
    parent: str  # the whale folder under this process's own cgroup


def _own_path(kind: str) -> str | None:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (kind == "v2" and controllers == "") or kind in controllers.split(","):
                return path
    return None


def _hierarchies() -> list[_Hierarchy]:
    found: dict[str, _Hierarchy] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3:
                continue
            root, mount, fstype, options = fields[3], fields[4], rfields[0], rfields[2]
            if fstype == "cgroup2":
                kinds = ["v2"]
            elif fstype == "cgroup":
                kinds = [k for k in _V1 if k in options.split(",")]
            else:
                continue
            for kind in kinds:
                own = _own_path(kind)
                if kind in found or own is None:
                    continue
                if root != "/" and own.startswith(root):
                    own = own[len(root) :]
                base = os.path.join(mount, own.lstrip("/"))
                if kind == "v2" and not os.path.exists(os.path.join(base, "cgroup.procs")):
                    continue
                found[kind] = _Hierarchy(kind, os.path.join(base, "whale"))
    return [found[k] for k in ("v2", "memory", "pids") if k in found]


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


_STATE_LOCK = threading.Lock()
_STATE: dict[str, object] = {}
_COUNTER = itertools.count()


def _usable() -> list[_Hierarchy]:
    """The writable hierarchies, found once per process (a failed mkdir is not retried)."""
    with _STATE_LOCK:
        if "hier" in _STATE:
            return _STATE["hier"]  # type: ignore[return-value]
        usable = []
        if os.geteuid() == 0 and os.path.exists("/proc/self/cgroup"):
            for h in _hierarchies():
                try:
                    os.makedirs(h.parent, exist_ok=True)
                    probe = os.path.join(h.parent, f"probe.{os.getpid()}")
                    os.mkdir(probe)
                    os.rmdir(probe)
                except OSError:
                    continue
                if h.kind == "v2" and not os.path.exists(os.path.join(h.parent, "cgroup.kill")):
                    continue  # a v2 without cgroup.kill buys nothing here
                if h.kind == "v2":
                    _enable_v2_controllers(h.parent)
                usable.append(h)
        _STATE["hier"] = usable
        _STATE["me"] = f"{os.getpid()}.{procfs.start_time('self')}"
    _reap_stale(usable)
    return usable


def _enable_v2_controllers(parent: str) -> None:
    """Best effort: memory and pids for the run folders under `parent` (fails where this
    process's own cgroup holds processes and is not the root, or the controllers are v1's)."""
    for folder in (os.path.dirname(parent), parent):
        try:
            offered = _read(os.path.join(folder, "cgroup.controllers")).split()
            wanted = [f"+{c}" for c in ("memory", "pids") if c in offered]
            if wanted:
                _write(os.path.join(folder, "cgroup.subtree_control"), " ".join(wanted))
        except OSError:
            return


@dataclass
class RunGroup:
    """The cgroup folders of one run."""

    dirs: list[str] = field(default_factory=list)
    kill_file: str | None = None  # v2 cgroup.kill
    events_file: str | None = None
    memory: str | None = None  # "v1" or "v2" where the run's memory is capped as a whole
    pids: bool = False
    join_files: list[str] = field(default_factory=list)  # cgroup.procs of each folder

    def join(self) -> None:
        """Move the calling process in (run in the child between fork and exec)."""
        for path in self.join_files:
            _write(path, "0")

    def kill(self) -> None:
        """SIGKILL to everything in the run's cgroup (v2 `cgroup.kill`). A group already empty
        (most runs: the jail's init died and took its PID namespace with it) is left alone:
        the write takes the kernel's cgroup mutex even then, and waits while other jails
        join their cgroups (below: `remove_later`)."""
        if self.kill_file is not None and not self.empty():
            try:
                _write(self.kill_file, "1")
            except OSError:
                pass

    def empty(self) -> bool:
        try:
            if self.events_file is not None:
                return "populated 0" in _read(self.events_file)
            return all(not _read(os.path.join(d, "cgroup.procs")).strip() for d in self.dirs)
        except OSError:  # unread proves nothing: the uid is then scanned (uids.UidPool.give)
            return False

    def wait_empty(self, timeout_s: float) -> bool:
        deadline, pause = time.monotonic() + timeout_s, 0.0005
        while not self.empty():
            if time.monotonic() >= deadline:
                return False
            self.kill()
            time.sleep(pause)
            pause = min(0.02, pause * 2)
        return True

    def memory_peak(self) -> int | None:
        """Most bytes the run held at once, where the kernel records it."""
        for d in self.dirs:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                try:
                    return int(_read(os.path.join(d, name)))
                except (OSError, ValueError):
                    continue
        return None

    def remove(self) -> None:
        for d in self.dirs:
            try:
                os.rmdir(d)
            except OSError:
                pass  # still populated (the caller kills by uid) or already gone
        self.dirs = []


# -- folders removed off the run's path --------------------------------------------------------
# An rmdir takes the kernel's cgroup mutex, which a jail being started elsewhere (a warm pool's
# filler) holds while it joins its cgroups, each join waiting for an RCU grace period. Timed by
# hand in a run's path, that was about 9 ms of the 17.7 ms a run took past its model's time
# (the median of `python -m benchmarks.run_latency`, whose "before" arm puts it back), after
# the run was over: its group seen empty, its uid given back. So the folders go on a thread of
# their own. A clean exit waits for them (atexit, `flush`); those of a whale killed meanwhile
# are removed by the next whale process (reap_stale).
_SWEEP = threading.Condition()
_PENDING: list[list[str]] = []
_SWEEPER: list[threading.Thread] = []


def remove_later(group: RunGroup) -> None:
    """`group.remove()` on the sweeper thread (its folders are taken from it at once)."""
    dirs, group.dirs = group.dirs, []
    if not dirs:
        return
    with _SWEEP:
        if not _SWEEPER or not _SWEEPER[0].is_alive():
            t = threading.Thread(target=_sweep, name="whale-cgroup-sweeper", daemon=True)
            try:
                t.start()
            except RuntimeError:  # no new thread at interpreter shutdown (Python >= 3.12)
                RunGroup(dirs=dirs).remove()  # an atexit handler's (a warm pool's close)
                return
            _SWEEPER[:] = [t]
        _PENDING.append(dirs)
        _SWEEP.notify_all()


def flush(timeout_s: float = 10.0) -> bool:
    """Wait until every folder given to `remove_later` was removed (or failed to be); False
    if that took longer than `timeout_s`."""
    with _SWEEP:
        return _SWEEP.wait_for(lambda: not _PENDING, timeout_s)


def _sweep() -> None:
    while True:
        with _SWEEP:
            _SWEEP.wait_for(lambda: bool(_PENDING))
            dirs = _PENDING[0]
        RunGroup(dirs=dirs).remove()
        with _SWEEP:
            _PENDING.pop(0)
            _SWEEP.notify_all()


def _after_fork_in_child() -> None:  # the sweeper thread is not in the child
    global _SWEEP
    _SWEEP = threading.Condition()
    _PENDING.clear()
    _SWEEPER.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(flush)


def create(memory_mb: int, processes: int) -> RunGroup | None:
    """A new run group capped at `memory_mb` MiB and `processes` tasks; None where no
    hierarchy is writable."""
    hier = _usable()
    if not hier:
        return None
    g = RunGroup()
    name = f"{_STATE['me']}.{next(_COUNTER)}"
    limit = str(memory_mb * 1024 * 1024)
    try:
        for h in hier:
            d = os.path.join(h.parent, name)
            os.mkdir(d)
            g.dirs.append(d)
            g.join_files.append(os.path.join(d, "cgroup.procs"))
            if h.kind == "v2":
                g.kill_file = os.path.join(d, "cgroup.kill")
                g.events_file = os.path.join(d, "cgroup.events")
                if os.path.exists(os.path.join(d, "memory.max")):
                    _write(os.path.join(d, "memory.max"), limit)
                    if os.path.exists(os.path.join(d, "memory.swap.max")):
                        _write(os.path.join(d, "memory.swap.max"), "0")
                    g.memory = "v2"
                if os.path.exists(os.path.join(d, "pids.max")):
                    _write(os.path.join(d, "pids.max"), str(processes))
                    g.pids = True
            elif h.kind == "memory" and g.memory is None:
                _write(os.path.join(d, "memory.limit_in_bytes"), limit)
                memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    _write(memsw, limit)
                g.memory = "v1"
            elif h.kind == "pids" and not g.pids:
                _write(os.path.join(d, "pids.max"), str(processes))
                g.pids = True
    except OSError:
        g.remove()
        raise
    return g


def reap_stale() -> list[str]:
    """Kill and remove the run groups of whale processes that no longer exist (done by every
    whale process on its first run); the folders removed."""
    return _reap_stale(_usable())


def _reap_stale(hier: list[_Hierarchy]) -> list[str]:
    removed = []
    for h in hier:
        try:
            names = os.listdir(h.parent)
        except OSError:
            continue
        for name in names:
            pid, _, rest = name.partition(".")
            start = rest.partition(".")[0]
            if not pid.isdigit() or procfs.start_time(pid) == start:
                continue  # not a run folder, or its whale is alive
            d = os.path.join(h.parent, name)
            g = RunGroup(dirs=[d])
            if h.kind == "v2":
                g.kill_file = os.path.join(d, "cgroup.kill")
                g.events_file = os.path.join(d, "cgroup.events")
            if g.kill_file is not None:  # v1 folders are emptied by the uid pool, then rmdir'd
                g.kill()
                g.wait_empty(1.0)
            g.remove()
            if not os.path.exists(d):
                removed.append(d)
    return removed
