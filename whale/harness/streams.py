"""Parent-side I/O of a jailed run: bounded tails of its output, draining its pipes, and
decoding what it sends (the only untrusted bytes the parent reads, decoded with json only)."""

from __future__ import annotations

import json
import os
import selectors
import time
from typing import Any

from whale.harness.budget import Limits
from whale.harness.sandbox import Jailed

TAIL_CHARS = 4000


class MalformedMessage(Exception):
    pass


class Tail:
    """Keeps the last `keep` bytes of a stream and counts all of them."""

    def __init__(self, keep: int = TAIL_CHARS) -> None:
        self.keep, self.total, self.buf = keep, 0, bytearray()

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > 2 * self.keep:
            del self.buf[: len(self.buf) - self.keep]

    def text(self) -> str:
        return bytes(self.buf[-self.keep :]).decode("utf-8", "replace")


def drain(jailed: Jailed, tails: dict[str, Tail], deadline: float, limits: Limits) -> bool:
    """Read stdout/stderr until EOF, the deadline or the output limit. True if timed out."""
    proc = jailed.proc
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
    sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
    open_streams, timed_out = 2, False
    try:
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                    open_streams -= 1
                    continue
                tails[key.data].add(data)
            if sum(t.total for t in tails.values()) > limits.output_bytes:
                break
    finally:
        sel.close()
    if open_streams:
        jailed.kill()
    else:
        jailed.proc.wait()
        jailed.kill()  # the tree may outlive the main process; also releases the uid
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    return timed_out


def parse(data: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise MalformedMessage(f"{type(e).__name__}: {e}") from None
    if not isinstance(msg, dict):
        raise MalformedMessage("not an object")
    return scrub(msg)  # type: ignore[no-any-return]


def scrub(x: Any) -> Any:
    """Replace lone surrogates (valid JSON escapes, invalid UTF-8) so records stay writable."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
            return x
        except UnicodeEncodeError:
            return x.encode("utf-8", "replace").decode("utf-8")
    if isinstance(x, dict):
        return {scrub(k): scrub(v) for k, v in x.items()}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    return x


def plain(x: Any) -> Any:
    """Only plain data crosses to the worker (marshal takes no numpy floats, say)."""
    if x is None or isinstance(x, str | bool | int | float):
        return x
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if hasattr(x, "item"):
        return plain(x.item())
    return str(x)


def drain_rest(proc: Any, tails: dict[str, Tail]) -> None:
    """After the kill, read what is left in the pipes (bounded) and close them."""
    for name, stream in (("out", proc.stdout), ("err", proc.stderr)):
        if stream is None:
            continue
        try:
            os.set_blocking(stream.fileno(), False)
            for _ in range(64):
                data = os.read(stream.fileno(), 1 << 16)
                if not data:
                    break
                tails[name].add(data)
        except (BlockingIOError, OSError, ValueError):
            pass
        finally:
            stream.close()
