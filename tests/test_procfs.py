"""whale.procfs, the one reader of /proc/PID/stat. A process's name (/proc/PID/comm) is any 15
bytes, and any process may set its own: one named b"\\xff) a b" crashed whale's /proc readers
that decoded /proc/PID/stat as UTF-8 (seen: the accelerate launcher's kill path raised
UnicodeDecodeError while such a process lived, so it left its process group running). The
reader, and every part that finds processes through it, must read past it."""

import os
import subprocess
import sys
import time

import pytest

from tests import leftovers
from whale import procfs
from whale.harness import ray_support
from whale.models import serverproc

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


def test_the_fields_after_the_name_read_past_it(odd):
    fields = procfs.stat_fields(odd.pid)
    assert fields is not None
    assert int(fields[procfs.PPID]) == os.getpid()
    assert fields[procfs.START] == procfs.start_time(odd.pid)


def test_the_process_table_and_descendants_read_past_it(odd):
    assert procfs.processes()[odd.pid][0] == os.getpid()
    assert set(procfs.descendants(os.getpid())) >= {odd.pid, *_kids(odd.pid)}


def test_ancestors_read_past_it(odd):
    assert procfs.ancestors(_kids(odd.pid)[0])[:2] == [odd.pid, os.getpid()]


def test_a_process_that_is_gone_has_no_fields_start_or_ancestors():
    gone = 2**22 + 12345  # above pid_max's default ceiling
    assert procfs.stat_fields(gone) is None
    assert procfs.start_time(gone) is None
    assert procfs.ancestors(gone) == []


def test_ancestors_end_at_init():
    up = procfs.ancestors(os.getpid())
    assert up[0] == os.getppid()
    assert up[-1] in (0, 1)


def test_a_zombie_is_not_in_the_table():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):
            fields = procfs.stat_fields(p.pid)
            if fields and fields[procfs.STATE] == "Z":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the child did not exit")
        assert p.pid not in procfs.processes()
    finally:
        p.wait()


class Bounded(dict):
    """A process table that fails, where a walk of it that does not end would hang."""

    def __init__(self, table: dict, reads: int = 100) -> None:
        super().__init__(table)
        self.left = reads

    def __getitem__(self, pid: int) -> tuple[int, str]:
        self.left -= 1
        if self.left < 0:
            raise AssertionError("the walk of the table does not end")
        return super().__getitem__(pid)


def test_descendants_of_a_table_with_a_cycle_end():
    # pids reused while /proc was being read can make 10 the parent of 11 and 11 of 10
    # (each pid has one parent, so a cycle the walk can reach goes through the root); a walk
    # that does not end fails on the table's read count rather than hanging
    table = Bounded({10: (11, "5"), 11: (10, "6"), 12: (1, "7")})
    assert procfs.descendants(10, table) == {11: "6"}  # below 10: never 10 itself


def test_the_callers_read_through_it(odd):
    """The parts that keep a reader's name of their own keep its type (a server's start time is
    an int in the registry's records) and read past the name."""
    assert serverproc.start_time(odd.pid) == int(procfs.start_time(odd.pid) or -1)
    assert {p for p, _ in ray_support.descendants(os.getpid())} >= {odd.pid, *_kids(odd.pid)}
    assert leftovers.ancestors(_kids(odd.pid)[0])[0] == odd.pid


def test_ancestors_of_a_cycle_end_at_the_bound(monkeypatch):
    """Pids reused while the chain is read can make 10 the parent of 11 and 11 of 10."""
    reads = []

    def fields(pid):
        reads.append(pid)
        if len(reads) > 10_000:
            raise AssertionError("ancestors does not end")
        return ["S", str({10: 11, 11: 10}[pid])] + ["0"] * 18

    monkeypatch.setattr(procfs, "stat_fields", fields)
    up = procfs.ancestors(10)
    assert len(up) == 4096 and up[:3] == [11, 10, 11]


@pytest.mark.parametrize("raw", [b"", b"12 (name", b"12 (a) S 1 2 3", b"12 a b c " * 10])
def test_a_short_or_garbled_stat_line_reads_as_no_process(monkeypatch, raw):
    import io

    monkeypatch.setattr(procfs, "open", lambda *a, **k: io.BytesIO(raw), raising=False)
    assert procfs.stat_fields(12) is None
    assert procfs.start_time(12) is None
    assert procfs.ancestors(12) == []
