"""examples/frameworks/: an agent on the `openai` client and one on the OpenAI Agents SDK,
unchanged but for `run`, run in the jail on the embedded model through the in-jail endpoint,
with their packages built by `runtime.packages` (pip from the package index, once per
machine: the same path a user's first command takes)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import whale
from tests.conftest import require_model

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "examples" / "frameworks"


@pytest.mark.parametrize("name", ["openai_client.py", "agents_sdk.py"])
def test_the_examples_touch_whale_only_in_their_run_entry_point(name):
    tree = ast.parse((HERE / name).read_text())
    imports = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names} | {n.module.split(".")[0] for n in ast.walk(tree)
                                    if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
    assert "whale" not in imports
    (run,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    uses_env = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "env"]
    # the agent reaches the solver through its own client, never through whale's `env`
    assert [a.arg for a in run.args.args] == ["question", "env"] and uses_env == []


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", ["openai_client.py", "agents_sdk.py"])
def test_the_framework_example_runs_on_the_embedded_model(name, tmp_path):
    require_model("qwen-coder-0.5b")
    run = whale.evaluate(model="qwen-coder-0.5b", n=2, out=tmp_path / "eval",
                         config=str(HERE / "whale.toml"),
                         overrides={"harness": str(HERE / name)})  # fmt: skip
    trajectories = [json.loads(line) for line in
                    (run.run_dir / "trajectories.jsonl").read_text().splitlines()]  # fmt: skip
    assert len(trajectories) == 2
    assert {t["status"] for t in trajectories} == {"ok"}, [t["error"] for t in trajectories]
    calls = [e for t in trajectories for e in t["events"] if e["kind"] == "model"]
    assert calls and all(e["error"] is None and e["usage"]["completion_tokens"] > 0 for e in calls)
    if name == "agents_sdk.py":  # the SDK offered the agent's own tool through the endpoint
        assert all(e["tools"][0]["function"]["name"] == "calculate" for e in calls)
