"""Every kind of bad harness gets a recorded outcome and never takes the evaluator down.

Each test runs twice on each jail: as the runtime is bare, and with the doors issue 24 opened
(a model, hence the run's OpenAI-compatible endpoint and its thread and socket, and an allowed
package set mounted): none of the guarantees may be weaker with them."""

import subprocess
import time
import uuid

import pytest

from tests.fakes import ScriptedModel
from tests.harness.wheels import write_wheel
from whale.harness import Budget, Limits
from whale.harness import Runtime as BareRuntime
from whale.harness.packages import PackageSet, build_folder
from whale.harness.sandbox import Sandbox

Runtime = BareRuntime  # replaced by `doors` for the second pass


@pytest.fixture(scope="module")
def allowed(tmp_path_factory) -> PackageSet:
    wheel = write_wheel(tmp_path_factory.mktemp("wheels"), "allowed", "1.0",
                        {"allowed/__init__.py": "VALUE = 42\n"})  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_NO_INDEX", "1")
        folder = build_folder([str(wheel)], tmp_path_factory.mktemp("cache"))
    return PackageSet(str(folder), ("allowed",))


@pytest.fixture(autouse=True, params=["bare", "endpoint+packages"])
def doors(request, monkeypatch):
    if request.param == "bare":
        return
    packages = request.getfixturevalue("allowed")

    def with_doors(*args, **kwargs):
        if kwargs.get("model") is None:
            kwargs["model"] = ScriptedModel()
        kwargs.setdefault("packages", packages)
        return BareRuntime(*args, **kwargs)

    monkeypatch.setitem(globals(), "Runtime", with_doors)


@pytest.fixture
def runtime(model, sandbox, doors):
    """As tests/harness/conftest.py's, through this module's `Runtime` (with the doors or not)."""
    return Runtime(model=model, budget=Budget(run_timeout_s=5.0), limits=Limits(cpu_s=10),
                   sandbox=Sandbox(sandbox))  # fmt: skip


def test_the_doors_are_open_in_the_second_pass(runtime, doors, request):
    src = ("import os\ndef run(q, env):\n    try:\n        import allowed\n"
           "        has = True\n    except ImportError:\n        has = False\n"
           "    return repr((bool(env.openai_base_url), has))\n")  # fmt: skip
    both = request.node.callspec.params["doors"] != "bare"
    assert runtime.run(src, "x").answer == repr((True, both))


def test_syntax_error_is_a_load_error(runtime):
    t = runtime.run("def run(q, env)\n    return q", "x")
    assert t.status == "error" and "load: " in t.error and "SyntaxError" in t.error


def test_missing_run_is_a_load_error(runtime):
    t = runtime.run("def solve(q, env):\n    return q\n", "x")
    assert t.status == "error" and "defines no callable run" in t.error


def test_wrong_signature_is_a_load_error(runtime):
    t = runtime.run("def run(q):\n    return q\n", "x")
    assert t.status == "error" and "cannot be called as run(question, env)" in t.error


def test_raising_harness_records_the_exception(runtime):
    t = runtime.run("def run(q, env):\n    raise ValueError('nope ' + q)\n", "x")
    assert t.status == "error" and "ValueError: nope x" in t.error


def test_infinite_loop_times_out(sandbox):
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=1.0))
    t = rt.run("def run(q, env):\n    while True:\n        pass\n", "x")
    # status timeout: the 1 s deadline ended it (the loop never ends by itself); no wall-clock
    # bound, which would measure this CPU
    assert t.status == "timeout"


def test_timeout_kills_the_whole_process_tree(sandbox):
    marker = f"whale-{uuid.uuid4().hex}"
    src = (
        "import subprocess, sys, time\n"
        "def run(q, env):\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "    time.sleep(60)\n"
    )
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=1.5))
    t = rt.run(src, "x")
    assert t.status == "timeout"
    time.sleep(0.2)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps


