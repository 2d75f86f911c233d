"""User tools (`runtime.tools`): trusted callables a jailed harness calls through the broker,
served by one tools process outside the jail (whale.harness.tools). Real jails, a real tools
process; the tools are in tests/harness/tool_fns.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from whale import config as cfgmod
from whale.config import ConfigError
from whale.harness import Budget, Runtime, RuntimeConfig, make_runtime
from whale.harness.sandbox import Sandbox
from whale.harness.tools import ToolsConfig, parse_tools
from whale.harness.tools import host as hostmod
from whale.harness.tools.gate import MAX_REFUSED_RECORDS
from whale.harness.tools.spec import ARGS_BYTES, RESULT_BYTES

ROOT = Path(__file__).resolve().parents[2]
FNS = "tests.harness.tool_fns"


def tools(**entries: object) -> ToolsConfig:
    return parse_tools({k: (f"{FNS}:{v}" if isinstance(v, str) else v)
                        for k, v in entries.items()})  # fmt: skip


@pytest.fixture(scope="module")
def rt():
    """One Runtime (and tools process) for the tests that do not break it."""
    r = Runtime(
        budget=Budget(run_timeout_s=20),
        tools=tools(
            lookup="lookup", add="add", fail="fail", big="big", not_json="not_json",
            color="color", anything="anything", pid="pid",
            sleep={"function": f"{FNS}:sleep", "timeout_s": 0.5},
            asleep={"function": f"{FNS}:asleep", "timeout_s": 0.5},
            twice={"function": f"{FNS}:add", "calls": 2},
            deep={"function": f"{FNS}:deep", "timeout_s": 5},
        ),
    )  # fmt: skip
    yield r
    r.close()


def run(rt: Runtime, body: str, q: str = "q"):
    """Run a harness whose `run` body is `body` (indented by 4)."""
    src = "def run(q, env):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return rt.run(src, q)


def tool_events(t):
    return [e for e in t.events if e["kind"] == "tool"]


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"  # exited, not yet reaped by whoever adopted it


def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


# --- calls ------------------------------------------------------------------------------------


def test_a_harness_calls_a_tool_by_keyword_and_by_position(rt):
    t = run(rt, "return repr([env.tools.lookup('bob', limit=2), env.tools.add(a=1, b=2)])")
    assert t.status == "ok", t.error
    assert t.answer == repr([{"customer": "bob", "orders": ["o0", "o1"]}, 3])


def test_each_call_is_on_the_trajectory_with_args_result_and_latency(rt):
    t = run(rt, "env.tools.add(2, b=0.25)\nreturn 'x'")
    (e,) = tool_events(t)
    assert (e["name"], e["args"], e["result"], e["error"]) == ("add", {"a": 2, "b": 0.25}, 2.25,
                                                               None)  # fmt: skip
    assert 0 < e["latency_s"] < 5


def test_a_tool_that_raises_is_a_tool_error_and_the_run_goes_on(rt):
    t = run(rt, "try:\n    env.tools.fail('x')\nexcept Exception as e:\n"
                "    return type(e).__name__ + ': ' + str(e)")  # fmt: skip
    assert t.status == "ok"
    assert t.answer == "ToolError: fail: ValueError: no such thing: x"
    assert tool_events(t)[0]["error"] == "ValueError: no such thing: x"


def test_every_kind_of_call_is_recorded_in_order(rt):
    body = ("for f in (lambda: env.tools.add(1), lambda: env.tools.fail('r'),\n"
            "          lambda: env.tools.add('one'), lambda: env.tools.sleep(5),\n"
            "          lambda: env._link.call('tool', name='nope', kwargs={})):\n"
            "    try:\n        f()\n    except Exception:\n        pass\n"
            "return 'x'")  # fmt: skip
    t = run(rt, body)
    names = [(e["name"], e["error"] is None) for e in tool_events(t)]
    assert names == [("add", True), ("fail", False), ("add", False), ("sleep", False),
                     ("nope", False)]  # fmt: skip
    assert "timed out" in tool_events(t)[3]["error"]


def test_concurrent_runs_get_their_own_results(rt):
    body = "return repr([env.tools.add(int(q), b=i) for i in range(5)])"
    with ThreadPoolExecutor(8) as pool:
        trajs = list(pool.map(lambda i: run(rt, body, str(i)), range(16)))
    for i, t in enumerate(trajs):
        assert t.answer == repr([i + b for b in range(5)]), (i, t.error)


# --- budget and timeout -----------------------------------------------------------------------


def test_each_tool_has_its_own_budget_per_question(rt):
    t = run(rt, "env.tools.twice(1)\nenv.tools.twice(1)\nenv.tools.twice(1)\nreturn 'x'")
    assert t.status == "budget_exceeded"
    assert "twice limit of 2 calls" in t.error
    assert [e["error"] is None for e in tool_events(t)] == [True, True, False]


def test_spending_one_tool_leaves_the_others_and_is_visible(rt):
    t = run(rt, "env.tools.twice(1)\nenv.tools.add(1)\n"
                "return repr((env.budget.tools['twice'], env.budget.tools['add'], "
                "env.budget.tool_calls))")  # fmt: skip
    assert t.answer == repr((1, 11, 12))


def test_the_budget_is_per_question(rt):
    for _ in range(2):
        t = run(rt, "env.tools.twice(1)\nenv.tools.twice(1)\nreturn 'x'")
        assert t.status == "ok"


def test_a_call_past_its_timeout_is_an_error_and_the_run_goes_on(rt):
    t0 = time.monotonic()
    t = run(rt, "try:\n    env.tools.sleep(30)\nexcept Exception as e:\n    err = str(e)\n"
                "return err + ' | ' + repr(env.tools.add(1))")  # fmt: skip
    assert t.status == "ok" and t.answer == "sleep: timed out after 0.5 s | 1.5"
    assert time.monotonic() - t0 < 10


def test_an_async_tool_is_cancelled_at_its_timeout(rt):
    t = run(rt, "try:\n    env.tools.asleep(30)\nexcept Exception as e:\n    return str(e)")
    assert t.answer.startswith("asleep: timed out")


def test_a_timeout_is_cut_to_what_is_left_of_the_run():
    r = Runtime(budget=Budget(run_timeout_s=1.5),
                tools=tools(sleep={"function": f"{FNS}:sleep", "timeout_s": 60}))  # fmt: skip
    try:
        t0 = time.monotonic()
        t = run(r, "env.tools.sleep(30)\nreturn 'x'")
        assert t.status == "timeout" and time.monotonic() - t0 < 6
    finally:
        r.close()


# --- arguments and results ----------------------------------------------------------------------


@pytest.mark.parametrize(("call", "error"), [
    ("env.tools.lookup()", "lookup(): missing argument 'customer'"),
    ("env.tools.lookup('a', lim=2)", "lookup(): unexpected argument 'lim' (it takes customer, "
                                     "limit)"),
    ("env.tools.lookup('a', limit='2')", "lookup(limit=...): expected integer, got string"),
    ("env.tools.lookup('a', limit=2.5)", "lookup(limit=...): expected integer, got number"),
    ("env.tools.lookup('a', limit=True)", "lookup(limit=...): expected integer, got boolean"),
    ("env.tools.color('blue')", 'color(c=...): must be one of ["red", "green"]'),
    ("env.tools.color('red', note=3)", "color(note=...): expected string or null, got integer"),
    ("env._link.call('tool', name='add', kwargs=[1, 2])", "add(): arguments must be an object"),
])  # fmt: skip
def test_arguments_are_checked_against_the_signature_before_any_call(rt, call, error):
    t = run(rt, f"try:\n    {call}\nexcept Exception as e:\n"
                "    return str(e) + ' | ' + repr(env.budget.tools)")  # fmt: skip
    assert t.answer.startswith(error), t.answer
    assert "'lookup': 12" in t.answer and "'color': 12" in t.answer  # no budget spent
    assert tool_events(t)[0]["error"].startswith(error)


def test_what_the_signature_allows_is_sent(rt):
    t = run(rt, "return repr([env.tools.color('red', note=None), env.tools.add(1, b=2),\n"
                "             env.tools.anything(x=[1], y={'z': None})])")  # fmt: skip
    assert t.answer == repr(["red", 3, {"x": [1], "y": {"z": None}}])


def test_too_many_positional_arguments_are_refused_in_the_worker(rt):
    t = run(rt, "try:\n    env.tools.add(1, 2, 3)\nexcept Exception as e:\n    return str(e)")
    assert t.answer == "add() takes 2 positional arguments (3 given)"
    assert tool_events(t) == []


def test_arguments_over_the_cap_are_refused_unsent(rt):
    n = ARGS_BYTES
    t = run(rt, f"try:\n    env.tools.lookup('x' * {n})\nexcept Exception as e:\n"
                "    return str(e) + ' | ' + str(env.budget.tools['lookup'])")  # fmt: skip
    assert "over the 65536-byte cap" in t.answer and t.answer.endswith("| 12")
    assert tool_events(t)[0]["args"] == {}  # the oversized arguments are not recorded


def test_a_result_over_the_cap_is_an_error_not_a_crash(rt):
    t = run(rt, f"try:\n    env.tools.big({RESULT_BYTES + 1})\nexcept Exception as e:\n"
                f"    return str(e) + ' | ' + str(len(env.tools.big({RESULT_BYTES - 100})))")  # fmt: skip
    assert t.status == "ok"
    assert "over the 65536-byte cap" in t.answer and t.answer.endswith(f"| {RESULT_BYTES - 100}")


@pytest.mark.parametrize("n", [65, 600, 5000])
def test_a_result_nested_too_deep_is_an_error_at_once(rt, n):
    """Past 64 levels the broker's records and replies stop (streams.MAX_DEPTH); 600 crashed
    the broker's record of the call, 5000 made json.dumps raise RecursionError (no reply at
    all: a timeout). Each is one error reply, at once, and the call is on the record."""
    t0 = time.monotonic()
    t = run(rt, f"try:\n    env.tools.deep({n})\nexcept Exception as e:\n    return str(e)")
    assert t.status == "ok", (t.error, t.failure)
    assert t.answer == "deep: the tool returned data nested deeper than 64 levels"
    assert [e["name"] for e in t.events if e["kind"] == "tool"] == ["deep"]
    assert time.monotonic() - t0 < 4


def test_a_deep_result_under_the_cap_comes_back(rt):
    t = run(rt, "x = env.tools.deep(50)\nd = 0\nwhile x:\n    x, d = x[0], d + 1\nreturn str(d)")
    assert t.answer == "50", (t.answer, t.error)


def test_a_result_that_is_not_json_is_an_error(rt):
    t = run(rt, "try:\n    env.tools.not_json()\nexcept Exception as e:\n    return str(e)")
    assert t.answer.startswith("not_json: the tool returned what is not JSON data")


# --- what a harness can reach -----------------------------------------------------------------


def test_an_undeclared_tool_is_no_attribute(rt):
    t = run(rt, "return repr(hasattr(env.tools, 'secret'))")
    assert t.answer == "False"


@pytest.mark.parametrize("name", ["secret", "python", "retrieve", "os.system", "lookup.x", 7])
def test_an_undeclared_tool_is_refused_by_the_broker(rt, name):
    t = run(rt, f"try:\n    env._link.call('tool', name={name!r}, kwargs={{}})\n"
                "except Exception as e:\n    return type(e).__name__ + ': ' + str(e)")  # fmt: skip
    assert t.answer.startswith(f"ToolError: no tool '{name}'")
    assert tool_events(t)[0]["error"].startswith("no tool")


def test_refused_calls_are_recorded_up_to_a_cap(rt):
    t = run(rt, "for i in range(100):\n    try:\n        env.tools.lookup()\n"
                "    except Exception:\n        pass\nreturn 'x'")  # fmt: skip
    events = tool_events(t)
    assert len(events) == MAX_REFUSED_RECORDS
    assert "not recorded" in events[-1]["error"]


def test_the_jailed_harness_holds_no_way_to_the_tools_process(sandbox):
    """Its open files are its stdio and its two broker pipes; there is no /proc to find the
    tools process in, and its pid namespace holds none of whale's processes."""
    r = Runtime(budget=Budget(run_timeout_s=20), tools=tools(pid="pid"), sandbox=Sandbox(sandbox))
    try:
        tools_pid = r.tool_specs() and r._tool_host.pid
        body = ("import os, sys\nfds = []\nfor fd in range(1024):\n    try:\n"
                "        os.fstat(fd)\n        fds.append(fd)\n    except OSError:\n        pass\n"
                "try:\n    os.kill(int(q), 0)\n    kill = 'reached'\nexcept OSError as e:\n"
                "    kill = type(e).__name__\n"
                "return repr((fds, sorted(map(int, sys.argv[1:3])), os.path.exists('/proc/1'), "
                "kill))")  # fmt: skip
        t = run(r, body, str(tools_pid))
        fds, pipes, proc, kill = eval(t.answer)  # noqa: S307 - our own harness's repr
        assert fds == sorted({0, 1, 2, *pipes})
        assert proc is False and kill == "ProcessLookupError"
    finally:
        r.close()


