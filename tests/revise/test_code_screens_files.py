"""The code screens read a harness of several files as one program: violations in any file
are found at their line in the bundle, and imports of the harness's own files are no escape."""

from __future__ import annotations

from tests.bundles import FILES
from whale.harness.bundle import render
from whale.revise.code_screens import DuplicateScreen, interface_violations
from whale.revise.reviewer import code_only


def test_a_clean_folder_harness_has_no_violation():
    assert interface_violations(render(FILES), render(FILES)) == []


def test_a_forbidden_import_in_another_file_is_found_at_its_bundle_line():
    src = render({**FILES, "util.py": "import subprocess\n\ndef clean(reply):\n    return reply\n"})
    line = src.split("\n").index("import subprocess") + 1
    assert interface_violations(src, render(FILES)) == [
        f"line {line}: forbidden import: import subprocess"
    ]


def test_the_harness_s_own_modules_are_no_forbidden_import_nor_module_internals():
    files = {
        "harness.py": "import code\n\ndef run(question, env):\n    return code._fix(question)\n",
        "code.py": "def _fix(q):\n    return q\n",
    }
    assert interface_violations(render(files)) == []
    one = "import code\n\ndef run(question, env):\n    return code._fix(question)\n"
    assert interface_violations(one)  # a one-file harness importing the stdlib's code: flagged


def test_an_edit_in_a_helper_that_run_reaches_is_no_duplicate_of_its_parent():
    screen = DuplicateScreen()
    screen.add("seed", render(FILES))
    changed = render({**FILES, "util.py": (
        "def clean(reply):\n    text = str(reply)\n    for mark in ('.', ',', ';'):\n"
        "        text = text.replace(mark, ' ')\n    return ' '.join(text.split())\n")})  # fmt: skip
    assert screen.check(changed) is None
    assert screen.check(render(FILES)) is not None  # and a copy still is one


def test_the_reviewer_reads_the_files_under_their_headers():
    text = code_only(render({**FILES, "util.py": '"""Say OK."""\nX = 1\n'}))
    assert "# === whale file: util.py ===\nX = 1" in text and "Say OK" not in text
