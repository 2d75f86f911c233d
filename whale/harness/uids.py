"""Unprivileged uids for jailed runs, shared by every whale process on the machine.

As root each jailed run gets a uid of its own from [BASE, BASE + SIZE), so that RLIMIT_NPROC
counts that run alone and a kill by uid reaches all of it. A uid is held by an exclusive
`flock` on LOCK_DIR/<uid> (a root-owned folder, mode 0700) for the whole run; the kernel drops
the lock when its holder exits, so the uids of a whale killed with -9 free themselves.

A uid goes back to the pool only empty: when it is given back, the run's cgroup was seen empty
after the kill, or else /proc is scanned (no process has it as real, effective, saved or
filesystem uid) and what is found is killed (`kill_uid`) and the check repeated. A uid that
cannot be emptied within `empty_timeout_s` stays locked by this process and is never handed out
again (`UidPool.quarantined`; `leftovers()` names its processes).

The lock file remembers it: its one byte is CLEAN once its last holder saw the uid empty, and
BUSY from the moment a holder takes it. Taking a CLEAN uid needs no /proc scan (a scan reads
every process's status: 2.6 ms of whale's CPU per run with 114 processes on the machine, more
with more, by `python -m benchmarks.jail_start`); a BUSY or unmarked one, left by a holder
that died or quit before giving it back, is scanned and emptied first. No process of a pool
uid can appear without a holder: only root makes one (a whale run, which holds the lock).

Not covered: a uid outside the range used by something else on the machine (pick BASE so the
range is free); a process stuck in uninterruptible sleep cannot be killed by anyone; a whale
from before the marks, running on the same machine, takes CLEAN uids without marking them
BUSY, so a run it leaves behind when it dies is found only by the reaping of stale run cgroups
(cgroups.py), not by this check.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

BASE, SIZE = 200_000, 4096
CLEAN, BUSY = b"c", b"b"  # the lock file's one byte: its last holder saw the uid empty, or not


class UidPoolError(RuntimeError):
    pass


def lock_dir() -> str:
    """The folder every whale process of this machine agrees on: /run where it exists (a
    tmpfs, emptied at boot), else /tmp."""
    root = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else "/tmp"
    return os.path.join(root, "whale-uids")


def _secure_dir(path: str) -> None:
    """Create `path` 0700, and refuse it if someone else could have planted or changed it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise UidPoolError(
            f"{path} must be a folder owned by uid {os.geteuid()} that no one else can write"
        )


# -- /proc --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Proc:
    pid: int
    uid: int
    state: str  # the letter of /proc/PID/status State: R, S, D, Z, T, ...
    name: str


def scan(uids: Iterable[int] | range) -> list[Proc]:
    """Every process (zombies too: they still count for RLIMIT_NPROC) that has one of `uids`
    as its real, effective, saved or filesystem uid. About 10 us a process."""
    wanted: range | set[int] | frozenset[int] = (
        uids if isinstance(uids, range | set | frozenset) else set(uids)
    )
    found: list[Proc] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{entry}/status", os.O_RDONLY)
        except OSError:
            continue
        try:
            head = os.read(fd, 1024)
        except OSError:
            continue
        finally:
            os.close(fd)
        at = head.find(b"\nUid:")
        if at < 0:
            continue
        ids = head[at + 5 : head.find(b"\n", at + 5)].split()
        hit = next((u for u in map(int, ids) if u in wanted), None)
        if hit is None:
            continue
        st = head.find(b"\nState:")
        state = head[st + 7 : st + 12].strip()[:1].decode() if st >= 0 else "?"
        name = head[5 : head.find(b"\n")].strip().decode("utf-8", "replace")
        found.append(Proc(int(entry), hit, state, name))
    return found


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid`: a forked helper becomes `uid` and calls kill(-1), which
    reaches every process whose real or saved uid is `uid` (in every PID namespace) and never
    the caller. Needs root."""
    pid = os.fork()
    if pid == 0:  # the child only makes raw system calls, then leaves without cleanup
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:  # nothing of this uid is left
                pass
            code = 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def empty_uid(uid: int, timeout_s: float) -> bool:
    """Kill `uid`'s processes until none is left (zombies wait for their reaper). False if some
    are still there after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        left = scan((uid,))
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        if any(p.state != "Z" for p in left):
            kill_uid(uid)
        time.sleep(pause)
        pause = min(0.05, pause * 2)


# -- the pool -----------------------------------------------------------------------------------
@dataclass
class UidLease:
    uid: int
    fd: int  # holds the flock


class UidPool:
    def __init__(
        self,
        base: int = BASE,
        size: int = SIZE,
        directory: str | None = None,
        empty_timeout_s: float = 5.0,
    ) -> None:
        self.base, self.size, self.empty_timeout_s = base, size, empty_timeout_s
        self.directory = directory or lock_dir()
        self._cursor = 0
        self._lock = threading.Lock()
        self._ready = False
        # uid -> the locked fd, held until this process exits: never reused.
        self.quarantined: dict[int, int] = {}

    @property
    def uids(self) -> range:
        return range(self.base, self.base + self.size)

    def _try_lock(self, uid: int) -> int | None:
        path = os.path.join(self.directory, str(uid))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def take(self) -> UidLease:
        """A uid no other run of any whale process holds, with no process left on it."""
        with self._lock:
            if not self._ready:
                _secure_dir(self.directory)
                self._ready = True
            start = self._cursor
            self._cursor = (self._cursor + 1) % self.size
        for i in range(self.size):
            # Round robin from a moving start: a uid just given back is the last one retried,
            # which leaves its zombies time to be reaped.
            uid = self.base + (start + i) % self.size
            if uid in self.quarantined:
                continue
            fd = self._try_lock(uid)
            if fd is None:
                continue
            try:
                clean = os.pread(fd, 1, 0) == CLEAN
                if not clean and scan((uid,)) and not empty_uid(uid, self.empty_timeout_s):
                    self._quarantine(uid, fd)
                    continue
                # Before any process of this uid can exist: a holder that dies leaves it BUSY.
                if os.pwrite(fd, BUSY, 0) != 1:
                    raise OSError(f"cannot mark uid {uid} busy")
            except OSError as e:
                os.close(fd)  # unmarked, so unused: its mark still tells the truth
                raise UidPoolError(f"uid lock file {uid}: {e}") from e
            with self._lock:
                self._cursor = (uid - self.base + 1) % self.size
            return UidLease(uid, fd)
        raise UidPoolError(
            f"no free sandbox uid in {self.base}..{self.base + self.size - 1} "
            "(too many concurrent runs on this machine)"
        )

    def give(self, lease: UidLease, known_empty: bool = False) -> bool:
        """Back to the pool once nothing of it is alive; False (and never reused) if it cannot
        be emptied. `known_empty`: the run's cgroup was seen empty after the kill, which
        spares the /proc scan (every process of the uid was in that cgroup, since it was
        empty when taken and a jailed process cannot leave its cgroup)."""
        if lease.fd < 0:
            return True
        fd, lease.fd = lease.fd, -1
        if (
            not known_empty
            and scan((lease.uid,))
            and not empty_uid(lease.uid, self.empty_timeout_s)
        ):
            self._quarantine(lease.uid, fd)  # stays BUSY, and locked by this process
            return False
        try:
            os.pwrite(fd, CLEAN, 0)  # the next holder need not scan (if this fails: it scans)
        except OSError:
            pass
        os.close(fd)  # drops the flock
        return True

    def _quarantine(self, uid: int, fd: int) -> None:
        with self._lock:
            self.quarantined[uid] = fd


POOL = UidPool()
