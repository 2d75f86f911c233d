"""Nothing of a run outlives it; uids are shared safely between whale processes; a run's memory
is capped as a whole (issue 8). Every test runs on nsjail and on bubblewrap."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from whale.harness import Limits, Runtime, cgroups, uids
from whale.harness.pool import WorkerPool
from whale.harness.sandbox import Sandbox, leftovers, python_executable

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="uids and cgroups need root")
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAKE_DONE = (
    "import ctypes, os, sys, time\n"
    "sys.path.insert(0, '/whale')\n"
    "import worker\n"
    "def run(q, env):\n"
    "    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG: none\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "    worker.send(env._link.wfd, {'op': 'done', 'status': 'ok', 'answer': str(os.getuid())})\n"
    "    time.sleep(60)\n"
)


def _wait_gone(uid: int, timeout: float = 5.0) -> list[uids.Proc]:
    deadline = time.monotonic() + timeout
    while (left := uids.scan((uid,))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _sleeper(sandbox: str, code: str = "import time; time.sleep(60)", **kw):
    return Sandbox(sandbox).spawn([python_executable(), "-I", "-S", "-c", code], Limits(**kw))


@ROOT
def test_fake_done_after_clearing_the_parent_death_signal_leaves_nothing(sandbox):
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(FAKE_DONE, "x")
    assert t.status == "ok"
    assert uids.scan((int(t.answer),)) == []  # right away: the worker and its daemon child


@ROOT
def test_without_cgroups_the_run_still_leaves_nothing(sandbox, monkeypatch):
    monkeypatch.setattr(cgroups, "create", lambda *a: None)
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(FAKE_DONE, "x")
    assert t.status == "ok" and uids.scan((int(t.answer),)) == []


PARENT = (
    "import sys, time\n"
    "from whale.harness.budget import Limits\n"
    "from whale.harness.sandbox import Sandbox, python_executable\n"
    "j = Sandbox(sys.argv[1], launch=sys.argv[3]).spawn(\n"
    "    [python_executable(), '-I', '-S', '-c', sys.argv[2]], Limits())\n"
    "print(j.proc.pid, j.uid, flush=True)\n"
    "time.sleep(60)\n"
)


def _whale_killed_with_sigkill(sandbox: str, code: str, launch: str = "auto") -> tuple[int, int]:
    """A whale process starts a jail and is then killed -9: the jail's pid and uid."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, sandbox, code, launch],
        stdout=subprocess.PIPE,
        cwd=HERE,
        text=True,
    )
    assert parent.stdout is not None
    jail_pid, uid = (int(x) for x in parent.stdout.readline().split())
    time.sleep(0.3)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    return jail_pid, uid


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@ROOT
def test_the_jail_dies_with_whale_killed_with_sigkill(sandbox, launch):
    jail_pid, uid = _whale_killed_with_sigkill(sandbox, "import time; time.sleep(60)", launch)
    deadline = time.monotonic() + 3
    while _alive(jail_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(jail_pid)
    assert _wait_gone(uid) == []
    cgroups.reap_stale()  # the dead parent's (now empty) run folders


@ROOT
def test_the_next_whale_process_reaps_a_run_that_outlived_its_whale(sandbox):
    # A harness that clears its parent-death signal survives whale's kill -9 (as the init of
    # nsjail's PID namespace); the next whale process kills what is left in stale run groups.
    code = "import ctypes, time; ctypes.CDLL(None).prctl(1, 0, 0, 0, 0); time.sleep(60)"
    _, uid = _whale_killed_with_sigkill(sandbox, code)
    cgroups.reap_stale()
    assert _wait_gone(uid) == []


UID_OF_SPAWNED_JAIL = (
    "import sys\n"
    "from whale.harness.budget import Limits\n"
    "from whale.harness.sandbox import Sandbox, python_executable\n"
    "j = Sandbox(sys.argv[1]).spawn([python_executable(), '-I', '-S', '-c', 'pass'], Limits())\n"
    "print(j.uid, flush=True)\n"
    "sys.stdin.read()\n"  # holds the jail (and its uid) until the test closes stdin
    "j.kill()\n"
)


@ROOT
def test_three_whale_processes_never_share_a_uid(sandbox):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UID_OF_SPAWNED_JAIL, sandbox],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=HERE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        got = [int(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.communicate("")
    assert len(set(got)) == 3


def _squat(uid: int) -> None:
    """A process of `uid` that is no child of ours (as if left by a whale that died)."""
    subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 &"], user=uid, group=uid, check=True)
    assert uids.scan((uid,))


@ROOT
def test_a_uid_left_busy_by_a_dead_owner_is_emptied_before_it_is_used(tmp_path):
    pool = uids.UidPool(base=206_000, size=1, directory=str(tmp_path / "locks"))
    _squat(206_000)
    try:
        lease = pool.take()
        assert lease.uid == 206_000 and uids.scan((206_000,)) == []
        pool.give(lease)
    finally:
        uids.kill_uid(206_000)


@ROOT
def test_a_uid_its_last_holder_saw_empty_is_taken_without_a_scan(tmp_path, monkeypatch):
    pool = uids.UidPool(base=206_020, size=1, directory=str(tmp_path / "locks"))
    pool.give(pool.take())  # a new lock file: scanned, then marked clean
    scans: list[object] = []
    scan = uids.scan
    monkeypatch.setattr(uids, "scan", lambda u: scans.append(u) or scan(u))
    pool.give(pool.take(), known_empty=True)
    assert scans == []


HOLDER_DIES = (
    "import os, subprocess, sys\n"
    "from whale.harness import uids\n"
    "lease = uids.UidPool(base=int(sys.argv[1]), size=1, directory=sys.argv[2]).take()\n"
    "subprocess.run(['sh', '-c', 'sleep 60 >/dev/null 2>&1 &'], user=lease.uid,\n"
    "               group=lease.uid, check=True)\n"
    "os._exit(0)\n"  # dies holding the uid, never gives it back
)


@ROOT
def test_a_clean_uid_whose_next_holder_died_is_emptied_before_it_is_used(tmp_path):
    locks = str(tmp_path / "locks")
    pool = uids.UidPool(base=206_030, size=1, directory=locks)
    pool.give(pool.take())  # marked clean
    subprocess.run([sys.executable, "-c", HOLDER_DIES, "206030", locks], cwd=HERE, check=True)
    assert uids.scan((206_030,))  # what the dead holder left
    try:
        lease = pool.take()
        assert lease.uid == 206_030 and uids.scan((206_030,)) == []
        pool.give(lease)
    finally:
        uids.kill_uid(206_030)


@ROOT
def test_a_uid_that_cannot_be_emptied_is_never_handed_out_again(tmp_path, monkeypatch):
    pool = uids.UidPool(
        base=206_010, size=2, directory=str(tmp_path / "locks"), empty_timeout_s=0.2
    )
    _squat(206_010)
    kill = uids.kill_uid
    monkeypatch.setattr(uids, "kill_uid", lambda uid: None)  # as if it could not be killed
    try:
        first = pool.take()
        pool.give(first)
        second = pool.take()
        assert 206_010 in pool.quarantined and first.uid == second.uid == 206_011
    finally:
        kill(206_010)


FOUR_CHILDREN = (
    "import os, time\n"
    "pids = []\n"
    "for _ in range(4):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        b = b'x' * (800 << 20)\n"  # written, so resident
    "        time.sleep(3)\n"
    "        os._exit(0)\n"
    "    pids.append(pid)\n"
    "print(','.join(str(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1])) for p in pids))\n"
)


@ROOT
def test_four_children_of_800mb_share_one_memory_cap(sandbox):
    j = _sleeper(sandbox, FOUR_CHILDREN, memory_mb=1024)
    try:
        out, _ = j.proc.communicate(timeout=60)
        assert j.memory_cap == "cgroup"
        peak = j.memory_peak()
        assert peak is not None and peak <= 1024 << 20
        assert out.decode().strip().split(",").count("0") < 4
    finally:
        j.kill()


@ROOT
def test_a_run_over_its_memory_cap_ends_with_a_recorded_status(sandbox):
    src = (
        "import os, time\n"
        "def run(q, env):\n"
        + "".join("    " + line + "\n" for line in FOUR_CHILDREN.splitlines()[1:-1])
        + "    return ','.join(str(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1])) for p in pids)\n"
    )
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), limits=Limits(memory_mb=1024))
    t = rt.run(src, "x")
    assert t.status in ("ok", "crashed", "killed", "error")
    assert t.status != "ok" or t.answer.split(",").count("0") < 4


