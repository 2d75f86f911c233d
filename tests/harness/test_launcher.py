"""whale-launch, the one program between whale and a jail (issue 25): each step it takes the
place of (sh joining the cgroups, setpriv --pdeathsig, prlimit, setpriv --reuid) holds, and
each bad input stops it before the program runs. The jails it starts are tested on both
backends and both launchers here and, through "auto", by every hostile-harness test."""

import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from whale.harness import Limits, Runtime, launcher
from whale.harness.sandbox import Sandbox, SandboxUnavailable, python_executable

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="uids and capabilities need root")
PY = python_executable()

# What a process says of itself: resuid, resgid, groups, no_new_privs, capabilities
# (effective, permitted, inheritable; both words) and how many ambient ones are set.
SELF = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "class H(ctypes.Structure): _fields_ = [('v', ctypes.c_uint32), ('pid', ctypes.c_int)]\n"
    "class D(ctypes.Structure):\n"
    "    _fields_ = [('e', ctypes.c_uint32), ('p', ctypes.c_uint32), ('i', ctypes.c_uint32)]\n"
    "h, d = H(0x20080522, 0), (D * 2)()\n"
    "assert libc.syscall(125, ctypes.byref(h), d) == 0\n"  # capget
    "ambient = sum(libc.prctl(47, 1, c, 0, 0) == 1 for c in range(64))\n"  # PR_CAP_AMBIENT_IS_SET
    "print(os.getresuid(), os.getresgid(), os.getgroups(), libc.prctl(39, 0, 0, 0, 0),\n"
    "      [(x.e, x.p, x.i) for x in d], ambient)\n"
)
DROPPED = "({u}, {u}, {u}) ({u}, {u}, {u}) [] 1 [(0, 0, 0), (0, 0, 0)] 0"


def _run(helper: str, *args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helper, *args], capture_output=True, text=True, timeout=30, **kw)


def test_a_build_gives_a_program_that_runs_its_command(tmp_path):
    try:
        path = launcher.build(out=tmp_path / "whale-launch")
    except launcher.LauncherBuildError as e:
        pytest.skip(str(e))
    r = _run(str(path), "--", "/bin/echo", "hi")
    assert (r.returncode, r.stdout) == (0, "hi\n")


def test_rlimits_are_set_before_the_program_runs(helper):
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    r = _run(helper, "-r", f"{resource.RLIMIT_NOFILE}:33", "--", PY, "-I", "-S", "-c", code)
    assert r.stdout.strip() == "(33, 33)"


def test_it_joins_the_files_named_before_the_program_runs(helper, tmp_path):
    # A cgroup's cgroup.procs takes "0" for "me"; a plain file shows what was written.
    f = tmp_path / "cgroup.procs"
    f.write_text("")
    r = _run(helper, "-j", str(f), "--", "/bin/cat", str(f))
    assert (r.returncode, r.stdout) == (0, "0")


@pytest.mark.parametrize(
    "args",
    [
        ["-j", "/nonexistent/cgroup.procs", "--"],  # a cgroup that cannot be joined
        ["-r", "7:x", "--"],  # not a number
        ["-r", "999:1", "--"],  # no such resource
        ["-x", "1", "--"],  # no such option
        ["-p", "1", "--"],  # its parent is not the one named (it died)
        ["-j", "/dev/null"],  # no "--"
    ],
)
def test_a_bad_start_exits_126_before_the_program_runs(helper, tmp_path, args):
    marker = tmp_path / "ran"
    r = _run(helper, *args, "/usr/bin/touch", str(marker))
    assert r.returncode == 126 and not marker.exists()


