"""Ctrl-C and SIGTERM stop a run (issue 8: 180 s after SIGINT every queued rollout was still
running with the 0.5B, and none of them was recorded).

The `whale eval` tests run the real CLI as a subprocess on the real embedded model and send
it real signals; the others check each piece (evaluate(), the backends, the handlers) alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import require_model
from tests.servers import StubServer
from whale.models import ModelError, OpenAICompatible, Sampling

WHALE = str(Path(sys.executable).parent / "whale")


def proc_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def descendants(root: int) -> dict[int, tuple[int, bytes]]:
    """Every live process below `root` (servers, jails, workers): start time, command line."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    out: dict[int, tuple[int, bytes]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        started = proc_start(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if started is not None:
            out[pid] = (started, cmd)
        todo += children.get(pid, [])
    return out


def left_alive(procs: dict[int, tuple[int, bytes]], within_s: float = 2.0) -> list[bytes]:
    deadline = time.monotonic() + within_s
    while True:
        alive = [c for p, (s, c) in procs.items() if proc_start(p) == s]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line.strip()]


def start_eval(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """`whale eval` of 40 questions on the 0.5B, 2 workers: minutes of work."""
    require_model("qwen-coder-0.5b")
    run = tmp_path / "run"
    p = subprocess.Popen(
        [WHALE, "eval", "--task", "rg:basic_arithmetic", "-n", "40", "--workers", "2",
         "--model", "qwen-coder-0.5b", "--no-cache", "--out", str(run), "--json"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "WHALE_THREADS": "1"}, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 480
    while not records(run / "outcomes.jsonl"):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            out, err = p.communicate()
            pytest.fail(f"no outcome recorded (exit {p.returncode}):\n{err[-3000:]}")
        time.sleep(0.2)
    return p, run


def stop(
    p: subprocess.Popen[str], sig: int
) -> tuple[int | None, float, str, dict[int, tuple[int, bytes]]]:
    procs = descendants(p.pid)
    t0 = time.monotonic()
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        for pid in procs:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
        return None, time.monotonic() - t0, err, procs
    return p.returncode, time.monotonic() - t0, err, procs


@pytest.mark.model
@pytest.mark.slow
def test_ctrl_c_of_eval_keeps_finished_rollouts_kills_the_rest_and_exits_130(tmp_path):
    p, run = start_eval(tmp_path)
    rc, took, err, procs = stop(p, signal.SIGINT)
    assert rc == 130, f"exit {rc} after {took:.1f} s:\n{err[-2000:]}"
    assert took < 30  # a guard: stopped, not the 40 rollouts finished (minutes)
    outcomes = records(run / "outcomes.jsonl")
    assert 1 <= len(outcomes) < 40
    assert all(o["status"] == "ok" for o in outcomes), [o["error"] for o in outcomes]
    assert len(records(run / "trajectories.jsonl")) == len(outcomes)
    assert f"{len(outcomes)} of 40 rollouts recorded" in err
    assert any(
        b"llama_server" in cmd or b"llama-server" in cmd for _, cmd in procs.values()
    ), "no server in the snapshot"
    assert left_alive(procs) == [], "a server, jail or worker of the run outlived it"


@pytest.mark.model
@pytest.mark.slow
def test_sigterm_of_eval_kills_its_servers_and_exits_promptly(tmp_path):
    p, run = start_eval(tmp_path)
    rc, took, err, procs = stop(p, signal.SIGTERM)
    assert rc == 143, f"exit {rc} after {took:.1f} s:\n{err[-2000:]}"
    assert took < 30  # a guard: stopped, not the 40 rollouts finished (minutes)
    assert left_alive(procs) == []
    assert all(o["status"] == "ok" for o in records(run / "outcomes.jsonl"))


# --- evaluate() alone ---------------------------------------------------------------------

SLEEPER = "import time\n\ndef run(question, env):\n    time.sleep(60)\n    return '0'\n"


_CTRL_C_SCRIPT = textwrap.dedent("""
    import signal, threading, time
    from whale.evaluation import evaluate
    from whale.harness import Budget, Runtime
    from whale.tasks import load_task
    SLEEPER = %r
    task = load_task("rg:basic_arithmetic", size=8, seed=0)
    rt = Runtime(budget=Budget(run_timeout_s=120))
    done = []
    main = threading.main_thread().ident
    threading.Timer(1.5, signal.pthread_kill, (main, signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        evaluate(rt, SLEEPER, task, task.questions(), 2, on_done=lambda o, t: done.append(1))
        print("RETURNED", time.monotonic() - t0, flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", time.monotonic() - t0, len(done), rt.cancelled, flush=True)
""") % SLEEPER


def test_evaluate_on_ctrl_c_cancels_the_queue_and_returns_at_once():
    # In a fresh interpreter: in the full suite's process this test saw evaluate() return
    # instead of raising (state left by earlier tests, not yet found: see the closing note of
    # session 5); the property itself is about one process receiving one SIGINT.
    # A real SIGINT to the main thread (interrupt_main() would not wake a blocked wait), while
    # 2 runs are in flight and 6 are queued.
    r = subprocess.run([sys.executable, "-c", _CTRL_C_SCRIPT], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    words = r.stdout.split()
    assert words and words[0] == "INTERRUPTED", (r.stdout, r.stderr[-2000:])
    assert float(words[1]) < 30  # interrupted at 1.5 s; the runs would sleep 60 s
    assert words[2] == "0" and words[3] == "True"  # cancelled runs are not recorded as killed


# --- backends -----------------------------------------------------------------------------


def test_a_closed_openai_backend_stops_retrying_at_once():
    with StubServer([("status", 503, "busy")]) as s:
        m = OpenAICompatible("stub", s.base_url, retries=4, backoff_s=5.0)
        errors: list[Exception] = []

        def call() -> None:
            try:
                m.chat([{"role": "user", "content": "hi"}], Sampling())
            except ModelError as e:
                errors.append(e)

        t = threading.Thread(target=call)
        t.start()
        while not s.requests:
            time.sleep(0.01)
        time.sleep(0.1)  # now in its 2.5-5 s backoff
        t0 = time.monotonic()
        m.close()
        t.join(timeout=10)
        # under the shortest backoff (2.5 s): close() cut the sleep short
        assert time.monotonic() - t0 < 2.5 and len(s.requests) == 1
        assert errors and "closed" in str(errors[0])


# --- the handlers, in a real process ------------------------------------------------------

STUCK = textwrap.dedent("""
    import sys, time
    import whale.cli.interrupts as interrupts
    interrupts.GRACE_S = float(sys.argv[1])
    interrupts.install()
    try:
        print("ready", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("unwinding", flush=True)
        time.sleep(60)  # a cleanup that hangs
""")


def stuck(grace_s: float) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", STUCK, str(grace_s)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def test_second_ctrl_c_exits_130_at_once():
    p = stuck(grace_s=60)
    p.send_signal(signal.SIGINT)
    assert p.stdout is not None and p.stdout.readline() == "unwinding\n"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 130 and time.monotonic() - t0 < 20  # not after the 60 s grace
    assert "second interrupt" in err


def test_a_stuck_stop_exits_130_after_the_grace_period():
    p = stuck(grace_s=1)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 130 and 0.9 < time.monotonic() - t0 < 30  # the grace, then out
    assert "still stopping" in err


@pytest.mark.model
@pytest.mark.slow
def test_ctrl_c_of_adapt_says_how_to_resume_and_exits_130(tmp_path):
    require_model("smollm2-135m")
    run = tmp_path / "run"
    p = subprocess.Popen(
        [WHALE, "adapt", "--task", "rg:basic_arithmetic", "--solver", "smollm2-135m",
         "--proposer", "smollm2-135m", "--rounds", "2", "--g", "2", "--dev", "12", "--eval", "30",
         "--feedback", "4", "--workers", "2", "--out", str(run)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "WHALE_THREADS": "1"}, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 480
    while not records(run / "outcomes.jsonl"):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
        time.sleep(0.2)
    rc, took, err, procs = stop(p, signal.SIGINT)
    assert rc == 130 and took < 30, f"exit {rc} after {took:.1f} s:\n{err[-2000:]}"
    kept = records(run / "outcomes.jsonl")
    assert f"{len(kept)} rollouts recorded; `whale adapt --resume {run}` continues" in err
    assert all(o["status"] == "ok" for o in kept)
    assert left_alive(procs) == []


def test_the_cli_puts_the_signal_handlers_back_when_a_command_ends(tmp_path):
    from typer.testing import CliRunner

    from whale.cli import app

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StubServer([("ok", "Answer: 1")]) as s:
        r = CliRunner().invoke(app, [
            "eval", "--task", "rg:basic_arithmetic", "--model", f"stub@{s.base_url}", "-n", "2",
            "--out", str(tmp_path / "run"), "--no-cache", "--json",
        ], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