def test_the_tools_process_listens_nowhere_and_whale_s_ends_are_not_inherited(rt):
    rt.tool_specs()
    p = rt._tool_host._proc
    assert not os.get_inheritable(p.rx) and not os.get_inheritable(p.tx)
    inet = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            inet.add(line.split()[9])
    named_unix = {line.split()[6] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                  if len(line.split()) > 7}  # fmt: skip
    for fd in os.listdir(f"/proc/{p.proc.pid}/fd"):
        link = os.readlink(f"/proc/{p.proc.pid}/fd/{fd}")
        if link.startswith("socket:["):
            inode = link[8:-1]
            assert inode not in inet and inode not in named_unix, link


# --- the tools process's life -----------------------------------------------------------------


def test_the_tools_process_is_gone_after_close():
    r = Runtime(tools=tools(pid="pid"))
    r.tool_specs()
    pid = r._tool_host.pid
    assert pid is not None and not gone(pid)
    r.close()
    assert wait_gone(pid)


def test_the_tools_process_dies_with_a_killed_whale():
    script = ("import time\nfrom whale.harness import Runtime\n"
              "from whale.harness.tools import parse_tools\n"
              f"r = Runtime(tools=parse_tools({{'pid': '{FNS}:pid'}}))\n"
              "r.tool_specs()\nprint(r._tool_host.pid, flush=True)\ntime.sleep(120)\n")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                         text=True)  # fmt: skip
    try:
        pid = int(p.stdout.readline())
        assert not gone(pid)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert wait_gone(pid)
    finally:
        p.kill()


