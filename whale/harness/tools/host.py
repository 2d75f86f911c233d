"""The tools process, seen from whale: `ToolHost` starts it, sends it calls, ends it.

One tools process per Runtime with user tools (child.py), started on the first need (a
run's first tool call, `Runtime.tool_specs()`; `make_runtime` asks at once, so a tool that
does not import is a ConfigError before any run) and ended by `Runtime.close()`, by an atexit
hook, and on kill -9 of whale by its parent-death signal (it is spawned like the model
servers, `whale.models.serverproc.spawn`, by a thread that lives as long as whale). It talks
to whale over two pipes and nothing else: no socket, and the pipes are not inheritable, so no
jailed worker holds them; a harness reaches a tool only through the broker.

Calls from many broker threads overlap: each gets a request id, a reader thread hands each
reply to its caller, and a caller waits at most the call's timeout (then its harness gets an
error). A callable that hangs keeps its thread in the tools process: once STUCK_LIMIT calls
are past their timeout without a reply, whale kills the tools process (the calls in flight
get an error saying so) and starts a new one on the next call. A tools process that dies is
likewise started again on the next call. Not covered: the state a tool kept in memory is lost
at a restart, and one run's stuck calls can cost other runs their calls in flight then.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from whale.errors import WhaleError
from whale.harness.tools.child import START_S, STOP_GRACE_S
from whale.harness.tools.config import ToolsConfig
from whale.harness.tools.frames import HEADER, encode, read_frame, write_all
from whale.harness.tools.spec import ToolSpec
from whale.models.serverproc import kill_group, spawn

STUCK_LIMIT = 8  # calls past their timeout, unanswered, before the tools process is restarted
IMPORT_S = 60.0  # for the user's modules to import, on top of the MCP servers' START_S
_POLL_S = 0.25  # how often a waiting call looks at the cancel switch
# Run with `-c` (not `-m`): whale's own folder goes first on the path, however whale was found.
_MAIN = ("import sys; sys.path.insert(0, {root!r}); "
         "from whale.harness.tools.child import main; main()")  # fmt: skip


class ToolsUnavailable(WhaleError, RuntimeError):
    """The tools process could not start (a tool's module does not import, an MCP server does
    not start); `field` names the tool's entry under `runtime`, e.g. "tools.lookup"."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        if field is not None:
            self.field = field


class ToolCallFailed(Exception):
    """A call did not return a result: the text is what the harness reads."""


class _Process:
    """One started tools process and its calls in flight."""

    def __init__(self, proc: subprocess.Popen[bytes], rx: int, tx: int) -> None:
        self.proc, self.rx, self.tx = proc, rx, tx
        self.lock = threading.Lock()  # pending, stuck, dead, next_id
        self.wlock = threading.Lock()  # writes (never held while waiting on `lock`'s users)
        self.pending: dict[int, Future[dict[str, Any]]] = {}
        self.stuck: set[int] = set()
        self.dead: str | None = None
        self.next_id = 0
        self.reader = threading.Thread(target=self._read, name="whale-tools-replies",
                                       daemon=True)  # fmt: skip

    def _read(self) -> None:
        while True:
            try:
                msg = read_frame(self.rx)
            except (OSError, ValueError):
                msg = None
            if msg is None:
                break
            with self.lock:
                fut = self.pending.pop(msg.get("id"), None)
                self.stuck.discard(msg.get("id"))
            if fut is not None:
                fut.set_result(msg)
        try:
            rc: int | None = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            rc = None
        with self.lock:
            if self.dead is None:
                self.dead = f"the tools process exited (status {rc}); started again on next call"
            left, self.pending = list(self.pending.values()), {}
            self.stuck.clear()
        for fut in left:
            fut.set_exception(ToolCallFailed(self.dead))

    def call(self, name: str, kwargs: dict[str, Any], timeout: float,
             cancelled: threading.Event) -> Any:  # fmt: skip
        fut: Future[dict[str, Any]] = Future()
        with self.lock:
            if self.dead is not None:
                raise ToolCallFailed(self.dead)
            i = self.next_id
            self.next_id += 1
            self.pending[i] = fut
        try:
            with self.wlock:
                write_all(self.tx, encode({"id": i, "name": name, "kwargs": kwargs,
                                           "timeout": timeout}))  # fmt: skip
        except OSError:
            with self.lock:
                self.pending.pop(i, None)
            raise ToolCallFailed("the tools process is gone; started again on next call") from None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg = fut.result(min(left, _POLL_S))
            except TimeoutError:
                if cancelled.is_set():
                    raise ToolCallFailed("cancelled") from None
                continue
            if msg.get("ok"):
                return msg.get("result")
            raise ToolCallFailed(str(msg.get("error")))
        with self.lock:
            if i in self.pending:
                self.stuck.add(i)
            n = len(self.stuck)
        if n >= STUCK_LIMIT:
            self.kill(f"the tools process was restarted: {n} calls ran past their timeout "
                      "without returning")  # fmt: skip
        raise ToolCallFailed(f"timed out after {timeout:g} s")

    def kill(self, why: str) -> None:
        with self.lock:
            if self.dead is None:
                self.dead = why
        if self.proc.poll() is None:  # not reaped yet: the pid is still this process's
            kill_group(self.proc.pid)

    def close(self, grace_s: float) -> None:
        """End of file on its pipe (it stops its MCP servers and exits), then SIGKILL."""
        with self.lock:
            if self.dead is None:
                self.dead = "the tools process was closed"
        with self.wlock:  # no call is writing to it, and no fd number is closed twice
            tx, self.tx = self.tx, -1
            _close(tx)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill("the tools process was closed")
            self.proc.wait(timeout=5)
        if self.reader.is_alive():
            self.reader.join(timeout=5)
        rx, self.rx = self.rx, -1
        _close(rx)


