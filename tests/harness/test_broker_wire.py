"""Hostile traffic on the broker pipe (issue 8): a harness that stops reading, forges `done`,
or sends JSON the broker must refuse. Each ends as a clear recorded outcome, never a hang or a
`crashed "runtime: ..."`."""

import os
import threading
import time
import uuid

import pytest

from tests.fakes import ScriptedModel
from whale.harness import Budget, Limits, Runtime
from whale.harness.sandbox import Sandbox


def guarded_run(rt, src, limit_s):
    """rt.run(src) in a thread: fail (not hang the suite) if it has not returned in limit_s."""
    box = {}
    th = threading.Thread(target=lambda: box.update(t=rt.run(src, "x")), daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"Runtime.run still running after {limit_s} s"
    return box["t"], time.monotonic() - t0


def test_200kb_unknown_op_and_no_reading_ends_at_the_deadline(sandbox):
    # The exact attack: one raw 200 KB frame with an unknown op, then the harness never reads.
    # The old broker echoed the op (200 KB, more than the pipe holds) and blocked in write.
    src = (
        "import os, struct, time\n"
        "def run(q, env):\n"
        "    body = ('{\"op\": \"' + 'A' * 200_000 + '\", \"args\": {}}').encode()\n"
        "    view = memoryview(struct.pack('>I', len(body)) + body)\n"
        "    while view:\n"
        "        view = view[os.write(env._link.wfd, view):]\n"
        "    time.sleep(30)\n"
        "    return 'x'\n"
    )
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=2))
    t, _ = guarded_run(rt, src, 15)  # returned within 15 s: not after the harness's 30 s
    assert t.status == "timeout"


def test_unknown_op_reply_does_not_echo_the_op(runtime):
    src = (
        "import sys\n"
        "sys.path.insert(0, '/whale')\n"
        "import worker\n"
        "def run(q, env):\n"
        "    worker.send(env._link.wfd, {'op': 'A' * 200_000, 'args': {}})\n"
        "    return worker.recv(env._link.rfd)['error']\n"
    )
    t = runtime.run(src, "x")
    assert t.status == "ok" and t.answer.startswith("unknown request 'AAA")
    assert len(t.answer) < 200


def test_a_harness_that_stops_reading_its_replies_is_killed_at_the_deadline(sandbox):
    # Many small requests and no reads: the replies fill the pipe and the broker's write
    # stalls. It must give up at the run's deadline (the old broker blocked for good).
    src = (
        "import os, struct, time\n"
        "def run(q, env):\n"
        '    body = b\'{"op": "nope", "args": {}}\'\n'
        "    frame = struct.pack('>I', len(body)) + body\n"
        "    os.set_blocking(env._link.wfd, False)\n"
        "    end = time.monotonic() + 10\n"
        "    while time.monotonic() < end:\n"
        "        try:\n"
        "            os.write(env._link.wfd, frame)\n"
        "        except BlockingIOError:\n"
        "            time.sleep(0.01)\n"
        "    time.sleep(20)\n"
        "    return 'x'\n"
    )
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=2))
    t, _ = guarded_run(rt, src, 15)  # returned within 15 s: not after the harness's 30 s
    assert t.status == "killed" and "stopped reading" in t.error


