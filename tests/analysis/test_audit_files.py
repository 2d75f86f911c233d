"""The audit classifies a harness of several files as one program: its walk follows a call
through a module's name into the file that defines the function."""

from __future__ import annotations

from tests.bundles import FILES
from whale.analysis.audit import classify
from whale.harness.bundle import render


def test_a_model_call_in_another_file_is_followed():
    files = {
        "harness.py": "import solver\n\ndef run(question, env):\n    return solver.ask(env, question)\n",
        "solver.py": "def ask(env, question):\n    return env.llm(question).text\n",
    }
    audit = classify(render(files))
    assert audit.cls == "single_call", audit.evidence
    line = render(files).split("\n").index("    return env.llm(question).text") + 1
    assert f"line {line}: model call" in audit.evidence


def test_a_loop_across_files_is_an_interpreter_loop():
    files = {
        "harness.py": (
            "import steps\n\ndef run(question, env):\n    out = ''\n    for _ in range(3):\n"
            "        code = steps.write(env, question + out)\n"
            "        out = steps.execute(env, code)\n    return out\n"
        ),
        "steps.py": (
            "def write(env, prompt):\n    return env.llm(prompt).text\n\n"
            "def execute(env, code):\n    return env.tools.python(code).stdout\n"
        ),
    }
    assert classify(render(files)).cls == "interpreter_loop"


def test_the_shared_fixture_is_a_single_call():
    assert classify(render(FILES)).cls == "single_call"
