"""What one run may write into the records: the trajectory's text and the answer are capped."""

from whale.harness import Budget, Limits, Runtime, Sandbox
from whale.harness.trajectory import RECORD_CHARS


def test_a_trajectory_records_at_most_its_text_budget(model, sandbox):
    src = "def run(q, env):\n    for _ in range(12):\n        env.llm('x' * 3_000_000)\n    return 'ok'\n"
    t = Runtime(model=model, budget=Budget(run_timeout_s=60), sandbox=Sandbox(sandbox)).run(src, "q")
    assert t.status == "ok" and len(t.model_calls()) == 12
    recorded = sum(len(m["content"]) for c in t.model_calls() for m in c.messages)
    assert recorded <= RECORD_CHARS and t.clipped_chars > 30_000_000
    assert "chars not recorded" in t.model_calls()[-1].messages[0]["content"]


def test_an_answer_over_the_limit_is_an_error(sandbox):
    src = "def run(q, env):\n    return 'a' * 200_001\n"
    rt = Runtime(model=None, limits=Limits(answer_chars=200_000), sandbox=Sandbox(sandbox))
    t = rt.run(src, "q")
    assert t.status == "error" and "over limits.answer_chars" in t.error and t.answer is None


def test_a_harness_traceback_does_not_name_host_paths(runtime):
    # env.llm(5): the worker raises ToolError from its own frames, which appear in the trace
    t = runtime.run("def run(q, env):\n    env.llm(5)\n", "q")
    assert t.status == "error" and "/whale/worker.py" in t.error
    import whale

    host = str(__import__("pathlib").Path(whale.__file__).resolve().parent)
    assert host not in t.error and "site-packages" not in t.error
