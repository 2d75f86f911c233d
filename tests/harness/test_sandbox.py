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


def test_auto_prefers_nsjail():
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