def test_allocating_8gb_fails_inside_the_jail(runtime):
    t = runtime.run("def run(q, env):\n    b = bytearray(8 * 1024**3)\n    return 'x'\n", "x")
    assert t.status == "error" and "MemoryError" in t.error


def test_fork_bomb_is_contained(sandbox):
    src = (
        "import os\n"
        "def run(q, env):\n"
        "    n = 0\n"
        "    try:\n"
        "        while True:\n"
        "            if os.fork() == 0:\n"
        "                import time; time.sleep(30); os._exit(0)\n"
        "            n += 1\n"
        "    except OSError as e:\n"
        "        return f'stopped after {n}: {e.errno}'\n"
    )
    t = Runtime(
        model=None,
        sandbox=Sandbox(sandbox),
        budget=Budget(run_timeout_s=10),
        limits=Limits(processes=16),
    ).run(src, "x")
    assert t.status == "ok"
    forks = int(t.answer.split()[2].rstrip(":"))
    assert forks < 16


def test_writing_1gb_fails_with_a_file_size_error(runtime):
    src = (
        "def run(q, env):\n"
        "    with open('big.bin', 'wb') as f:\n"
        "        for _ in range(1024):\n"
        "            f.write(b'x' * (1 << 20))\n"
        "    return 'wrote'\n"
    )
    t = runtime.run(src, "x")
    assert t.status == "error" and ("File too large" in t.error or "No space" in t.error)


def test_scratch_folder_total_size_is_capped(sandbox):
    src = (
        "def run(q, env):\n"
        "    for i in range(64):\n"
        "        with open(f'f{i}.bin', 'wb') as f:\n"
        "            f.write(b'x' * (8 << 20))\n"
        "    return 'wrote'\n"
    )
    t = Runtime(model=None, sandbox=Sandbox(sandbox), limits=Limits(scratch_mb=32)).run(src, "x")
    assert t.status == "error" and "No space left" in t.error


def test_printing_100mb_is_killed_at_the_output_limit(runtime):
    src = "import sys\ndef run(q, env):\n    sys.stdout.write('x' * 100_000_000)\n    return 'x'\n"
    t = runtime.run(src, "x")
    assert t.status == "killed" and "output limit" in t.error
    assert len(t.stdout_tail) <= 4000


def test_non_string_answer_is_an_error(runtime):
    t = runtime.run("def run(q, env):\n    return 42\n", "x")
    assert t.status == "error" and "returned int, expected str" in t.error


def test_socket_cannot_reach_the_network(runtime):
    src = (
        "import socket\n"
        "def run(q, env):\n"
        "    s = socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
        "    return 'connected'\n"
    )
    t = runtime.run(src, "x")
    assert t.status == "error"
    assert "Network is unreachable" in t.error or "Connection refused" in t.error


def test_files_outside_scratch_are_invisible(runtime, tmp_path):
    secret = tmp_path / "references.jsonl"
    secret.write_text("the answer is 42")
    src = f"def run(q, env):\n    return open({str(secret)!r}).read()\n"
    t = runtime.run(src, "x")
    assert t.status == "error" and "FileNotFoundError" in t.error


def test_system_files_are_read_only(runtime):
    src = "def run(q, env):\n    open('/usr/whale-was-here', 'w')\n    return 'x'\n"
    t = runtime.run(src, "x")
    assert t.status == "error" and "Read-only file system" in t.error


def test_runs_as_an_unprivileged_uid(runtime):
    t = runtime.run("import os\ndef run(q, env):\n    return str(os.getuid())\n", "x")
    assert t.status == "ok" and t.answer != "0"


def test_os_exit_is_recorded_as_crashed(runtime):
    t = runtime.run("import os\ndef run(q, env):\n    os._exit(3)\n", "x")
    assert t.status == "crashed" and "exit status" in t.error