def test_a_dead_tools_process_fails_the_calls_then_starts_again():
    r = Runtime(budget=Budget(run_timeout_s=20), tools=tools(pid="pid", die="die"))
    try:
        first = run(r, "return str(env.tools.pid())").answer
        t = run(r, "try:\n    env.tools.die()\nexcept Exception as e:\n    err = str(e)\n"
                   "return err + ' | ' + str(env.tools.pid())")  # fmt: skip
        err, second = t.answer.split(" | ")
        assert err.startswith("die: the tools process exited")
        assert second != first and wait_gone(int(first))
    finally:
        r.close()


def test_stuck_calls_restart_the_tools_process(monkeypatch):
    monkeypatch.setattr(hostmod, "STUCK_LIMIT", 2)
    r = Runtime(budget=Budget(run_timeout_s=20),
                tools=tools(pid="pid", sleep={"function": f"{FNS}:sleep", "timeout_s": 0.3}))  # fmt: skip
    try:
        body = ("before = env.tools.pid()\nfor i in range(2):\n    try:\n"
                "        env.tools.sleep(600)\n    except Exception as e:\n        err = str(e)\n"
                "return repr((before, env.tools.pid(), err))")  # fmt: skip
        before, after, err = eval(run(r, body).answer)  # noqa: S307
        assert err == "sleep: timed out after 0.3 s"
        assert after != before and wait_gone(before)
    finally:
        r.close()


