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


def test_ancestors_end_at_init_and_survive_a_process_that_is_gone():
    assert leftovers.ancestors(os.getpid())[0] == os.getppid()
    assert leftovers.ancestors(os.getpid())[-1] in (0, 1)
    assert leftovers.ancestors(2**22 + 12345) == []
