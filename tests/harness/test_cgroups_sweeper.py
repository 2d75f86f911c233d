"""Run cgroup folders removed off the run's path (cgroups.remove_later): the sweeper removes
them, `flush` waits for it, and a process that can no longer start a thread (Python >= 3.12
at interpreter shutdown: atexit handlers such as a warm pool's close) removes them at once."""

import os
import threading

import pytest

import whale.harness.cgroups as cgroups
from whale.harness.cgroups import RunGroup


def _group(tmp_path, n=2):
    dirs = [str(tmp_path / f"run.{i}") for i in range(n)]
    for d in dirs:
        os.mkdir(d)
    return RunGroup(dirs=list(dirs)), dirs


def test_folders_given_to_the_sweeper_are_gone_after_flush(tmp_path):
    g, dirs = _group(tmp_path)
    cgroups.remove_later(g)
    assert g.dirs == []  # taken at once: a second release has nothing to give
    assert cgroups.flush(5.0)
    assert not any(os.path.exists(d) for d in dirs)


def test_without_a_thread_to_start_the_folders_are_removed_at_once(tmp_path, monkeypatch):
    assert cgroups.flush(5.0)
    monkeypatch.setattr(cgroups, "_SWEEPER", [])  # none alive, as in a process that ran none

    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    g, dirs = _group(tmp_path)
    cgroups.remove_later(g)  # from a pool's close in an atexit handler: must not raise
    assert not any(os.path.exists(d) for d in dirs)
    assert cgroups.flush(0.5)  # and nothing is left queued for a sweeper that never came


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_sweeps_its_own_folders(tmp_path):
    cgroups.remove_later(_group(tmp_path, 1)[0])  # the parent's sweeper is running
    child_dir = str(tmp_path / "child")
    os.mkdir(child_dir)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        try:
            cgroups.remove_later(RunGroup(dirs=[child_dir]))
            ok = cgroups.flush(5.0) and not os.path.exists(child_dir)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cgroups.flush(5.0)
