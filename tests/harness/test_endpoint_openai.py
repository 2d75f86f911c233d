"""The `openai` client itself inside the real jail (issue 24), allowed through
`runtime.packages`: plain, streaming and tool-calling requests to the run's endpoint, the
client's own exception for a spent budget, and the trajectory the broker records. The package
set is built with pip from wheels of the openai release installed in whale's own environment
(tests/harness/wheels.py), with no index."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
from packaging.requirements import Requirement

from tests.fakes import ScriptedModel
from tests.harness.test_endpoint import TOOLS, CallingModel
from tests.harness.wheels import rewheel
from whale.harness import Budget, Limits, Runtime
from whale.harness.packages import PackageSet, build_folder
from whale.harness.sandbox import Sandbox


def closure(name: str) -> list[str]:
    """`name` and every distribution it requires here (extras left out), installed names."""
    seen: dict[str, None] = {}
    todo = [name]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = None
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen)


@pytest.fixture(scope="module")
def openai_set(tmp_path_factory) -> PackageSet:
    wheels = tmp_path_factory.mktemp("wheels")
    made = [str(rewheel(n, wheels)) for n in closure("openai")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_NO_INDEX", "1")
        folder = build_folder(made, tmp_path_factory.mktemp("cache"))
    return PackageSet(str(folder), ("openai",))


CLIENT = r"""
import json, openai

def run(question, env):
    client = openai.OpenAI()
    out = {}
    if question == "plain":
        r = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
        out["text"] = r.choices[0].message.content
        out["models"] = [m.id for m in client.models.list()]
    elif question == "stream":
        s = client.chat.completions.create(model="any", stream=True,
                                           messages=[{"role": "user", "content": "hi"}])
        out["text"] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    elif question == "tools":
        messages = [{"role": "user", "content": "6 times 7?"}]
        r = client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        args = json.loads(call.function.arguments)
        messages += [r.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] * args["b"])}]
        out["text"] = client.chat.completions.create(model="any", messages=messages,
                                                     tools=TOOLS).choices[0].message.content
    else:
        for _ in range(3):
            try:
                client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
            except openai.RateLimitError as e:
                out["error"] = type(e).__name__ + ": " + e.body.get("code", "")
    return json.dumps(out)
"""


def go(sandbox, packages, question, model, **budget):
    rt = Runtime(model=model, budget=Budget(run_timeout_s=60.0, **budget),
                 limits=Limits(cpu_s=60), sandbox=Sandbox(sandbox), packages=packages)  # fmt: skip
    source = f"TOOLS = {TOOLS!r}\n" + CLIENT
    t = rt.run(source, question)
    return t, json.loads(t.answer or "{}")


def test_the_openai_client_calls_the_solver(sandbox, openai_set):
    t, out = go(sandbox, openai_set, "plain", ScriptedModel(["hello there"]))
    assert t.status == "ok", (t.error, t.stderr_tail)
    assert out == {"text": "hello there", "models": ["scripted"]}
    assert [e["text"] for e in t.events if e["kind"] == "model"] == ["hello there"]


def test_the_openai_client_streams(sandbox, openai_set):
    t, out = go(sandbox, openai_set, "stream", ScriptedModel(["streamed reply"]))
    assert t.status == "ok", (t.error, t.stderr_tail)
    assert out["text"] == "streamed reply"


def test_the_openai_client_calls_tools_and_sends_their_results_back(sandbox, openai_set):
    t, out = go(sandbox, openai_set, "tools", CallingModel())
    assert t.status == "ok", (t.error, t.stderr_tail)
    assert out["text"] == "It is 42."
    first, second = [e for e in t.events if e["kind"] == "model"]
    assert first["tool_calls"][0]["name"] == "multiply"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "42"}


def test_past_the_budget_the_client_raises_its_rate_limit_error_once(sandbox, openai_set):
    model = ScriptedModel(["one"])
    t, out = go(sandbox, openai_set, "budget", model, model_calls=1)
    assert out["error"] == "RateLimitError: insufficient_quota"
    assert t.status == "budget_exceeded"
    assert len(model.calls) == 1
    # two refusals, one per request past the budget: the client did not retry either
    assert len([e for e in t.events if e["kind"] == "refused"]) == 2
