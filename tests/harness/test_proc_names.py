"""A process's name (/proc/PID/comm) is any 15 bytes, and any process may set its own: one
named b"\\xff) a b" crashed whale's /proc readers that decoded /proc/PID/stat as UTF-8 (seen:
the accelerate launcher's kill path raised UnicodeDecodeError while such a process lived, so it
left its process group running). Each reader must read past it."""

import os
import subprocess
import sys
import time

import pytest

from whale.harness import cgroups, ray_support
from whale.models import serverproc
from whale.train import launch

NAME = b"\xff) a b"


@pytest.fixture
def odd():
    """A child of this test that renamed itself NAME, and its own child (the tree's leaf)."""
    code = (f"import subprocess, sys, time; open('/proc/self/comm', 'wb').write({NAME!r}); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):
            with open(f"/proc/{p.pid}/comm", "rb") as f:
                if f.read().rstrip(b"\n") == NAME and _kids(p.pid):
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("the child did not rename itself")
        yield p
    finally:
        for k in _kids(p.pid):
            os.kill(k, 9)
        p.kill()
        p.wait()


def _kids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def test_the_launchers_process_table_and_tree_read_past_it(odd):
    assert launch._proc_table()[odd.pid][0] == os.getpid()
    assert set(launch._tree(os.getpid())) >= {odd.pid, *_kids(odd.pid)}


def test_a_servers_start_time_reads_past_it(odd):
    assert isinstance(serverproc.start_time(odd.pid), int)


def test_the_cgroup_start_time_reads_past_it(odd):
    assert cgroups._start_time(odd.pid) is not None


def test_ray_support_descendants_read_past_it(odd):
    assert {p for p, _ in ray_support.descendants(os.getpid())} >= {odd.pid, *_kids(odd.pid)}