def test_without_cgroups_memory_is_capped_per_process(sandbox, monkeypatch):
    monkeypatch.setattr(cgroups, "create", lambda *a: None)
    j = _sleeper(sandbox, "pass")
    j.kill()
    assert j.memory_cap == "rlimit"


THIRD_PARTY = ("numpy", "sympy", "reasoning_gym", "whale", "yaml", "requests", "boto3", "pytest")


def test_no_third_party_module_is_importable_by_any_path(sandbox):
    import site
    import sysconfig

    paths = {*sys.path, *site.getsitepackages(), sysconfig.get_path("purelib"), HERE}
    base = os.path.realpath(sys.base_prefix)
    paths |= {f"{base}/lib/python3.11/site-packages", "/usr/lib/python3/dist-packages",
              "/usr/local/lib/python3.11/dist-packages", "/usr/lib/python3.11/dist-packages"}  # fmt: skip
    src = (
        "import importlib, sys\n"
        "def run(q, env):\n"
        f"    sys.path[:0] = {sorted(p for p in paths if p)!r}\n"
        "    got = []\n"
        f"    for name in {THIRD_PARTY!r}:\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "            got.append(name)\n"
        "        except ImportError:\n"
        "            pass\n"
        "    return ','.join(got)\n"
    )
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(src, "x")
    assert t.status == "ok" and t.answer == ""


