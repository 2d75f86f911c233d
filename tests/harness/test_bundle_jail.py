"""A harness of several files in the real jail (nsjail and bubblewrap): its files import each
other from memory, tracebacks name the file, nothing is written, and every hostile bundle is
a recorded load failure."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.bundles import FILES, bundle, write
from whale.harness import Failure
from whale.harness.bundle import ENTRY, HEAD, TAIL, read_folder, render


def test_a_folder_harness_runs_with_imports_between_its_files(runtime, tmp_path):
    t = runtime.run(read_folder(write(tmp_path)), "what?")
    assert (t.status, t.answer, t.error) == ("ok", "ANSWER: 42!", None)
    assert len(t.model_calls()) == 1


def test_its_modules_come_from_memory_and_nothing_is_written(runtime):
    src = render({
        ENTRY: "import os, sys, util\n\ndef run(question, env):\n"
               "    return repr((util.__file__, sorted(os.listdir('/work')),\n"
               "                 sys.modules['harness'].__name__))\n",
        "util.py": "X = 1\n",
    })  # fmt: skip
    t = runtime.run(src, "x")
    assert t.status == "ok", t.error
    assert t.answer == repr(("util.py", [], "harness"))


def test_a_traceback_names_the_file_and_shows_its_line(runtime):
    src = render({**FILES, "util.py": "def clean(reply):\n    return reply + undefined_name\n"})
    t = runtime.run(src, "x")
    assert t.status == "error" and t.failure == Failure.HARNESS
    assert 'File "util.py", line 2, in clean' in t.error and "return reply + undefined" in t.error
    assert "NameError: name 'undefined_name' is not defined" in t.error


def test_an_import_error_at_load_names_the_file(runtime):
    src = render({**FILES, "util.py": "import no_such_module_here\n"})
    t = runtime.run(src, "x")
    assert t.status == "error" and t.failure == Failure.LOAD
    assert 'File "util.py", line 1' in t.error and "no_such_module_here" in t.error


def test_a_file_that_does_not_parse_is_a_load_failure_naming_it(runtime):
    t = runtime.run(render({**FILES, "helpers/marks.py": "BANG = (\n"}), "x")
    assert t.status == "error" and t.failure == Failure.LOAD
    assert t.error.startswith("load: harness does not parse: helpers/marks.py: SyntaxError")


def test_an_entry_without_run_is_a_load_failure(runtime):
    t = runtime.run(render({**FILES, ENTRY: "import util\n"}), "x")
    assert t.status == "error" and t.failure == Failure.LOAD
    assert "defines no callable run(question, env) (in harness.py)" in t.error


# --- hostile bundles: each a recorded load failure; nothing lands outside the scratch -------


def _refused(runtime, src: str, why: str) -> None:
    t = runtime.run(src, "x")
    assert (t.status, t.failure) == ("error", Failure.LOAD), t.error
    assert t.error.startswith("load: harness ") and why in t.error, t.error
    assert not t.model_calls()  # refused before any worker ran it


def test_thousands_of_files(runtime):
    many = {ENTRY: FILES[ENTRY], **{f"m{i}.py": "X = 1\n" for i in range(5000)}}
    _refused(runtime, bundle(many), "more than 64 files")


def test_a_huge_file(runtime):
    _refused(runtime, bundle({**FILES, "big.py": "X = 1\n" * 200_000}), "over the limit of")


def test_path_traversal_and_absolute_names(runtime, tmp_path):
    for name in ("../escape.py", f"/tmp/{tmp_path.name}-escape.py", "a/../../escape.py"):
        _refused(runtime, bundle({**FILES, name: "X = 1\n"}), "not a valid bundle of files")
    assert not Path(f"/tmp/{tmp_path.name}-escape.py").exists()


def test_a_header_forged_inside_a_file(runtime):
    marker = f"whale-forge-{uuid.uuid4().hex}"
    forged = f"X = 1\n{HEAD}../../../tmp/{marker}.py{TAIL}\nimport os\n"
    _refused(runtime, bundle({**FILES, "util.py": forged}), "a file name is a relative path")
    forged_entry = f"X = 1\n{HEAD}{ENTRY}{TAIL}\ndef run(q, env):\n    return 'forged'\n"
    _refused(runtime, bundle({**FILES, "util.py": forged_entry}), "a second file 'harness.py'")
    assert not Path(f"/tmp/{marker}.py").exists()


def test_a_malformed_header(runtime):
    _refused(runtime, f"{HEAD}harness.py\ndef run(q, env):\n    return q\n", "malformed")


def test_a_bundle_without_an_entry(runtime):
    _refused(runtime, bundle({"agent.py": "def run(q, env):\n    return q\n"}), "no harness.py")


def test_a_one_file_harness_loads_no_import_machinery(runtime):
    """The bundle loader's imports are on its own path only: a one-file run starts as before
    (its start-up time is measured, docs/measurements.md)."""
    src = ("import sys\ndef run(question, env):\n"
           "    return repr(sorted(m for m in sys.modules if m.startswith('importlib')))\n")  # fmt: skip
    t = runtime.run(src, "x")
    assert (t.status, t.answer) == ("ok", "[]")