def test_cancel_ends_a_run_waiting_on_a_tool():
    r = Runtime(budget=Budget(run_timeout_s=60),
                tools=tools(sleep={"function": f"{FNS}:sleep", "timeout_s": 60}))  # fmt: skip
    try:
        r.tool_specs()
        threading.Timer(1.0, r.cancel).start()
        t0 = time.monotonic()
        t = run(r, "env.tools.sleep(50)\nreturn 'x'")
        assert t.status == "killed" and time.monotonic() - t0 < 5
    finally:
        r.close()


# --- config -----------------------------------------------------------------------------------


def test_config_takes_a_string_or_a_table():
    cfg = cfgmod.build(RuntimeConfig, {"tools": {
        "lookup": f"{FNS}:lookup",
        "sql": {"function": f"{FNS}:add", "calls": 3, "timeout_s": 2},
        "mcp": {"files": {"command": ["/bin/srv", "-x"], "env": {"A": "b"}}}}})  # fmt: skip
    t = parse_tools(cfg.tools)
    assert [(u.name, u.function, u.calls, u.timeout_s) for u in t.user] == [
        ("lookup", f"{FNS}:lookup", 12, 30.0), ("sql", f"{FNS}:add", 3, 2.0)]  # fmt: skip
    assert [(s.name, s.command, s.env) for s in t.mcp] == [("files", ("/bin/srv", "-x"),
                                                            (("A", "b"),))]  # fmt: skip


