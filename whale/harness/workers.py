"""The jailed worker process: worker.py compiled once, a worker spawned in the sandbox with its
two pipes, and discarded when a run is over (whale.harness.broker serves the run over them)."""

from __future__ import annotations

import functools
import hashlib
import os
import py_compile
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import whale.harness.endpoint as endpoint
import whale.harness.worker as wire
from whale.harness.budget import Limits
from whale.harness.packages import PACKAGES_INSIDE
from whale.harness.sandbox import Jailed, Sandbox, python_executable

WORKER_SOURCE = str(Path(wire.__file__).resolve())
WORKER_INSIDE = "/whale/worker.pyc"
# The in-jail OpenAI-compatible endpoint (endpoint.py), loaded by the worker by its path.
ENDPOINT_SOURCE = str(Path(endpoint.__file__).resolve())
ENDPOINT_INSIDE = "/whale/endpoint.pyc"


def worker_file() -> str:
    """worker.py compiled once per version (the jail has no writable __pycache__, and
    compiling it on every start cost time in each run: docs/measurements.md)."""
    return _compiled(WORKER_SOURCE, "worker")


def endpoint_file() -> str:
    return _compiled(ENDPOINT_SOURCE, "endpoint")


@functools.cache
def _compiled(source: str, name: str) -> str:
    data = Path(source).read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    # In the user's cache, not a shared /tmp where another user could plant a file.
    root = Path(os.environ.get("WHALE_CACHE") or Path.home() / ".cache" / "whale") / "worker"
    root.mkdir(parents=True, exist_ok=True)
    # "-j": compiled with its path inside the jail (tracebacks shown to proposers name
    # /whale/worker.py, not where whale is installed on the host)
    path = root / f"{name}-{sys.version_info[0]}{sys.version_info[1]}-{digest}-j.pyc"
    if not path.exists():
        # Per thread too: two fillers compiling at once must not write one file together.
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        py_compile.compile(source, cfile=str(tmp), dfile=f"/whale/{name}.py", doraise=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return str(path)


@dataclass
class Worker:
    """A started jailed worker that has not run anything yet, and its two pipe ends."""

    jailed: Jailed
    rx: int
    tx: int

    def alive(self) -> bool:
        return self.jailed.proc.poll() is None

    def discard(self) -> None:
        self.jailed.kill()
        for fd in (self.rx, self.tx):
            try:
                os.close(fd)
            except OSError:
                pass
        for stream in (self.jailed.proc.stdout, self.jailed.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def spawn_worker(sandbox: Sandbox, limits: Limits, packages: str | None = None) -> Worker:
    """`packages`: the host folder of the allowed packages (runtime.packages), mounted
    read-only at PACKAGES_INSIDE and named to the worker, which puts it on sys.path."""
    argv = [python_executable(), "-I", "-S", WORKER_INSIDE]
    ro_files = {worker_file(): WORKER_INSIDE, endpoint_file(): ENDPOINT_INSIDE}
    if packages is not None:
        ro_files[packages] = PACKAGES_INSIDE
    rx_parent, tx_child = os.pipe()  # child -> parent
    rx_child, tx_parent = os.pipe()  # parent -> child
    # The parent never blocks on a harness that stops reading: see streams.write_frame.
    os.set_blocking(tx_parent, False)
    try:
        jailed = sandbox.spawn(
            [*argv, str(rx_child), str(tx_child), ENDPOINT_INSIDE,
             *([PACKAGES_INSIDE] if packages else [])],  # fmt: skip
            limits,
            pass_fds=(rx_child, tx_child),
            ro_files=ro_files,
        )
    except BaseException:
        for fd in (rx_parent, tx_parent):
            os.close(fd)
        raise
    finally:
        os.close(rx_child)
        os.close(tx_child)
    return Worker(jailed, rx_parent, tx_parent)
