"""How a jail is started: what runs between whale and nsjail / bubblewrap.

Before the jail's own code runs, its first process must be in the run's cgroups (cgroups.py),
die with the thread that starts it (PR_SET_PDEATHSIG, checked against a parent that died first)
and, for bubblewrap, carry the run's rlimits (nsjail sets its own). Three ways, best first:

- "helper": `whale-launch` (launch.c), one small static program built by `make launcher` (part
  of `make install`; `build()`) into `~/.cache/whale/bin/whale-launch-<hash of launch.c>`: one
  exec does all three. Inside the bubblewrap jail (as root) the same program,
  mounted read-only at HELPER_INSIDE, drops to the run's uid (no groups, no_new_privs, no
  capabilities) in place of `setpriv --reuid`.
- "chain": `sh` (joins the cgroups), `setpriv --pdeathsig` and `prlimit` (util-linux), one exec
  each; `setpriv --reuid` inside bubblewrap. The fallback where the helper is not built.
- "preexec": the same steps in a preexec_fn, where neither is there. It makes subprocess fork
  the whole of whale's process instead of vfork (slower the bigger whale is).

Why not nsjail's own cgroup flags: nsjail joins either cgroup v1 (memory, pids) or v2, never
both, and puts only its child in a group it names after the child's pid, created and removed
by itself; the run's kill (v2 `cgroup.kill`) and memory cap (v1 here) live in different
hierarchies on a hybrid machine, and whale must know the group before the run starts. nsjail's
uid flags (-u / -g) and rlimit flags are used (sandbox.py). bubblewrap's `--die-with-parent`
is used too, but its `--uid` needs a user namespace, which as root would map the harness to
uid 0 outside.

What each costs is measured by `python -m benchmarks.jail_start` and `python -m
benchmarks.eval_throughput --arms helper,chain+scan` (docs/measurements.md).

Keyrings: the kernel's keyrings belong to no namespace, so a jailed process would share the
session keyring of the whale that started it (reading and adding keys: it possesses that
keyring) and could keep keys in its uid's user keyring for the next run given that uid. The
helper (`-k`) starts every jail under a seccomp filter that makes add_key, request_key and
keyctl fail (ENOSYS). Not covered: the chain and preexec ways, which have no such filter, and
a normal user's setuid bwrap (the filter needs no_new_privs there, which bwrap would not
survive).

Not covered: the helper's file is trusted as whale's own cache files are (the compiled
worker): it must belong to whale's user and be writable by no one else, or it is not used.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import resource
import shutil
import signal
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from whale.errors import WhaleError

if TYPE_CHECKING:
    from whale.harness.budget import Limits
    from whale.harness.cgroups import RunGroup

LaunchKind = Literal["auto", "helper", "chain", "preexec"]
SOURCE = Path(__file__).with_name("launch.c")
HELPER_INSIDE = "/whale/launch"  # where bubblewrap's jail sees the helper

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


class LauncherBuildError(WhaleError, RuntimeError):
    pass


# -- the helper ---------------------------------------------------------------------------------
@functools.cache
def helper_path() -> Path:
    """Where the helper built from this version of launch.c is (built or not)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    root = Path(os.environ.get("WHALE_CACHE") or Path.home() / ".cache" / "whale")
    return (root / "bin" / f"whale-launch-{digest}").absolute()


def helper() -> str | None:
    """The built helper, if it is there, executable, whale's user's and writable by no one
    else (one stat per call: a helper built while whale runs is used from then on)."""
    path = helper_path()
    try:
        # lstat: a link would be judged by its target (for root, any system program passes),
        # and a folder others may write lets them swap the file after this check
        st, folder = os.lstat(path), os.stat(path.parent)
    except OSError:
        return None
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        or not st.st_mode & stat.S_IXUSR
        or folder.st_uid not in (0, os.geteuid())
        or folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        return None
    return str(path)