@pytest.mark.parametrize(("tools_table", "field"), [
    ({"python": "m:f"}, "tools.python"),
    ({"retrieve": "m:f"}, "tools.retrieve"),
    ({"_x": "m:f"}, "tools._x"),
    ({"class": "m:f"}, "tools.class"),
    ({"a-b": "m:f"}, "tools.a-b"),
    ({"x": "no_colon"}, "tools.x"),
    ({"x": "m:f()"}, "tools.x"),
    ({"x": {"function": "m:f", "calls": -1}}, "tools.x.calls"),
    ({"x": {"function": "m:f", "calls": 1.5}}, "tools.x.calls"),
    ({"x": {"function": "m:f", "timeout_s": 0}}, "tools.x.timeout_s"),
    ({"x": {"function": "m:f", "timeout": 3}}, "tools.x.timeout"),
    ({"x": 3}, "tools.x"),
    ({"mcp": {"s": {"command": []}}}, "tools.mcp.s.command"),
    ({"mcp": {"s": {"command": "srv"}}}, "tools.mcp.s.command"),
    ({"mcp": {"s": {"command": ["srv"], "env": {"A": 1}}}}, "tools.mcp.s.env"),
    ({"mcp": {"s": {"command": ["srv"], "cwd": "/"}}}, "tools.mcp.s.cwd"),
    ({"mcp": {"python": {"command": ["srv"]}}}, "tools.mcp.python"),
    ({"mcp": ["srv"]}, "tools.mcp"),
    ({"s": "m:f", "mcp": {"s": {"command": ["srv"]}}}, "tools.mcp.s"),
])  # fmt: skip
def test_a_bad_tools_config_is_a_config_error_naming_the_field(tools_table, field):
    with pytest.raises(ConfigError) as e:
        cfgmod.build(RuntimeConfig, {"tools": tools_table})
    assert e.value.field == field


def test_a_tool_that_does_not_import_fails_make_runtime_naming_it():
    cfg = cfgmod.build(RuntimeConfig, {"tools": {"x": "no_such_module_here:f"}})
    with pytest.raises(ConfigError, match="ModuleNotFoundError") as e:
        make_runtime(cfg, None)
    assert e.value.field == "runtime.tools.x"


@pytest.mark.parametrize("target", ["NOT_CALLABLE", "no_such_function"])
def test_a_tool_that_is_not_a_callable_fails_make_runtime(target):
    cfg = cfgmod.build(RuntimeConfig, {"tools": {"y": f"{FNS}:{target}"}})
    with pytest.raises(ConfigError) as e:
        make_runtime(cfg, None)
    assert e.value.field == "runtime.tools.y"


def test_make_runtime_hands_the_tools_to_the_runtime():
    cfg = cfgmod.build(RuntimeConfig, {"tools": {"add": f"{FNS}:add"}})
    r = make_runtime(cfg, None)
    try:
        assert [s.name for s in r.tool_specs()] == ["add"]
        assert run(r, "return str(env.tools.add(1))").answer == "1.5"
    finally:
        r.close()


def test_tools_with_the_ray_executor_are_refused():
    with pytest.raises(ConfigError) as e:
        cfgmod.build(RuntimeConfig, {"tools": {"add": f"{FNS}:add"},
                                     "executor": {"kind": "ray"}})  # fmt: skip
    assert e.value.field == "tools"


def test_a_ray_executor_refuses_a_runtime_with_tools():
    pytest.importorskip("ray")
    from whale.harness.ray_executor import RuntimeSpec
    from whale.harness.runtime import ExecutorUnavailable

    with pytest.raises(ExecutorUnavailable, match="user tools"):
        RuntimeSpec.of(Runtime(tools=tools(add="add")), 1)


def test_a_config_file_names_tools_by_module_not_by_function_object():
    from tests.harness import tool_fns

    with pytest.raises(ConfigError):
        cfgmod.build(RuntimeConfig, {"tools": {"add": tool_fns.add}})