def _alive_with_comm(name):
    """Pids (not zombies) whose process name is `name`."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        if comm == name and state != "Z":
            pids.append(int(pid))
    return pids


def test_fake_done_after_clearing_the_parent_death_signal_leaves_nothing_alive(sandbox):
    # The harness clears PR_SET_PDEATHSIG, sends a forged `done` and sleeps. Recording it `ok`
    # is the protocol (the worker is the harness), but the worker must not outlive the run.
    marker = "w" + uuid.uuid4().hex[:14]  # a process name holds 15 characters
    src = (
        "import ctypes, os, struct, time\n"
        "def run(q, env):\n"
        "    libc = ctypes.CDLL(None)\n"
        "    libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG: none\n"
        f"    libc.prctl(15, b'{marker}', 0, 0, 0)  # PR_SET_NAME\n"
        '    body = b\'{"op": "done", "status": "ok", "answer": "forged"}\'\n'
        "    os.write(env._link.wfd, struct.pack('>I', len(body)) + body)\n"
        "    time.sleep(60)\n"
    )
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=10))
    t = rt.run(src, "x")
    left = _alive_with_comm(marker)
    for pid in left:  # do not leave it behind for the rest of the suite
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert t.status == "ok" and t.answer == "forged"
    assert left == []


# A harness that sends one raw frame and returns the broker's reply (ok flag and error).
RAW = (
    "import os, struct, sys\n"
    "sys.path.insert(0, '/whale')\n"
    "import worker\n"
    "def run(q, env):\n"
    "    body = {body!r}\n"
    "    os.write(env._link.wfd, struct.pack('>I', len(body)) + body)\n"
    "    reply = worker.recv(env._link.rfd)\n"
    "    return f\"ok={{reply['ok']}} {{reply.get('error')}}\"\n"
)


def raw_llm(args_json):
    body = '{"op": "llm", "args": {"messages": [{"role": "user", "content": "hi"}], '
    return RAW.format(body=(body + args_json + "}}").encode())


def test_json_nested_700_deep_in_llm_args_is_a_clear_error(runtime, model):
    t = runtime.run(raw_llm('"stop": ' + "[" * 700 + "]" * 700), "x")
    assert t.status == "ok" and t.answer.startswith("ok=False") and "nested deeper" in t.answer
    assert model.calls == []


def test_json_nested_5000_deep_is_a_clear_error(runtime):
    # Deeper than json itself recurses: its RecursionError is the same refusal.
    t = runtime.run(raw_llm('"stop": ' + "[" * 5000 + "]" * 5000), "x")
    assert t.status == "ok" and "nested deeper" in t.answer


def test_a_5000_digit_integer_is_a_clear_error(runtime, model):
    t = runtime.run(raw_llm('"max_tokens": ' + "1" * 5000), "x")
    assert t.status == "ok" and t.answer.startswith("ok=False") and "out of range" in t.answer
    assert model.calls == []


def test_an_integer_past_64_bits_is_a_clear_error(runtime):
    t = runtime.run(raw_llm('"max_tokens": ' + str(2**64)), "x")
    assert t.status == "ok" and "out of range" in t.answer


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_non_finite_temperature_is_a_clear_error(runtime, model, value):
    t = runtime.run(raw_llm(f'"temperature": {value}'), "x")
    assert t.status == "ok" and t.answer.startswith("ok=False") and "not finite" in t.answer
    assert model.calls == []


def test_a_negative_temperature_is_refused(runtime, model):
    t = runtime.run("def run(q, env):\n    return env.llm('hi', temperature=-1.0).text\n", "x")
    assert t.status == "error" and "from 0 to 2" in t.error and model.calls == []


def test_the_run_goes_on_after_a_refused_request(sandbox):
    # A refused request is the harness's fault, answered with an error: the run continues.
    src = raw_llm('"temperature": 1e999').replace(
        "    return f", "    assert not reply['ok']\n    return env.llm('again').text + ' ' + f"
    )
    t = Runtime(model=ScriptedModel(["fine"]), sandbox=Sandbox(sandbox)).run(src, "x")
    assert t.status == "ok" and t.answer.startswith("fine ok=False")


def test_200kb_of_code_runs_in_the_python_tool(sandbox):
    # One argv string may not pass 128 KB (E2BIG): the code must not travel in argv.
    src = (
        "def run(q, env):\n"
        "    code = 'a = 0\\n' + 'a += 1\\n' * 30_000 + 'print(a)\\n'\n"
        "    assert len(code) > 200_000\n"
        "    r = env.tools.python(code)\n"
        "    return r.stdout.strip() + ' ' + str(r.error)\n"
    )
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(src, "x")
    assert t.status == "ok" and t.answer == "30000 None"


def test_a_nul_byte_in_python_code_is_a_clear_error(sandbox):
    src = (
        "def run(q, env):\n"
        "    try:\n"
        "        env.tools.python('print(1)\\x00')\n"
        "    except Exception as e:\n"
        "        return f'{type(e).__name__}: {e}'\n"
        "    return 'ran'\n"
    )
    t = Runtime(model=None, sandbox=Sandbox(sandbox)).run(src, "x")
    assert t.status == "ok" and t.answer.startswith("ToolError:") and "NUL byte" in t.answer


def test_error_replies_are_bounded(runtime):
    # A bad call's error may quote the harness (here the role): the quote is cut short.
    src = (
        "def run(q, env):\n"
        "    try:\n"
        "        env.llm([{'role': 'r' * 100_000, 'content': 'x'}])\n"
        "    except Exception as e:\n"
        "        return str(e)\n"
    )
    t = runtime.run(src, "x")
    assert t.status == "ok" and "has role 'rrr" in t.answer and len(t.answer) <= 1000


def test_a_stalled_pipe_is_killed_even_with_a_one_page_pipe(sandbox):
    # The harness shrinks its reply pipe to one page (F_SETPIPE_SZ) and stops reading: a
    # python tool reply (up to 16 KB of output) no longer fits. The run ends at the deadline.
    src = (
        "import fcntl, os, struct, sys\n"
        "sys.path.insert(0, '/whale')\n"
        "import worker\n"
        "def run(q, env):\n"
        "    fcntl.fcntl(env._link.rfd, 1031, 4096)  # F_SETPIPE_SZ\n"
        "    worker.send(env._link.wfd, {'op': 'python', 'args': {'code': \"print('x' * 7000)\"}})\n"
        "    import time; time.sleep(30)\n"
    )
    rt = Runtime(
        model=None,
        sandbox=Sandbox(sandbox),
        budget=Budget(run_timeout_s=3),
        limits=Limits(cpu_s=10),
    )
    t, _ = guarded_run(rt, src, 15)  # returned within 15 s: not after the harness's 30 s
    assert t.status == "killed" and "stopped reading" in t.error


def test_a_nan_temperature_through_env_llm_is_a_clear_error(runtime, model):
    # Not sent as null (which would mean "the default temperature"): the broker refuses it.
    t = runtime.run("def run(q, env):\n    return env.llm('hi', temperature=float('nan'))\n", "x")
    assert t.status == "error" and "ToolError" in t.error and "not finite" in t.error
    assert model.calls == []