def test_it_dies_with_its_parent(helper):
    # The parent starts the helper (-p names it), prints the child's pid and is killed -9.
    parent = (
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.argv[1], '-p', str(os.getpid()), '--', '/bin/sleep', '60'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent, helper], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@ROOT
def test_it_becomes_the_uid_with_no_groups_no_new_privs_and_no_capabilities(helper):
    r = _run(helper, "-u", "206100", "--", "/bin/cat", "/proc/self/status")
    status = dict(line.split(":", 1) for line in r.stdout.splitlines())
    got = {k: status[k].split() for k in ("Uid", "Gid", "Groups", "NoNewPrivs", "CapInh",
                                          "CapPrm", "CapEff", "CapAmb")}  # fmt: skip
    assert got == {"Uid": ["206100"] * 4, "Gid": ["206100"] * 4, "Groups": [],
                   "NoNewPrivs": ["1"], **{c: ["0" * 16] for c in ("CapInh", "CapPrm", "CapEff",
                                                                "CapAmb")}}, r.stderr  # fmt: skip


@ROOT
def test_it_refuses_to_become_uid_0(helper, tmp_path):
    marker = tmp_path / "ran"
    r = _run(helper, "-u", "0", "--", "/usr/bin/touch", str(marker))
    assert r.returncode == 126 and not marker.exists()


@ROOT
def test_the_harness_has_no_new_privs_and_no_capabilities(sandbox, launch):
    j = Sandbox(sandbox, launch=launch).spawn([PY, "-I", "-S", "-c", SELF], Limits())  # type: ignore[arg-type]
    try:
        out, err = j.proc.communicate(timeout=30)
    finally:
        j.kill()
    assert out.decode().strip() == DROPPED.format(u=j.uid), err


def test_the_jails_rlimits_hold_on_every_launcher(sandbox, launch):
    code = (
        "import resource as r\n"
        "print([r.getrlimit(x)[1] for x in (r.RLIMIT_AS, r.RLIMIT_CPU, r.RLIMIT_FSIZE,"
        " r.RLIMIT_NOFILE, r.RLIMIT_NPROC)])\n"
    )
    limits = Limits(memory_mb=700, cpu_s=33, file_size_mb=5, open_files=40, processes=9)
    j = Sandbox(sandbox, launch=launch).spawn([PY, "-I", "-S", "-c", code], limits)  # type: ignore[arg-type]
    try:
        out, err = j.proc.communicate(timeout=30)
    finally:
        j.kill()
    assert out.decode().split() == ["[734003200,", "33,", "5242880,", "40,", "9]"], err


def test_a_harness_runs_on_every_launcher(sandbox, launch):
    src = "def run(q, env):\n    return q[::-1]\n"
    t = Runtime(model=None, sandbox=Sandbox(sandbox, launch=launch)).run(src, "abc")  # type: ignore[arg-type]
    assert t.status == "ok" and t.answer == "cba"


def test_naming_a_launcher_that_is_not_here_fails_the_start(sandbox, monkeypatch):
    monkeypatch.setattr(launcher, "helper", lambda: None)
    with pytest.raises(SandboxUnavailable, match="make launcher"):
        Sandbox(sandbox, launch="helper").spawn([PY, "-I", "-S", "-c", "pass"], Limits())  # type: ignore[arg-type]


def test_auto_takes_the_helper_where_it_is_built(helper):
    assert launcher.resolve("auto") == "helper"


def test_a_helper_others_can_write_is_not_used(helper, tmp_path, monkeypatch):
    copy = tmp_path / "whale-launch"
    copy.write_bytes(open(helper, "rb").read())
    monkeypatch.setattr(launcher, "helper_path", lambda: copy)
    copy.chmod(0o755)
    assert launcher.helper() == str(copy)
    copy.chmod(0o777)
    assert launcher.helper() is None and launcher.resolve("auto") != "helper"


def test_with_k_no_keyring_call_reaches_the_kernel(helper):
    # add_key, keyctl (native and x32 numbers) fail with ENOSYS; other calls go through.
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "out = []\n"
        "for nr, args in ((248, (b'user', b'k', b'v', 1, -3)), (250, (0, -3, 0)),\n"
        "                 (0x40000000 | 250, (0, -3, 0))):\n"
        "    out.append((libc.syscall(nr, *args), ctypes.get_errno()))\n"
        "print(out, os.getpid() > 0)\n"
    )
    r = _run(helper, "-k", "--", PY, "-I", "-S", "-c", code)
    assert r.stdout.strip() == "[(-1, 38), (-1, 38), (-1, 38)] True", r.stderr