def test_tools_round_trip_through_the_saved_config(tmp_path):
    cfg = cfgmod.build(RuntimeConfig, {"tools": {
        "sql": {"function": f"{FNS}:add", "calls": 3},
        "mcp": {"files": {"command": ["/bin/srv"], "env": {"A": "b"}}}}})  # fmt: skip
    cfgmod.save(cfg, tmp_path / "c.toml")
    assert cfgmod.load(RuntimeConfig, tmp_path / "c.toml") == cfg


def test_tools_enter_the_outcome_fingerprint():
    from whale.models import ModelConfig
    from whale.runs import outcome_fingerprint
    from whale.tasks import TaskConfig

    def fp(table: dict) -> str:
        return outcome_fingerprint(TaskConfig(id="rg:gcd"), ModelConfig(),
                                   cfgmod.build(RuntimeConfig, {"tools": table}))  # fmt: skip

    prints = {fp({}), fp({"a": f"{FNS}:add"}), fp({"a": {"function": f"{FNS}:add", "calls": 3}}),
              fp({"b": f"{FNS}:add"})}  # fmt: skip
    assert len(prints) == 4


def test_tools_cannot_change_on_resume(tmp_path):
    from whale.revise.run import AdaptConfig
    from whale.runs import ResumeMismatch, refuse_changes

    saved = cfgmod.build(AdaptConfig, {"runtime": {"tools": {"a": f"{FNS}:add"}}})
    for tree, name in [({"a": f"{FNS}:lookup"}, "runtime.tools.a"),
                       ({"a": {"function": f"{FNS}:add", "calls": 2}}, "runtime.tools.a")]:  # fmt: skip
        requested = cfgmod.build(AdaptConfig, {"runtime": {"tools": tree}})
        with pytest.raises(ResumeMismatch) as e:
            refuse_changes(saved, requested, tmp_path)
        assert e.value.field.startswith(name)


# --- what proposers are told --------------------------------------------------------------------


def test_a_long_signature_is_capped_in_the_description():
    """An MCP server writes its own schemas: a signature of any length would reach x_t."""
    from whale.harness.tools.spec import DOC_CHARS, ToolSpec

    sig = "(" + ", ".join(f"p{i}: str" for i in range(2000)) + ")"
    line = ToolSpec("m.t", (), sig, "Does a thing.").describe()
    assert len(line) < DOC_CHARS + 200 and "...)`: Does a thing." in line


def test_the_api_section_describes_each_tool_from_its_signature_and_docstring(rt):
    from whale.revise.proposer import api_section

    specs = {s.name: s for s in rt.tool_specs()}
    text = api_section(("python", specs["lookup"], specs["twice"]), Budget())
    assert ("- `env.tools.lookup(customer: str, limit: int = 3) -> dict`: Look up a customer's "
            "orders. At most 12 calls per question, 30 s each;") in text  # fmt: skip
    assert "At most 2 calls per question" in text
    assert "not shown to proposers" not in text
    assert "`.tools` (a dict: calls left of each tool above, by its name)" in text


def test_task_tools_lists_the_runtime_s_tools(rt):
    from whale.revise.proposer import task_tools

    class _Task:
        retriever = None

    listed = task_tools(_Task(), rt)
    assert listed[0] == "python" and [s.name for s in listed[1:]] == [
        s.name for s in rt.tool_specs()]  # fmt: skip


def test_the_search_agent_s_task_tool_lists_the_tools(rt):
    from whale.metaharness.agent import ProposerAgent

    agent = ProposerAgent(None, None, user_tools=rt.tool_specs())  # type: ignore[arg-type]
    text = agent.task_text("THE TASK")
    assert text.startswith("THE TASK\n\n")
    assert "- `env.tools.lookup(customer: str, limit: int = 3) -> dict`: Look up" in text
    assert ProposerAgent(None, None).task_text("THE TASK") == "THE TASK"  # type: ignore[arg-type]


def test_the_report_shows_what_a_failed_tool_call_told_the_harness(rt):
    from whale.revise.report import _trace

    t = run(rt, "try:\n    env.tools.fail('x')\nexcept Exception:\n    pass\nreturn 'x'")
    assert any("<error: ValueError: no such thing: x>" in line for line in _trace(t, 2000))