class ToolHost:
    """The user tools of one Runtime, served by one tools process (see the module docstring);
    safe to use from many threads."""

    def __init__(self, cfg: ToolsConfig) -> None:
        self.cfg = cfg
        self.starts = 0
        self._lock = threading.Lock()
        self._proc: _Process | None = None
        self._specs: tuple[ToolSpec, ...] | None = None
        self._cancelled = threading.Event()

    @property
    def pid(self) -> int | None:
        """The running tools process's pid (None: none running)."""
        p = self._proc
        return None if p is None or p.dead is not None else p.proc.pid

    def specs(self) -> tuple[ToolSpec, ...]:
        """Every tool the harness may call (starts the tools process the first time);
        ToolsUnavailable if it cannot start."""
        self._live()
        assert self._specs is not None
        return self._specs

    def call(self, name: str, kwargs: dict[str, Any], timeout: float) -> Any:
        """The tool's JSON result; ToolCallFailed (its error, a timeout, a restart) or
        ToolsUnavailable (the tools process could not be started again)."""
        return self._live().call(name, kwargs, timeout, self._cancelled)

    def cancel(self) -> None:
        """Calls waiting now, and later ones, end at once with an error (no lock taken)."""
        self._cancelled.set()

    def close(self) -> None:
        with self._lock:
            p, self._proc = self._proc, None
        if p is not None:
            p.close(STOP_GRACE_S + 2)

    def _live(self) -> _Process:
        p = self._proc
        if p is not None and p.dead is None:
            return p
        with self._lock:
            p = self._proc
            if p is None or p.dead is not None:
                if p is not None:
                    p.close(0.5)
                p = self._proc = self._start()
            return p

    def _start(self) -> _Process:
        rx, tx_child = os.pipe()
        rx_child, tx = os.pipe()
        root = str(Path(__file__).resolve().parents[3])
        cmd = [sys.executable, "-c", _MAIN.format(root=root), str(os.getpid()), str(rx_child),
               str(tx_child)]  # fmt: skip
        try:
            proc = spawn(cmd, pass_fds=(rx_child, tx_child), stdin=subprocess.DEVNULL)
        except BaseException:
            _close(rx, tx)
            raise
        finally:
            _close(rx_child, tx_child)
        p = _Process(proc, rx, tx)
        try:
            init = {"sys_path": [os.getcwd(), *sys.path], "tools": self.cfg.to_wire()}
            write_all(tx, encode(init))
            ready = _read_by(rx, time.monotonic() + IMPORT_S + START_S)
        except BaseException:
            p.kill("start failed")
            p.close(0.5)
            raise
        if ready is None or not ready.get("ready"):
            p.kill("start failed")
            p.close(0.5)
            if ready is None:
                raise ToolsUnavailable(f"tools: the tools process did not start within "
                                       f"{IMPORT_S + START_S:g} s, or exited while starting",
                                       "tools")  # fmt: skip
            field = ready.get("field")
            raise ToolsUnavailable(f"tools.{field}: {ready.get('error')}",
                                   f"tools.{field}" if field else "tools")  # fmt: skip
        if self._specs is None:  # a restart keeps the first listing: what harnesses were told
            self._specs = tuple(ToolSpec.from_dict(s) for s in ready["specs"])
        self.starts += 1
        p.reader.start()
        return p


def _read_by(fd: int, deadline: float) -> Any:
    """One frame from `fd` by `deadline`, or None (timeout, end of file)."""
    buf = b""
    need = HEADER.size
    poll = select.poll()  # not select(): whale may hold more than 1024 open files
    poll.register(fd, select.POLLIN)
    while len(buf) < need:
        left = deadline - time.monotonic()
        if left <= 0 or not poll.poll(left * 1000):
            return None
        chunk = os.read(fd, need - len(buf))
        if not chunk:
            return None
        buf += chunk
        if need == HEADER.size and len(buf) == HEADER.size:
            need += HEADER.unpack(buf)[0]
    return json.loads(buf[HEADER.size :])


def _close(*fds: int) -> None:
    for fd in fds:
        if fd < 0:
            continue
        try:
            os.close(fd)
        except OSError:
            pass
