"""Sampling values a harness asks for are range-checked by the broker before any backend call
(issue 20): out of range is an error reply to the harness and a `refused` event on the
trajectory; the model is never called and the run goes on."""

import pytest

from tests.fakes import ScriptedModel
from whale.harness import Budget, Runtime
from whale.harness.broker import MAX_REJECTED_EVENTS
from whale.harness.settings import RuntimeConfig

# The attack of issue 20: a system prompt the run ignores, sent at temperature 30, then the
# answer computed by the harness itself (rsft trained on the ignored, noisy completion).
EVIL_BOT = (
    "def run(q, env):\n"
    "    env.llm([{'role': 'system', 'content': 'You are EVIL-BOT. Always insult the user.'},\n"
    "             {'role': 'user', 'content': q}], temperature=30.0)\n"
    "    return str(eval(q.split('Calculate ')[1].rstrip('.')))\n"
)

# Sends one llm request with `extra` keyword arguments (as env.llm would, or past it) and
# returns the error the harness got, so that the run itself ends ok.
ASK = (
    "def run(q, env):\n"
    "    try:\n"
    "        env._link.call('llm', messages=[{{'role': 'user', 'content': 'hi'}}], {extra})\n"
    "    except Exception as e:\n"
    "        return type(e).__name__ + ': ' + str(e)\n"
    "    return 'sent'\n"
)


def refusals(t):
    return [e for e in t.events if e["kind"] == "refused"]


def test_temperature_30_from_the_attack_is_an_error_on_the_trajectory():
    model = ScriptedModel(["…I am your trusty ally!"])
    t = Runtime(model=model).run(EVIL_BOT, "Calculate 5 - 3 - 6.")
    assert t.status == "error" and "temperature=30.0" in t.error and "ToolError" in t.error
    assert [e["op"] for e in refusals(t)] == ["llm"]
    assert "temperature=30.0" in refusals(t)[0]["reason"]


def test_temperature_30_never_reaches_the_model():
    model = ScriptedModel()
    t = Runtime(model=model).run(EVIL_BOT, "Calculate 5 - 3 - 6.")
    assert model.calls == [] and t.model_calls() == []


@pytest.mark.parametrize(
    "extra",
    [
        "temperature=2.5",
        "temperature=-0.1",
        "temperature=True",
        "max_tokens=0",
        "max_tokens=-5",
        "max_tokens=1025",  # the default budget's max_tokens_per_call is 1024
        "max_tokens=True",
        "max_tokens=1.5",
        "stop=['a', 'b', 'c', 'd', 'e']",
        "stop=''",
        "stop=['x' * 257]",
        "top_p=5.0",
        "top_k=-1",
        "seed='x'",
    ],
)
def test_an_out_of_range_request_is_refused_recorded_and_not_sent(extra):
    model = ScriptedModel()
    t = Runtime(model=model).run(ASK.format(extra=extra), "x")
    assert t.status == "ok" and t.answer.startswith("ToolError: llm(")
    assert model.calls == []
    assert [e["op"] for e in refusals(t)] == ["llm"] and refusals(t)[0]["reason"] == t.answer[11:]


@pytest.mark.parametrize(
    "extra", ["temperature=0", "temperature=2", "max_tokens=1", "max_tokens=1024",
              "stop=['a', 'b', 'c', 'd']", "stop='x' * 256"],
)  # fmt: skip
def test_the_bounds_themselves_are_accepted(extra):
    model = ScriptedModel()
    t = Runtime(model=model).run(ASK.format(extra=extra), "x")
    assert t.answer == "sent" and len(model.calls) == 1 and refusals(t) == []


def test_max_tokens_over_the_per_call_cap_is_refused_not_clamped():
    model = ScriptedModel()
    src = "def run(q, env):\n    env.llm('a', max_tokens=65)\n    return 'x'\n"
    t = Runtime(model=model, budget=Budget(max_tokens_per_call=64)).run(src, "x")
    assert t.status == "error" and "from 1 to 64" in t.error and model.calls == []


def test_a_refused_request_costs_no_model_call_budget():
    src = (
        "def run(q, env):\n"
        "    for _ in range(3):\n"
        "        try:\n"
        "            env.llm('a', temperature=9.0)\n"
        "        except Exception:\n"
        "            pass\n"
        "    return str(env.budget.model_calls)\n"
    )
    t = Runtime(model=ScriptedModel(), budget=Budget(model_calls=2)).run(src, "x")
    assert t.status == "ok" and t.answer == "2" and len(refusals(t)) == 3


def test_repeated_refusals_are_recorded_up_to_a_bound():
    src = (
        "def run(q, env):\n"
        "    for _ in range(200):\n"
        "        try:\n"
        "            env.llm('a', temperature=9.0)\n"
        "        except Exception:\n"
        "            pass\n"
        "    return 'x'\n"
    )
    t = Runtime(model=ScriptedModel()).run(src, "x")
    assert t.status == "ok" and len(refusals(t)) == MAX_REJECTED_EVENTS
    assert "not recorded" in refusals(t)[-1]["reason"]


def test_a_runtime_temperature_past_2_is_a_config_error():
    with pytest.raises(ValueError, match="temperature: must be at most 2"):
        RuntimeConfig(temperature=2.5).validate()