def test_a_helper_that_is_a_link_is_not_used(helper, tmp_path, monkeypatch):
    # A link passes an owner check on its target: any program of whale's user (for root, any
    # system program: /usr/bin/env would run the jail with none of the steps) would be used.
    link = tmp_path / "whale-launch"
    link.symlink_to("/usr/bin/env")
    monkeypatch.setattr(launcher, "helper_path", lambda: link)
    assert launcher.helper() is None and launcher.resolve("auto") != "helper"


def test_a_helper_in_a_folder_others_can_write_is_not_used(helper, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    copy = shared / "whale-launch"
    copy.write_bytes(open(helper, "rb").read())
    copy.chmod(0o755)
    monkeypatch.setattr(launcher, "helper_path", lambda: copy)
    assert launcher.helper() == str(copy)
    shared.chmod(0o777)  # another user could rename a program of theirs over it
    assert launcher.helper() is None


def test_a_build_under_umask_002_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE", str(tmp_path / "cache"))
    launcher.helper_path.cache_clear()
    old = os.umask(0o002)
    try:
        launcher.build()
    except launcher.LauncherBuildError as e:
        pytest.skip(str(e))
    finally:
        os.umask(old)
        monkeypatch.undo()
        launcher.helper_path.cache_clear()
    built = tmp_path / "cache" / "bin" / launcher.helper_path().name
    monkeypatch.setattr(launcher, "helper_path", lambda: built)
    assert launcher.helper() == str(built)


def test_a_compiler_that_is_not_there_is_a_build_error(tmp_path, monkeypatch):
    # CC naming a missing program: LauncherBuildError (make launcher's message, the tests'
    # skip), not FileNotFoundError out of subprocess.
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))
    with pytest.raises(launcher.LauncherBuildError, match="no-cc"):
        launcher.build(out=tmp_path / "whale-launch")


def test_the_keyring_filter_is_left_out_only_for_a_setuid_jail_of_a_normal_user(
    helper, tmp_path, monkeypatch
):
    # A normal user's filter needs no_new_privs, which a setuid bwrap would not survive.
    jail = tmp_path / "bwrap"
    jail.write_text("")
    jail.chmod(0o4755)
    plain = tmp_path / "nsjail"
    plain.write_text("")

    monkeypatch.setattr(launcher, "helper", lambda: helper)

    def argv(program, euid):
        with monkeypatch.context() as m:
            m.setattr(os, "geteuid", lambda: euid)
            return launcher.launch([str(program)], None, None, "helper")[0]

    assert "-k" in argv(jail, 0) and "-k" in argv(plain, 1000) and "-k" not in argv(jail, 1000)


def test_the_keyring_filter_is_left_out_for_a_normal_users_jail_with_file_capabilities(
    helper, tmp_path, monkeypatch
):
    """File capabilities (`setcap cap_sys_admin+ep`, bwrap's privilege on some distributions)
    are lost under no_new_privs as the setuid bit is."""
    import shutil

    if os.geteuid() != 0 or shutil.which("setcap") is None:
        pytest.skip("setting file capabilities needs root and setcap")
    jail = tmp_path / "bwrap"
    jail.write_text("")
    jail.chmod(0o755)
    if subprocess.run(["setcap", "cap_sys_admin+ep", str(jail)]).returncode != 0:
        pytest.skip("setcap failed here")
    monkeypatch.setattr(launcher, "helper", lambda: helper)
    with monkeypatch.context() as m:
        m.setattr(os, "geteuid", lambda: 1000)
        argv = launcher.launch([str(jail)], None, None, "helper")[0]
    assert launcher.privileged(str(jail)) and "-k" not in argv
