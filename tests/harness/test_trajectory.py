"""The trajectory holds everything one run did, and round-trips through JSON."""

import json

import pytest

from tests.fakes import ScriptedModel
from whale.harness import TRAJECTORY_VERSION, Runtime, Trajectory, load_harness

SRC = (
    "import sys\n"
    "def run(q, env):\n"
    "    r = env.llm([{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': q}],"
    " temperature=0.5, stop=['###'])\n"
    "    out = env.tools.python('print(2 + 2)')\n"
    "    print('to stdout')\n"
    "    print('to stderr', file=sys.stderr)\n"
    "    return r.text + '|' + out.stdout.strip() + '|' + r.finish_reason\n"
)


@pytest.fixture
def traj():
    return Runtime(model=ScriptedModel(["hello there"])).run(SRC, "what?", "q7")


def test_records_the_model_call(traj):
    (call,) = traj.model_calls()
    assert call.messages[1] == {"role": "user", "content": "what?"}
    assert call.text == "hello there" and call.finish_reason == "stop"
    assert call.usage["total_tokens"] == 7 and call.latency_s >= 0
    assert call.params["temperature"] == 0.5 and call.params["stop"] == ["###"]


def test_records_the_tool_call(traj):
    (tool,) = traj.tool_calls()
    assert tool.name == "python" and tool.args["code"] == "print(2 + 2)"
    assert tool.result["stdout"] == "4\n"


def test_records_answer_status_output_and_timing(traj):
    assert traj.status == "ok" and traj.answer == "hello there|4|stop"
    assert traj.question_id == "q7" and len(traj.harness_hash) == 16
    assert "to stdout" in traj.stdout_tail and "to stderr" in traj.stderr_tail
    assert traj.wall_s > 0 and traj.started_at > 0 and traj.version == TRAJECTORY_VERSION


def test_round_trips_through_json(traj):
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again == traj


def test_other_versions_are_refused(traj):
    d = traj.to_dict()
    d["version"] = 99
    with pytest.raises(ValueError, match="version 99"):
        Trajectory.from_dict(d)


def test_seed_single_call_reads_the_answer_line():
    t = Runtime(model=ScriptedModel(["Let me think.\nAnswer: 17"])).run(
        load_harness("single_call"), "1+16?"
    )
    assert t.status == "ok" and t.answer == "17"


def test_seed_interpreter_loop_runs_code_and_feeds_it_back():
    model = ScriptedModel(["```python\nprint(6*7)\n```", "Answer: 42"])
    t = Runtime(model=model).run(load_harness("interpreter_loop"), "6*7?")
    assert t.status == "ok" and t.answer == "42"
    assert "Output:\n42" in model.calls[1][0][-1]["content"]
