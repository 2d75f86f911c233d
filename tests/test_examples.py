"""examples/ and the README's Python example against the public API."""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import whale
from tests.conftest import require_model

ROOT = Path(__file__).resolve().parents[1]


def whale_calls(source: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "whale"]  # fmt: skip


def test_the_readme_python_example_calls_the_api_as_it_is():
    """Every `whale.X(...)` of the README's Python block is a public name whose signature
    takes the arguments the example gives (a renamed keyword fails here)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- python-example.*?-->\n```python\n(.*?)```", text, re.S)
    assert block is not None
    calls = whale_calls(block.group(1))
    assert {c.func.attr for c in calls} >= {"evaluate", "adapt", "search"}  # type: ignore[attr-defined]
    for call in calls:
        name = call.func.attr  # type: ignore[attr-defined]
        assert name in whale.__all__, name
        inspect.signature(getattr(whale, name)).bind(
            *[None] * len(call.args), **{k.arg: None for k in call.keywords if k.arg})


def test_the_example_script_calls_the_api_as_it_is():
    tree = ast.parse((ROOT / "examples" / "python_api.py").read_text())
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == "whale"}  # fmt: skip
    assert {"evaluate", "adapt", "search"} <= names <= set(whale.__all__)


@pytest.mark.model
@pytest.mark.slow
def test_the_python_example_runs_on_the_embedded_model_and_resumes(tmp_path):
    """examples/python_api.py on a small budget: evaluate, adapt and search on the embedded
    135M model, then a resume from Python that pays nothing; run twice, the second start
    resumes every run."""
    require_model("smollm2-135m")
    env = {**os.environ, "WHALE_EXAMPLE_SMALL": "1", "WHALE_EXAMPLE_OUT": str(tmp_path),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    for _ in range(2):
        r = subprocess.run([sys.executable, str(ROOT / "examples" / "python_api.py")], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=1500)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        assert re.search(r"^seed: \d+/3 ", r.stdout, re.M), r.stdout
        assert re.search(r"^adapt: \d+/3 .* -> \d+/3 ", r.stdout, re.M), r.stdout
        assert re.search(r"^search: \d+/3 .* -> \d+/3 ", r.stdout, re.M), r.stdout
        assert "resumed adapt paid 0 rollouts" in r.stdout
    assert (tmp_path / "py-adapt" / "summary.json").exists()
    assert (tmp_path / "py-search" / "archive").is_dir()
