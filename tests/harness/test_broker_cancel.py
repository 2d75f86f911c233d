"""Runtime.cancel() (for Ctrl-C): in-flight runs end promptly as killed, later runs at once."""

import threading
import time

from tests.fakes import ScriptedModel
from whale.harness import Budget, PythonToolLimits, Runtime
from whale.harness.sandbox import Sandbox

SLEEP_60 = "import time\ndef run(q, env):\n    time.sleep(60)\n    return 'x'\n"


def run_in_thread(rt, src):
    box = {}
    th = threading.Thread(target=lambda: box.update(t=rt.run(src, "x")), daemon=True)
    th.start()
    return th, box


def cancel_and_wait(rt, th):
    t0 = time.monotonic()
    rt.cancel()
    th.join(30)  # a guard against a hang; the harnesses below would run for 60 s
    assert not th.is_alive()
    return time.monotonic() - t0


def test_cancel_ends_a_sleeping_run_well_before_it_would_end(sandbox):
    rt = Runtime(model=None, sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=120))
    th, box = run_in_thread(rt, SLEEP_60)
    time.sleep(1.0)  # the worker is up and the harness asleep
    cancel_and_wait(rt, th)
    assert box["t"].status == "killed" and box["t"].error == "cancelled"


def test_cancel_ends_a_run_inside_the_python_tool(sandbox):
    src = "def run(q, env):\n    env.tools.python('import time; time.sleep(60)')\n    return 'x'\n"
    rt = Runtime(
        model=None,
        sandbox=Sandbox(sandbox),
        budget=Budget(run_timeout_s=120),
        python_limits=PythonToolLimits(timeout_s=60),
    )
    th, box = run_in_thread(rt, src)
    time.sleep(1.5)
    cancel_and_wait(rt, th)
    assert box["t"].status == "killed" and box["t"].error == "cancelled"


def test_cancel_ends_a_run_after_its_model_call_returns(sandbox):
    src = "def run(q, env):\n    env.llm('hi')\n    env.llm('again')\n    return 'x'\n"
    model = ScriptedModel(delay_s=1.0)
    rt = Runtime(model=model, sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=120))
    th, box = run_in_thread(rt, src)
    time.sleep(0.7)  # inside the first model call
    cancel_and_wait(rt, th)
    assert box["t"].status == "killed" and len(model.calls) == 1  # the second call never made


def test_runs_after_cancel_return_at_once_without_a_worker(sandbox):
    rt = Runtime(model=None, sandbox=Sandbox(sandbox))
    rt.cancel()

    def no_worker():
        raise AssertionError("a worker was started after cancel()")

    rt._take_worker = no_worker
    t = rt.run("def run(q, env):\n    return 'x'\n", "x")  # no_worker: none was started
    assert t.status == "killed" and t.error == "cancelled"