def test_the_standard_library_still_imports(sandbox):
    src = (
        "import ctypes, decimal, json, sqlite3, ssl, zlib, zoneinfo\n"
        "def run(q, env):\n"
        "    return str(zoneinfo.ZoneInfo('Europe/Paris').key)\n"
    )
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(src, "x")
    assert t.status == "ok" and t.answer == "Europe/Paris", t.error


def test_the_environment_is_cleared(sandbox, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    src = "import os\ndef run(q, env):\n    return repr(sorted(os.environ))\n"
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(src, "x")
    assert t.status == "ok" and "OPENAI_API_KEY" not in t.answer


def test_there_is_no_proc_inside(sandbox):
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(
        "import os\ndef run(q, env):\n    return str(os.path.exists('/proc/self'))\n", "x"
    )
    assert t.status == "ok" and t.answer == "False"


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(c) for c in f.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _real_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))


@ROOT
def test_the_harness_is_its_unprivileged_uid_on_the_host(sandbox):
    j = _sleeper(sandbox)
    try:
        # Seen once in a full run (a clean clone, 2 cores): a python descendant read as uid 0
        # at the first look, alone it never is: so the uids are read until they settle (a
        # harness that stays root still fails after the 5 s).
        deadline = time.monotonic() + 5
        uids: set[int] = set()
        while time.monotonic() < deadline:
            pythons = [p for p in _descendants(j.proc.pid) if "python" in _exe(p)]
            try:
                uids = {_real_uid(p) for p in pythons}
            except (OSError, StopIteration):
                uids = set()
            if pythons and uids == {j.uid}:
                break
            time.sleep(0.02)
        assert pythons and uids == {j.uid}
        assert j.uid != 0
    finally:
        j.kill()