def build(cc: str | None = None, out: Path | None = None) -> Path:
    """Compile launch.c to `out` (default `helper_path()`), static where the C library allows
    it; returns the path. Does nothing where the default one is already built."""
    if out is None:
        out = helper_path()
        if helper() is not None:
            return out
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise LauncherBuildError("no C compiler (cc) to build whale-launch")
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = os.stat(out.parent)
    if folder.st_uid == os.geteuid() and folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.chmod(out.parent, stat.S_IMODE(folder.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    errors = ""
    for static in (["-static"], []):  # static: no dynamic loading on every run's exec
        cmd = [compiler, "-O2", "-Wall", *static, "-o", str(tmp), str(SOURCE)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as e:  # CC names a program that is not there (or cannot run)
            raise LauncherBuildError(f"cannot run the C compiler {compiler}: {e}") from e
        if r.returncode == 0:
            break
        errors = r.stderr[-2000:]
    else:
        tmp.unlink(missing_ok=True)
        raise LauncherBuildError(f"building whale-launch failed: {errors}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return out


# -- choosing and building the command line -----------------------------------------------------
@functools.cache
def chain_tools() -> tuple[str, str, str] | None:
    """/bin/sh, setpriv and prlimit (util-linux), where all are installed."""
    found = (shutil.which("sh", path="/bin:/usr/bin"), shutil.which("setpriv"),
             shutil.which("prlimit"))  # fmt: skip
    return None if None in found else found  # type: ignore[return-value]


def resolve(kind: LaunchKind) -> str | None:
    """The way `kind` names, or for "auto" the best one available; None where `kind` asks for
    one that is not available here."""
    if kind == "auto":
        if helper() is not None:
            return "helper"
        return "chain" if chain_tools() is not None else "preexec"
    if kind == "helper":
        return "helper" if helper() is not None else None
    if kind == "chain":
        return "chain" if chain_tools() is not None else None
    return kind


def rlimits(limits: Limits) -> list[tuple[int, int, str]]:
    """(resource, value, prlimit's name for it) for each rlimit a run gets."""
    mb = 1024 * 1024
    return [
        (resource.RLIMIT_AS, limits.memory_mb * mb, "as"),
        (resource.RLIMIT_CPU, limits.cpu_s, "cpu"),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * mb, "fsize"),
        (resource.RLIMIT_NOFILE, limits.open_files, "nofile"),
        (resource.RLIMIT_NPROC, limits.processes, "nproc"),
    ]


# Joins the cgroup files named before "--", then execs the rest: run as the jail's first
# program so that everything after it starts inside the run's cgroups.
_JOIN = (
    'while [ "$1" != -- ]; do echo 0 > "$1" || { echo "whale: cannot join $1" >&2; exit 126; }; '
    'shift; done; shift; exec "$@"'
)


def launch(
    cmd: list[str], group: RunGroup | None, limits: Limits | None, how: str
) -> tuple[list[str], Callable[[], None] | None]:
    """The command line (and preexec_fn, for "preexec") that starts `cmd` in `group`'s cgroups,
    dying with the calling thread, with `limits` as rlimits (None: the jail sets its own).
    `how`: a `resolve()` result. With the helper or the chain, subprocess can vfork."""
    joins = [] if group is None else group.join_files
    rl = [] if limits is None else rlimits(limits)
    if how == "helper":
        path = helper()
        if path is None:
            raise LauncherBuildError("whale-launch is not built (make launcher)")
        if not os.path.isabs(cmd[0]):  # the helper execs without a PATH search
            cmd = [shutil.which(cmd[0], path="/usr/bin:/bin") or cmd[0], *cmd[1:]]
        argv = [path]
        if _filter_allowed(cmd[0]):  # no keyrings (launch.c: they belong to no namespace)
            argv.append("-k")
        for f in joins:
            argv += ["-j", f]
        for res, value, _ in rl:
            argv += ["-r", f"{res}:{value}"]
        return [*argv, "-p", str(os.getpid()), "--", *cmd], None
    if how == "chain":
        tools = chain_tools()
        assert tools is not None
        sh, setpriv, prlimit = tools
        chain = [setpriv, "--pdeathsig", "KILL", "--"]
        if rl:
            chain += [prlimit, *(f"--{name}={value}" for _, value, name in rl), "--"]
        if joins:
            chain = [sh, "-c", _JOIN, "sh", *joins, "--", *chain]
        return chain + cmd, None
    return cmd, _preexec(group, rl)


def privileged(program: str) -> bool:
    """Whether executing `program` grants privileges: a setuid bit, or file capabilities (the
    `security.capability` attribute, e.g. `setcap cap_sys_admin+ep`, which some distributions
    give bwrap instead of the setuid bit). Either is lost under no_new_privs."""
    try:
        if os.stat(program).st_mode & stat.S_ISUID:
            return True
    except OSError:
        return False
    try:
        return bool(os.getxattr(program, "security.capability"))
    except OSError:  # none (ENODATA), or no extended attributes here
        return False


def _filter_allowed(program: str) -> bool:
    """Whether the helper may start `program` under its keyring filter. Root installs it as it
    is; anyone else needs no_new_privs for it, which a privileged bwrap (setuid-root or with
    file capabilities: distributions that turn unprivileged user namespaces off) would not
    survive: there the filter is left out."""
    return os.geteuid() == 0 or not privileged(program)


def _preexec(group: RunGroup | None, rl: Sequence[tuple[int, int, str]]) -> Callable[[], None]:
    """The same as the helper, in the child between fork and exec."""
    parent = os.getpid()

    def apply() -> None:
        if group is not None:
            group.join()
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)
        for res, value, _ in rl:
            resource.setrlimit(res, (value, value))

    return apply


def drop_to(uid: int) -> tuple[list[str], dict[str, str]]:
    """The helper's command line that runs first inside the bubblewrap jail (as root) to
    become `uid` with no groups, no_new_privs and no capabilities, and the file it needs
    mounted there (host -> inside)."""
    path = helper()
    if path is None:
        raise LauncherBuildError("whale-launch is not built (make launcher)")
    return [HELPER_INSIDE, "-u", str(uid), "--"], {path: HELPER_INSIDE}
