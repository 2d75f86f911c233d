"""The nested python tool has limits of its own and runs in its own jail."""

from whale.harness import PythonToolLimits, Runtime
from whale.harness.sandbox import Sandbox


def run_code(code, timeout=None, sandbox="auto", **limits):
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), python_limits=PythonToolLimits(**limits))
    return rt.run_python(code, timeout)


def test_returns_stdout_stderr_and_exception():
    r = run_code("import sys\nprint('out')\nprint('err', file=sys.stderr)\n1/0")
    assert r["stdout"] == "out\n" and "err" in r["stderr"]
    assert r["error"] == "ZeroDivisionError: division by zero"


def test_timeout_kills_the_code():
    r = run_code("while True: pass", timeout=0.5)
    assert r["timed_out"] and "TimeoutError" in r["error"]


def test_timeout_is_capped_by_the_tool_limit():
    r = run_code("import time; time.sleep(5)", timeout=100, timeout_s=0.5)
    assert r["timed_out"]


def test_memory_is_capped():
    r = run_code("b = bytearray(2 * 1024**3)", memory_mb=256)
    assert "MemoryError" in r["error"]


def test_output_is_truncated():
    r = run_code("print('x' * 1_000_000)", output_chars=100)
    assert len(r["stdout"]) <= 100 and "OutputLimit" in r["error"]


def test_no_network():
    r = run_code("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert r["error"] and ("unreachable" in r["error"] or "refused" in r["error"])


def test_harness_scratch_is_not_shared_with_the_tool():
    src = (
        "def run(q, env):\n"
        "    open('note.txt', 'w').write('hi')\n"
        "    return str(env.tools.python('import os; print(os.listdir(\".\"))'))\n"
    )
    t = Runtime(model=None).run(src, "x")
    assert t.status == "ok" and "note.txt" not in t.answer


def test_code_over_128kb_runs(sandbox):
    # One argv string may not pass 128 KB (E2BIG): the code goes to the interpreter by stdin.
    code = "a = 0\n" + "a += 1\n" * 30_000 + "print(a)\n"
    assert len(code) > 200_000
    r = run_code(code, sandbox=sandbox)
    assert r["stdout"] == "30000\n" and r["error"] is None


def test_code_sees_an_empty_stdin(sandbox):
    # Its own source came by stdin: nothing of it is left there for the code to read.
    r = run_code("import sys\nprint(repr(sys.stdin.read()))", sandbox=sandbox)
    assert r["stdout"] == "''\n" and r["error"] is None


def test_a_nul_byte_is_a_syntax_error_of_the_code(sandbox):
    r = run_code("print(1)\0", sandbox=sandbox)
    assert "SyntaxError" in r["error"] and "null bytes" in r["error"]
