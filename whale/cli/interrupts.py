"""Ctrl-C and SIGTERM for the long CLI commands (`whale eval`, `whale adapt`).

First SIGINT: the embedded model servers are killed (every model call in flight fails at
once and no new one starts), a line says so, and KeyboardInterrupt is raised in the main
thread: `evaluate()` stops dispatching and cancels the runs in flight, the command closes
what it opened, says what was recorded, and exits 130. A watchdog makes the process exit 130
`GRACE_S` seconds later if that unwinding is stuck (a remote backend that does not answer,
say). Second SIGINT: exit 130 at once (servers killed first). SIGTERM is the same as the
first SIGINT with SystemExit(143); a second SIGTERM exits at once.

Not covered: the hard exits (second signal, watchdog) skip `Runtime.cancel()`; the jailed
workers of runs in flight then die by their own parent-death signal and jail cleanup.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from whale.models.embedded import kill_servers

GRACE_S = 5.0
EXIT_SIGINT, EXIT_SIGTERM = 130, 143

_state: dict[str, Any] = {"stopping": None, "timer": None}


def stopping() -> int | None:
    """The exit code of the stop in progress (130 or 143), or None."""
    code: int | None = _state["stopping"]
    return code


def hard_exit(code: int, why: str) -> None:
    """Kill this process's model servers and exit now, skipping all cleanup."""
    try:
        os.write(2, f"\nwhale: {why}: exiting now\n".encode())
    except OSError:
        pass
    kill_servers()
    os._exit(code)


def _begin(code: int, what: str) -> None:
    _state["stopping"] = code
    try:
        os.write(
            2,
            f"\nwhale: {what}: stopping (finished rollouts are kept; "
            f"{what} again to exit at once)\n".encode(),
        )
    except OSError:
        pass
    kill_servers()
    timer = threading.Timer(GRACE_S, hard_exit, (code, f"still stopping after {GRACE_S:g} s"))
    timer.daemon = True
    timer.start()
    _state["timer"] = timer


def on_sigint(signum: int, frame: FrameType | None) -> None:
    if _state["stopping"] is not None:
        hard_exit(EXIT_SIGINT, "second interrupt")
    _begin(EXIT_SIGINT, "Ctrl-C")
    raise KeyboardInterrupt


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _state["stopping"] is not None:
        hard_exit(EXIT_SIGTERM, "second SIGTERM")
    _begin(EXIT_SIGTERM, "SIGTERM")
    raise SystemExit(EXIT_SIGTERM)


def install() -> Callable[[], None]:
    """Install the handlers; returns the function that puts the previous ones back (so that
    an in-process CliRunner leaves the test process as it was; after a stop began it keeps
    them, to the exit). Does nothing outside the main thread (Python allows no handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, on_sigint), signal.signal(signal.SIGTERM, on_sigterm)

    def restore() -> None:
        if _state["stopping"] is not None:
            return  # exiting: keep the second-signal handler and the watchdog to the end
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])

    return restore


def stopped(message: str) -> NoReturn:
    """After an interrupt was handled: say what was kept and exit 130 (or 143 on SIGTERM)."""
    import typer

    code = stopping() or EXIT_SIGINT
    print(f"whale: interrupted: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def recorded(path: Path) -> int:
    """Complete records (newline-terminated lines) in a JSONL file; 0 if it is missing."""
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except OSError:
        return 0
