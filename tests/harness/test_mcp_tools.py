"""MCP tools (`runtime.tools.mcp.NAME`): a real MCP server (tests/harness/mcp_server.py, the
`mcp` SDK's MCPServer over stdio) started by the tools process; its tools offered to a jailed
harness as `env.tools.NAME.TOOL`, brokered, budgeted and recorded like the user's callables."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from whale import config as cfgmod
from whale.config import ConfigError
from whale.harness import Budget, Runtime, RuntimeConfig, make_runtime
from whale.harness.tools import parse_tools

pytest.importorskip("mcp")

ROOT = Path(__file__).resolve().parents[2]
SERVER = str(Path(__file__).with_name("mcp_server.py"))


def server(**extra: object) -> dict:
    return {"command": [sys.executable, SERVER], **extra}


def make(**servers: dict) -> Runtime:
    return Runtime(budget=Budget(run_timeout_s=30), tools=parse_tools({"mcp": servers}))


@pytest.fixture(scope="module")
def rt():
    r = make(t=server(timeout_s=1.0), u=server(calls=1))
    yield r
    r.close()


def run(rt: Runtime, body: str, q: str = "q"):
    src = "def run(q, env):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return rt.run(src, q)


def tool_events(t):
    return [e for e in t.events if e["kind"] == "tool"]


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_the_server_s_tools_are_listed_with_their_description_and_schema(rt):
    specs = {s.name: s for s in rt.tool_specs()}
    assert {"t.add", "t.get_weather", "t.hang", "t.fail", "t.die", "u.add"} <= set(specs)
    assert specs["t.add"].describe().startswith(
        "- `env.tools.t.add(a: integer, b: integer)`: Add two integers. At most 12 calls per "
        "question, 1 s each;")  # fmt: skip
    assert specs["t.get_weather"].signature == '(city: string, unit: string = "C")'
    assert specs["t.get_weather"].target == "get-weather"  # its name on the server


def test_a_harness_calls_a_server_tool(rt):
    t = run(rt, "return repr([env.tools.t.add(1, 2), env.tools.t.add(a=2, b=3)])")
    assert t.status == "ok" and t.answer == "[3, 5]"


def test_a_tool_whose_name_is_no_identifier_is_called_by_its_attribute(rt):
    t = run(rt, "return env.tools.t.get_weather('Paris', unit='F')")
    assert '"city": "Paris"' in t.answer and '"unit": "F"' in t.answer


def test_every_call_is_on_the_trajectory(rt):
    t = run(rt, "env.tools.t.add(1, 2)\ntry:\n    env.tools.t.fail()\nexcept Exception:\n"
                "    pass\nreturn 'x'")  # fmt: skip
    events = tool_events(t)
    assert [(e["name"], e["args"], e["result"]) for e in events] == [
        ("t.add", {"a": 1, "b": 2}, 3), ("t.fail", {}, None)]  # fmt: skip
    assert "the server's own error" in events[1]["error"]


def test_the_server_s_error_is_a_tool_error_and_the_run_goes_on(rt):
    t = run(rt, "try:\n    env.tools.t.fail()\nexcept Exception as e:\n"
                "    return type(e).__name__ + ': ' + str(e)")  # fmt: skip
    assert t.status == "ok"
    assert t.answer.startswith("ToolError: t.fail:") and "the server's own error" in t.answer


@pytest.mark.parametrize(("call", "error"), [
    ("env.tools.t.add(1)", "t.add(): missing argument 'b'"),
    ("env.tools.t.add(1, '2')", "t.add(b=...): expected integer, got string"),
])  # fmt: skip
def test_arguments_are_checked_against_the_input_schema_unsent(rt, call, error):
    t = run(rt, f"try:\n    {call}\nexcept Exception as e:\n"
                "    return str(e) + ' | ' + str(env.budget.tools['t.add'])")  # fmt: skip
    assert t.answer == f"{error} | 12"


def test_each_server_tool_has_its_own_budget(rt):
    t = run(rt, "env.tools.u.get_weather('x')\nenv.tools.u.add(1, 1)\nenv.tools.u.add(1, 1)\n"
                "return 'x'")  # fmt: skip
    assert t.status == "budget_exceeded" and "u.add limit of 1 calls" in t.error


def test_a_tool_that_hangs_times_out_and_the_server_goes_on(rt):
    t0 = time.monotonic()
    t = run(rt, "try:\n    env.tools.t.hang()\nexcept Exception as e:\n    err = str(e)\n"
                "return err + ' | ' + str(env.tools.t.add(2, 2))")  # fmt: skip
    assert t.status == "ok" and t.answer.startswith("t.hang: timed out after 1 s")
    assert t.answer.endswith("| 4") and time.monotonic() - t0 < 10


def test_a_server_that_dies_mid_run_fails_its_calls_and_the_run_goes_on():
    r = make(t=server(), u=server())
    try:
        pid = int(run(r, "return str(env.tools.t.pid())").answer)
        body = ("out = []\nfor f in (env.tools.t.die, lambda: env.tools.t.add(1, 1),\n"
                "          lambda: env.tools.u.add(1, 1)):\n    try:\n        out.append(f())\n"
                "    except Exception as e:\n        out.append(str(e))\nreturn repr(out)")  # fmt: skip
        t = run(r, body)
        died, after, other = eval(t.answer)  # noqa: S307 - our own harness's repr
        assert t.status == "ok"
        assert "closed its connection" in died and "is not running" in after
        assert other == 2  # the other server is untouched
        assert wait_gone(pid)
    finally:
        r.close()


def test_no_server_is_left_after_close():
    r = make(t=server())
    pid = int(run(r, "return str(env.tools.t.pid())").answer)
    assert not gone(pid)
    r.close()
    assert wait_gone(pid)


def test_no_server_is_left_after_whale_is_killed():
    script = ("import sys, time\nfrom whale.harness import Runtime\n"
              "from whale.harness.tools import parse_tools\n"
              f"r = Runtime(tools=parse_tools({{'mcp': {{'t': {{'command': [sys.executable, "
              f"{SERVER!r}]}}}}}}))\n"
              "t = r.run('def run(q, env):\\n    return str(env.tools.t.pid())\\n', 'q')\n"
              "print(r._tool_host.pid, t.answer, flush=True)\ntime.sleep(120)\n")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        tools_pid, server_pid = map(int, p.stdout.readline().split())
        assert not gone(tools_pid) and not gone(server_pid)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert wait_gone(tools_pid) and wait_gone(server_pid)
    finally:
        p.kill()


def test_a_server_that_does_not_start_fails_make_runtime_naming_it():
    cfg = cfgmod.build(RuntimeConfig, {"tools": {"mcp": {"s": {
        "command": [sys.executable, SERVER, "--fail-start"]}}}})  # fmt: skip
    with pytest.raises(ConfigError, match="MCP server 's' failed to start") as e:
        make_runtime(cfg, None)
    assert e.value.field == "runtime.tools.mcp.s"


def test_a_server_command_that_does_not_exist_fails_make_runtime():
    cfg = cfgmod.build(RuntimeConfig, {"tools": {"mcp": {"s": {
        "command": ["/nonexistent/mcp-server"]}}}})  # fmt: skip
    with pytest.raises(ConfigError) as e:
        make_runtime(cfg, None)
    assert e.value.field == "runtime.tools.mcp.s"
