"""`python -m tests.leftovers --outside PID`: a process tree started beside the suite (a long
experiment) is listed apart and does not fail the check; anything else still does."""

import os
import signal
import subprocess
import sys
import time

from tests import leftovers

# A child whose command line names a llama.cpp server (what `servers()` looks for).
_CHILD = [sys.executable, "-c", "import time; time.sleep(60)", "llama-server-look-alike"]


def _tree():
    """A shell (the tree's root) with one look-alike server under it, in its own group."""
    root = subprocess.Popen(["sh", "-c", f"{' '.join(map(repr, _CHILD))} & wait"],
                            start_new_session=True)  # fmt: skip
    for _ in range(100):
        mine = [x for x in leftovers.servers()
                if root.pid in leftovers.ancestors(leftovers._pid(x))]  # fmt: skip
        if mine:
            return root, mine
        time.sleep(0.05)
    raise AssertionError("the child did not start")


def test_a_tree_named_outside_is_set_apart_and_anything_else_is_a_leftover():
    root, mine = _tree()
    try:
        left, outside = leftovers.split_outside(mine, {root.pid})
        assert (left, outside) == ([], mine)
        left, outside = leftovers.split_outside(mine, {os.getpid() + 10**6})
        assert (left, outside) == (mine, [])
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()



def _no_wait(monkeypatch, lines):
    monkeypatch.setattr(leftovers, "leftovers", lambda: [])
    monkeypatch.setattr(leftovers, "servers", lambda: list(lines))
    monkeypatch.setattr(leftovers.time, "sleep", lambda s: None)


def test_an_ancestor_of_the_check_such_as_init_is_refused(monkeypatch, capsys):
    """Every process descends from PID 1, and the suite's orphans are reparented to it (or
    to a subreaper above the check): naming it, or the shell running the suite, would pass
    any leftover. The check refuses such a PID (exit 2) instead of passing."""
    _no_wait(monkeypatch, [f"{os.getpid()} llama-server-look-alike"])
    for root in (1, os.getppid(), os.getpid()):
        try:
            code = leftovers.main(["--outside", str(root)])
        except SystemExit as e:
            code = e.code
        assert code == 2, (root, capsys.readouterr())
        assert "ancestor" in capsys.readouterr().err


def test_a_root_that_is_gone_is_said_and_the_roots_command_is_shown(monkeypatch, capsys):
    gone = 2**22 + 12345
    root, mine = _tree()
    try:
        _no_wait(monkeypatch, mine)
        assert leftovers.main(["--outside", str(root.pid), "--outside", str(gone)]) == 0
        out = capsys.readouterr().out
        assert f"--outside {gone}: no such process" in out
        assert f"{root.pid} (sh -c" in out  # what the PID is now: a reused one shows
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_a_process_whose_name_is_not_utf8_is_walked_through():
    """A process name (comm) is any bytes, ")" and spaces included: one in the middle of
    the tree must not cut the walk to its root."""
    mid = ("import subprocess, sys; open('/proc/self/comm', 'wb').write(b'\\xff) a b'); "
           f"subprocess.Popen({_CHILD!r}).wait()")  # fmt: skip
    root = subprocess.Popen(["sh", "-c", f"{sys.executable} -c {mid!r} & wait"],
                            start_new_session=True)  # fmt: skip
    try:
        for _ in range(100):
            mine = [x for x in leftovers.servers() if "import subprocess" not in x and
                    "llama-server-look-alike" in x and str(root.pid) not in x.split()[:1]
                    and _under(root.pid, leftovers._pid(x))]  # fmt: skip
            if mine:
                break
            time.sleep(0.05)
        assert mine, "the child did not start"
        assert leftovers.split_outside(mine, {root.pid}) == ([], mine)
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def _under(root: int, pid: int) -> bool:
    """Whether `pid` descends from `root`, by the process group (not by the code tested)."""
    try:
        return os.getpgid(pid) == root
    except OSError:
        return False
