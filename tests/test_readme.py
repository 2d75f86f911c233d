"""The README's example harness is real: it runs under the runtime as shown."""

import re
from pathlib import Path

from tests.fakes import ScriptedModel
from whale.harness import Runtime


def readme_harness():
    text = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text()
    section = text[text.index("## The harness contract") :]
    return re.search(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE).group(1)


def test_readme_example_harness_runs_the_code_the_model_writes():
    src = readme_harness()
    assert len(src.strip().splitlines()) <= 12
    model = ScriptedModel(["```python\nprint(6 * 7)\n```"])
    t = Runtime(model=model).run(src, "What is 6 * 7?")
    assert t.status == "ok" and t.answer == "42" and t.tool_calls()[0].name == "python"
