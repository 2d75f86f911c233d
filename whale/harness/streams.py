"""Parent-side I/O of a jailed run: bounded tails of its output, draining its pipes (and the
python tool, which is one such run), writing to a pipe by a deadline, and decoding what the
worker sends (the only untrusted bytes the parent reads, decoded with json only)."""

from __future__ import annotations

import json
import math
import os
import select
import selectors
import subprocess
import time
from typing import Any, Literal

from whale.harness.budget import Limits, PythonToolLimits
from whale.harness.sandbox import Jailed, Sandbox, python_executable

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


DrainEnd = Literal["exited", "timeout", "output", "woken"]


def drain(
    jailed: Jailed,
    tails: dict[str, Tail],
    deadline: float,
    limits: Limits,
    stdin_data: bytes = b"",
    wake: int | None = None,
) -> DrainEnd:
    """Feed `stdin_data` to the process (if it was started with a stdin pipe) and read its
    stdout/stderr until EOF, the deadline, the output limit or `wake` becoming readable.
    Says which of these ended it; the process tree is killed in every case."""
    proc = jailed.proc
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
    sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
    pending = memoryview(stdin_data)
    if proc.stdin is not None:
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "in")
        else:
            proc.stdin.close()
    if wake is not None:
        sel.register(wake, selectors.EVENT_READ, "wake")
    open_streams, end = 2, "exited"
    try:
        while open_streams and end == "exited":
            left = deadline - time.monotonic()
            if left <= 0:
                end = "timeout"
                break
            for key, _ in sel.select(left):
                if key.data == "wake":
                    end = "woken"
                    break
                if key.data == "in":
                    try:
                        pending = pending[os.write(key.fd, pending[: 1 << 16]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # it exited or closed its stdin: the rest is not read
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(key.fd)
                        assert proc.stdin is not None
                        proc.stdin.close()
                    continue
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                    open_streams -= 1
                    continue
                tails[key.data].add(data)
            if sum(t.total for t in tails.values()) > limits.output_bytes:
                end = "output"
    finally:
        sel.close()
    if open_streams:
        jailed.kill()
    else:
        jailed.proc.wait()
        jailed.kill()  # the tree may outlive the main process; also releases the uid
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    return end  # type: ignore[return-value]


def python_tool(
    sandbox: Sandbox, pl: PythonToolLimits, code: str, timeout: float | None, wake: int | None
) -> dict[str, Any]:
    """Run `code` in a fresh jailed interpreter that reads it from its stdin (not argv, where
    one argument may not pass 128 KB: E2BIG), so code of any size runs; the broker's message
    limit caps it. Ends early, with error "cancelled: ...", once `wake` is readable."""
    t = pl.timeout_s if timeout is None else max(0.1, min(float(timeout), pl.timeout_s))
    limits = Limits(
        memory_mb=pl.memory_mb,
        cpu_s=math.ceil(t) + 1,
        processes=pl.processes,
        scratch_mb=64,
        output_bytes=4 * pl.output_chars,
    )
    data = code.encode("utf-8", "replace")
    jailed = sandbox.spawn([python_executable(), "-I", "-S", "-"], limits, stdin=subprocess.PIPE)
    out, err = Tail(pl.output_chars), Tail(pl.output_chars)
    end = drain(jailed, {"out": out, "err": err}, time.monotonic() + t, limits, data, wake)
    rc = jailed.proc.returncode
    error = None
    if end == "woken":
        error = "cancelled: the runtime was cancelled"
    elif end == "timeout":
        error = f"TimeoutError: code ran past {t:g} s and was killed"
    elif end == "output" or out.total + err.total > limits.output_bytes:
        error = f"OutputLimit: printed more than {limits.output_bytes} bytes and was killed"
    elif rc:
        lines = err.text().strip().splitlines()
        error = lines[-1] if lines else f"exit status {rc}"
    timed_out = end == "timeout"
    return {"stdout": out.text(), "stderr": err.text(), "error": error, "timed_out": timed_out}


# What the broker accepts inside a well-formed JSON frame. Past these a request is refused
# with an error reply and the run goes on: the harness sent bad data, the runtime is fine.
MAX_DEPTH = 64
MAX_INT = 2**63


class BadRequest(Exception):
    """Valid JSON the broker refuses: nested too deep, a number out of range or not finite."""


def parse(data: bytes) -> dict[str, Any]:
    """Decode one frame from the worker. MalformedMessage: not a JSON object in UTF-8 (the run
    is killed); BadRequest: JSON the broker refuses (the request gets an error reply)."""
    try:
        msg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MalformedMessage(f"{type(e).__name__}: {e}") from None
    except RecursionError:
        raise BadRequest(f"request is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # int('<more than 4300 digits>')
        raise BadRequest(f"request holds a number out of range ({str(e)[:80]})") from None
    if not isinstance(msg, dict):
        raise MalformedMessage("not an object")
    return scrub(msg)  # type: ignore[no-any-return]


def scrub(x: Any, depth: int = 0) -> Any:
    """Replace lone surrogates (valid JSON escapes, invalid UTF-8) so records stay writable;
    refuse (BadRequest) nesting past MAX_DEPTH, integers past 2**63 and NaN/infinity (which
    `json` accepts as NaN, Infinity or 1e999), so no caller meets them."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
            return x
        except UnicodeEncodeError:
            return x.encode("utf-8", "replace").decode("utf-8")
    if isinstance(x, dict | list):
        if depth >= MAX_DEPTH:
            raise BadRequest(f"request is nested deeper than {MAX_DEPTH} levels")
        if isinstance(x, dict):
            return {scrub(k): scrub(v, depth + 1) for k, v in x.items()}
        return [scrub(v, depth + 1) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        raise BadRequest(f"request holds a number that is not finite ({x})")
    if isinstance(x, int) and not -MAX_INT <= x <= MAX_INT:
        raise BadRequest("request holds an integer out of range (more than 64 bits)")
    return x


def plain(x: Any, depth: int = 0) -> Any:
    """Only plain data crosses to the worker (marshal takes no numpy floats, say). Replies are
    built by the broker, a model or a retriever; past MAX_DEPTH levels a value is sent as its
    str() rather than recursed into."""
    if x is None or isinstance(x, str | bool | int | float):
        return x
    if depth >= MAX_DEPTH:
        return str(x)[:1000]
    if isinstance(x, dict):
        return {str(k): plain(v, depth + 1) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v, depth + 1) for v in x]
    if hasattr(x, "item"):
        return plain(x.item(), depth + 1)
    return str(x)


class PipeStalled(Exception):
    """The reader of a pipe stopped reading until the deadline."""


class Woken(Exception):
    """The wake-up descriptor became readable (the run was cancelled)."""


def write_frame(fd: int, frame: bytes, deadline: float, wake: int | None = None) -> None:
    """Write all of `frame` to the non-blocking pipe `fd` by `deadline` (PipeStalled past it;
    Woken if `wake` becomes readable first). A small frame costs one write(2), as before;
    BrokenPipeError when the reader is gone."""
    try:
        n = os.write(fd, frame)
    except BlockingIOError:
        n = 0
    if n == len(frame):
        return
    view = memoryview(frame)[n:]
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if wake is not None:
        poller.register(wake, select.POLLIN)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PipeStalled(f"{len(view)} bytes unread")
        for ready, _ in poller.poll(max(1, math.ceil(left * 1000))):
            if ready == wake:
                raise Woken()
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]


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