@ROOT
def test_rlimit_nproc_alone_stops_40_forks(sandbox, monkeypatch):
    monkeypatch.setattr(cgroups, "create", lambda *a: None)  # no pids.max: only RLIMIT_NPROC
    src = (
        "import os, time\n"
        "def run(q, env):\n"
        "    n = 0\n"
        "    try:\n"
        "        for _ in range(40):\n"
        "            if os.fork() == 0:\n"
        "                time.sleep(30); os._exit(0)\n"
        "            n += 1\n"
        "    except OSError as e:\n"
        "        return f'{n} {e.errno}'\n"
        "    return f'{n} none'\n"
    )
    t = Runtime(model=None, sandbox=Sandbox(sandbox), limits=Limits(processes=16)).run(src, "x")
    assert t.status == "ok" and int(t.answer.split()[0]) < 16 and t.answer.split()[1] == "11"


@ROOT
def test_leftovers_names_a_live_run_and_not_a_finished_one(sandbox):
    j = _sleeper(sandbox)
    time.sleep(0.3)
    try:
        assert any(f"uid {j.uid} " in line for line in leftovers())
    finally:
        j.kill()
    assert not any(f"uid {j.uid} " in line for line in leftovers())


class _Held:
    def __init__(self, sandbox: str) -> None:
        self.j = _sleeper(sandbox)

    def alive(self) -> bool:
        return self.j.proc.poll() is None

    def discard(self) -> None:
        self.j.kill()


def test_a_failed_start_does_not_kill_workers_the_pool_started(sandbox):
    # A jail dies with the thread that started it: the filler must not exit while a worker it
    # started may serve a run, even after a later start failed.
    starts = []

    def spawn() -> _Held:
        if threading.current_thread() is not threading.main_thread():
            starts.append(1)
            if len(starts) > 1:
                raise RuntimeError("start failed")
        return _Held(sandbox)

    pool: WorkerPool[_Held] = WorkerPool(spawn, size=1, fillers=1)
    try:
        first = pool.take()  # started here; the filler starts one more
        deadline = time.monotonic() + 10
        while not pool._idle and time.monotonic() < deadline:
            time.sleep(0.02)
        pooled = pool.take()  # the filler's worker; its refill fails
        while len(starts) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # the filler thread would be gone by now, and its jails with it
        assert len(starts) == 2 and pooled.alive()
        first.discard()
        pooled.discard()
    finally:
        pool.close()


@ROOT
@pytest.mark.parametrize("how", ["helper", "chain", "preexec"])
def test_the_harness_starts_inside_the_runs_cgroups(sandbox, how, request):
    if how == "helper":
        request.getfixturevalue("helper")
    j = Sandbox(sandbox, launch=how).spawn(  # type: ignore[arg-type]
        [python_executable(), "-I", "-S", "-c", "import time; time.sleep(60)"], Limits()
    )
    try:
        assert j.group is not None and j.group.dirs
        deadline = time.monotonic() + 5
        while not (pythons := [p for p in _descendants(j.proc.pid) if "python" in _exe(p)]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with open(f"/proc/{pythons[0]}/cgroup") as f:
            mine = f.read()
        name = os.path.basename(j.group.dirs[0])
        assert mine.count(name) == len(j.group.dirs)
    finally:
        j.kill()


def test_a_run_group_that_cannot_be_read_is_not_called_empty(tmp_path):
    # "Empty" spares the uid's /proc scan when it is given back and, with the lock file's
    # clean mark, when it is next taken: a cgroup whose files cannot be read proves nothing.
    from whale.harness.cgroups import RunGroup

    gone = str(tmp_path / "gone")
    v2 = RunGroup(dirs=[gone], kill_file=f"{gone}/cgroup.kill", events_file=f"{gone}/cgroup.events")
    v1 = RunGroup(dirs=[gone])
    assert not v2.empty() and not v1.empty()
    assert not v2.wait_empty(0.05)