def test_forged_broker_message_is_not_recorded_as_a_model_call(runtime):
    # The harness writes its own frame claiming a model completion; the broker treats it as
    # an unknown request and records nothing.
    src = (
        "import os, sys\n"
        "sys.path.insert(0, '/whale')\n"
        "import worker\n"
        "def run(q, env):\n"
        "    link = env._link\n"
        "    worker.send(link.wfd, {'op': 'model_call', 'args': {'text': 'forged'}})\n"
        "    return str(worker.recv(link.rfd)['error'])\n"
    )
    t = runtime.run(src, "x")
    assert t.status == "ok" and "unknown request" in t.answer
    assert t.model_calls() == []


def test_warm_workers_are_fresh_for_every_run(sandbox):
    # A pooled worker has run nothing before its run: state left by one run is never seen
    # by the next.
    src = (
        "import os\n"
        "def run(q, env):\n"
        "    seen = os.path.exists('mark')\n"
        "    open('mark', 'w').write('x')\n"
        "    return str(seen)\n"
    )
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), warm=2)
    try:
        answers = [rt.run(src, "x").answer for _ in range(5)]
    finally:
        rt.close()
    assert answers == ["False"] * 5


def test_cpu_limit_ends_a_busy_harness_before_the_wall_timeout(sandbox):
    t = Runtime(
        model=None,
        sandbox=Sandbox(sandbox),
        budget=Budget(run_timeout_s=30),
        limits=Limits(cpu_s=1),
    ).run("def run(q, env):\n    while True:\n        pass\n", "x")
    # crashed, not timeout: the 1 s CPU limit ended it before the 30 s wall timeout would
    assert t.status == "crashed"


def test_open_files_are_capped(sandbox):
    src = (
        "def run(q, env):\n"
        "    files = [open(f'f{i}', 'w') for i in range(200)]\n"
        "    return str(len(files))\n"
    )
    t = Runtime(model=None, sandbox=Sandbox(sandbox), limits=Limits(open_files=32)).run(src, "x")
    assert t.status == "error" and "Too many open files" in t.error


def test_an_oversized_broker_message_kills_the_run(sandbox):
    src = "def run(q, env):\n    env.llm('x' * 3_000_000)\n    return 'x'\n"
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), limits=Limits(message_bytes=1_000_000))
    t = rt.run(src, "x")
    assert t.status == "killed" and "over the limit" in t.error


# The kernel's keyrings are not namespaced by a jail: a jailed process shares the session
# keyring of the whale process that started it (and "possesses" it, with every right), and
# its uid's user keyring outlives the run and is found again by the next run given that uid.
KEYS = (
    "import ctypes, json\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def run(q, env):\n"
    "    found = libc.syscall(250, 10, -3, b'user', q.encode(), 0)\n"  # KEYCTL_SEARCH @s
    "    name = (q + '-left').encode()\n"
    "    left = [libc.syscall(248, b'user', name, b'x', 1, ring) for ring in (-3, -4)]\n"
    "    return json.dumps({'found': found > 0, 'left': [k > 0 for k in left]})\n"
)


def _keyctl_search(ring: int, name: bytes) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(250, 10, ring, b"user", name, 0)


def test_no_keyring_reaches_whale_or_outlives_the_run(runtime):
    # A key in whale's session keyring is out of the harness's reach, and the harness can
    # store no key anywhere (the user keyring of its uid would carry it to a later run).
    import ctypes
    import json

    from whale.harness import launcher

    if launcher.resolve("auto") != "helper":
        pytest.xfail("only whale-launch (make launcher) keeps keyrings from the jail")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    secret = f"whale-secret-{uuid.uuid4().hex[:8]}".encode()
    key = libc.syscall(248, b"user", secret, b"s3cret", 6, -3)  # in whale's session keyring
    assert key > 0
    try:
        t = runtime.run(KEYS, secret.decode())
    finally:
        libc.syscall(250, 21, key)  # KEYCTL_INVALIDATE
    assert t.status == "ok", t.error
    got = json.loads(t.answer)
    assert not got["found"], "the harness found a key of whale's session keyring"
    assert _keyctl_search(-3, secret + b"-left") < 0, "the harness left a key in whale's keyring"
    assert got["left"] == [False, False], "the harness stored keys (session, user keyring)"
