"""Budgets are enforced by the broker, and every refusal is recorded."""

import dataclasses

from tests.fakes import ScriptedModel
from whale.harness import Budget, Runtime

CALL_N_TIMES = (
    "def run(q, env):\n"
    "    n = int(q)\n"
    "    for i in range(n):\n"
    "        env.llm([{'role': 'user', 'content': f'call {i}'}])\n"
    "    return 'done'\n"
)


def test_twelve_model_calls_are_allowed():
    t = Runtime(model=ScriptedModel()).run(CALL_N_TIMES, "12")
    assert t.status == "ok" and len(t.model_calls()) == 12


def test_thirteenth_model_call_is_refused_and_recorded():
    model = ScriptedModel()
    t = Runtime(model=model).run(CALL_N_TIMES, "13")
    assert t.status == "budget_exceeded"
    assert len(model.calls) == 12
    refused = [e for e in t.events if e["kind"] == "refused"]
    assert (
        refused and refused[0]["op"] == "llm" and "model_calls limit of 12" in refused[0]["reason"]
    )


def test_catching_budget_exceeded_still_marks_the_run():
    src = (
        "def run(q, env):\n"
        "    try:\n"
        "        for i in range(20):\n"
        "            env.llm('hi')\n"
        "    except BaseException:\n"
        "        pass\n"
        "    return 'sneaky'\n"
    )
    t = Runtime(model=ScriptedModel(), budget=Budget(model_calls=2)).run(src, "x")
    assert t.status == "budget_exceeded"


def test_tool_call_budget():
    src = "def run(q, env):\n    for i in range(4):\n        env.tools.python('print(1)')\n    return 'x'\n"
    t = Runtime(model=None, budget=Budget(tool_calls=3)).run(src, "x")
    assert t.status == "budget_exceeded" and len(t.tool_calls()) == 3


class _Docs:
    def retrieve(self, query, k):
        return [{"id": f"p{i}", "title": "t", "text": query, "score": 1.0} for i in range(k)]


def test_retrieval_budget():
    src = "def run(q, env):\n    for i in range(13):\n        env.tools.retrieve(f'q{i}', 2)\n    return 'x'\n"
    t = Runtime(model=None).run(src, "x", retriever=_Docs())
    assert t.status == "budget_exceeded" and len(t.tool_calls()) == 12


def test_empty_query_costs_no_retrieval_budget():
    src = (
        "def run(q, env):\n"
        "    for i in range(20):\n"
        "        assert env.tools.retrieve('  ', 3) == []\n"
        "    return str(env.budget.retrievals)\n"
    )
    t = Runtime(model=None).run(src, "x", retriever=_Docs())
    assert t.status == "ok" and t.answer == "12"


def test_budget_left_is_visible_to_the_harness():
    src = "def run(q, env):\n    env.llm('a')\n    env.llm('b')\n    return str(env.budget.model_calls)\n"
    t = Runtime(model=ScriptedModel(), budget=Budget(model_calls=5)).run(src, "x")
    assert t.answer == "3"


def test_max_tokens_past_the_per_call_limit_is_refused_not_sent():
    # Issue 20: out of range is an error the harness is told, not a value quietly clamped.
    model = ScriptedModel()
    src = "def run(q, env):\n    env.llm('a', max_tokens=100000)\n    return 'x'\n"
    t = Runtime(model=model, budget=Budget(max_tokens_per_call=64)).run(src, "x")
    assert t.status == "error" and "from 1 to 64" in t.error and model.calls == []


def test_max_tokens_defaults_to_the_per_call_limit():
    model = ScriptedModel()
    src = "def run(q, env):\n    env.llm('a')\n    return 'x'\n"
    Runtime(model=model, budget=Budget(max_tokens_per_call=64)).run(src, "x")
    assert model.calls[0][1].max_tokens == 64


def test_total_token_budget_is_enforced():
    model = ScriptedModel(["one two three four five"])  # 5 completion tokens per call
    t = Runtime(model=model, budget=Budget(max_total_tokens=12)).run(CALL_N_TIMES, "5")
    assert t.status == "budget_exceeded" and len(model.calls) == 3


class _NoUsage(ScriptedModel):
    """A backend that reports no usage (some OpenAI-compatible servers and proxies)."""

    def chat(self, messages, sampling, timeout=None):  # type: ignore[no-untyped-def]
        return dataclasses.replace(super().chat(messages, sampling, timeout), usage={})


def test_total_token_budget_holds_against_a_backend_that_reports_no_usage():
    # Each call is charged its cap (max_tokens 5): the third call would pass 12, so it is
    # sent with the 2 tokens left, and the fourth is refused.
    model = _NoUsage(["one"])
    src = CALL_N_TIMES.replace("}])", "}], max_tokens=5)")
    t = Runtime(model=model, budget=Budget(max_total_tokens=12)).run(src, "9")
    assert t.status == "budget_exceeded" and len(model.calls) == 3
    assert [s.max_tokens for _, s in model.calls] == [5, 5, 2]


class _TimeoutSpy(ScriptedModel):
    """Records the timeout the broker hands each call (the fake gives up at it)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s=delay_s)
        self.timeouts: list[float | None] = []

    def chat(self, messages, sampling, timeout=None):  # type: ignore[no-untyped-def]
        self.timeouts.append(timeout)
        return super().chat(messages, sampling, timeout)


def test_slow_model_call_times_out_and_the_harness_sees_an_error():
    model = _TimeoutSpy(delay_s=3.0)
    src = (
        "def run(q, env):\n"
        "    try:\n"
        "        env.llm('a')\n"
        "    except Exception as e:\n"
        "        return str(e)\n"
    )
    t = Runtime(model=model, budget=Budget(model_call_timeout_s=0.5)).run(src, "x")
    assert t.status == "ok" and "timed out" in t.answer
    assert t.model_calls()[0].error is not None
    # given up on at the budget's per-call timeout, not waited for (the reply takes 3 s): a
    # property of what the broker asks, not a wall-clock bound on this CPU
    assert len(model.timeouts) == 1 and model.timeouts[0] is not None
    assert model.timeouts[0] <= 0.5


def test_run_timeout_interrupts_a_model_call():
    model = _TimeoutSpy(delay_s=5.0)
    src = "def run(q, env):\n    env.llm('a')\n    return 'x'\n"
    t = Runtime(model=model, budget=Budget(run_timeout_s=1.0)).run(src, "x")
    assert t.status == "timeout"
    # cut by the run's deadline: the call may wait at most what is left of the 1 s run
    assert len(model.timeouts) == 1 and model.timeouts[0] is not None
    assert model.timeouts[0] <= 1.0


def test_run_without_model_backend_reports_the_missing_backend():
    src = "def run(q, env):\n    env.llm('a')\n    return 'x'\n"
    t = Runtime(model=None).run(src, "x")
    assert t.status == "error" and "no model backend" in t.error
