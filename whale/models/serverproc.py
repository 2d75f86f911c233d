"""Child server processes that cannot outlive the process that started them.

Three layers, because no single one covers every way a whale process ends:

1. Parent-death signal. The server is started through a tiny exec wrapper that calls
   `prctl(PR_SET_PDEATHSIG, SIGKILL)` on itself, checks that its parent is still the process
   that started it, and then execs the server (the setting survives `execve` of a binary that
   is not set-user-ID). Linux sends the signal when the *thread* that forked the child exits,
   not the process, so every server is forked by one long-lived daemon thread of this module
   (`spawn`): a server forked from a pool thread that later ends would be killed with it.
   This covers kill -9 of the owner.
2. `kill_group` on SIGTERM and on close (the server leads its own process group), done by
   the owner.
3. A registry of running servers, one JSON file per server in `registry_dir()`: owner pid
   and start time, server pid, start time and command line. `reap_stale()` kills the
   recorded servers whose owner is dead, but only when the live process with that pid has
   exactly the recorded start time and command line and is an embedded llama server, python
   or native (`is_server_cmd`; so a reused pid is never killed), and removes records that
   no longer name a live server.

Not covered: a server whose owner runs in another pid namespace that shares the cache folder
is seen as ownerless only if its pid means the same process here, which the start-time check
makes practically impossible, so it is left alone; servers started by whale versions without
the registry are not found.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from whale import procfs
from whale.models.native import is_native_cmd

# Runs as `python -I -S -c PRELUDE PARENT_PID CMD...`: set the parent-death signal, give up if
# the parent died before that (the signal would then never come), exec the real command.
_PRELUDE = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0) != 0:\n"  # PR_SET_PDEATHSIG=1
    "    sys.exit('prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('parent exited before the server started')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)

_SERVER_MODULES = ("whale.models.llama_server", "llama_cpp.server")


def registry_dir() -> Path:
    """`servers/` beside the model cache (`$WHALE_CACHE`, else `$XDG_CACHE_HOME/whale`, else
    `~/.cache/whale`): every whale process of a user shares it."""
    root = os.environ.get("WHALE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "whale"
    )
    return Path(root) / "servers"


# --- spawning -----------------------------------------------------------------------------


class _Spawner:
    """One daemon thread that forks every server, so that the parent-death signal is tied
    to a thread that lives as long as the process."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[bytes]]]]
        self._jobs = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="whale-server-spawner", daemon=True
                )
                self._thread.start()
        fut: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((cmd, kwargs, fut))
        return fut.result()

    def _loop(self) -> None:
        while True:
            cmd, kwargs, fut = self._jobs.get()
            try:
                fut.set_result(subprocess.Popen(cmd, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)


_spawner = _Spawner()


def spawn(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start `cmd` (argv, `cmd[0]` an absolute path) in a new session, with SIGKILL as its
    parent-death signal. After the exec, `/proc/PID/cmdline` is exactly `cmd`."""
    wrapper = [sys.executable, "-I", "-S", "-c", _PRELUDE, str(os.getpid()), *cmd]
    return _spawner.popen(wrapper, start_new_session=True, **kwargs)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group that `pid` leads (the server's own session); never raises."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --- /proc --------------------------------------------------------------------------------


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot), or None if there is no such pid."""
    start = procfs.start_time(pid)
    return None if start is None else int(start)


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return [a.decode(errors="surrogateescape") for a in raw.split(b"\0")[:-1]]


def _alive(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def is_server_cmd(cmd: list[str]) -> bool:
    """An embedded llama server's command line: `PYTHON -m whale.models.llama_server ...` (or
    `llama_cpp.server`), or the native `.../llama-server[-VERSION] --model ...`."""
    if len(cmd) >= 3 and cmd[1] == "-m" and cmd[2] in _SERVER_MODULES:
        return True
    return is_native_cmd(cmd)


# --- registry -----------------------------------------------------------------------------


def register(proc: subprocess.Popen[bytes], cmd: list[str]) -> Path | None:
    """Record a started server; returns the record's path (None if it could not be written:
    the parent-death signal still holds)."""
    record = {
        "owner_pid": os.getpid(),
        "owner_start": start_time(os.getpid()),
        "server_pid": proc.pid,
        "server_start": start_time(proc.pid),
        "cmdline": cmd,
    }
    folder = registry_dir()
    path = folder / f"{proc.pid}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{proc.pid}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def unregister(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def reap_stale() -> list[int]:
    """Kill the recorded servers whose owner is dead; returns their pids. Records of servers
    that are gone, malformed or unreadable are removed; records of live owners are kept."""
    killed: list[int] = []
    try:
        paths = sorted(registry_dir().glob("*.json"))
    except OSError:
        return killed
    for path in paths:
        try:
            rec = json.loads(path.read_text())
            owner, owner_start = int(rec["owner_pid"]), rec["owner_start"]
            pid, server_start, cmd = int(rec["server_pid"]), rec["server_start"], rec["cmdline"]
        except (OSError, ValueError, KeyError, TypeError):
            unregister(path)
            continue
        if _alive(owner, owner_start):
            continue
        if (
            isinstance(cmd, list)
            and is_server_cmd(cmd)
            and _alive(pid, server_start)
            and cmdline(pid) == cmd
        ):
            kill_group(pid)
            killed.append(pid)
        unregister(path)
    return killed
