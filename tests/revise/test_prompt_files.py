"""The proposer's prompt for a harness of several files: still the paper's x_t (task, harness,
report, env API, edit format), the harness shown file by file under its names, the block format
naming a file; nothing that suggests a fix."""

from __future__ import annotations

from tests.bundles import FILES
from whale.harness import Budget
from whale.harness.bundle import HEAD, render
from whale.metaharness.loop import FILES_NOTE
from whale.revise.proposer import api_section, load_template
from whale.revise.proposer import render as prompt

SRC = render(FILES)
DESCRIPTION, REPORT = "<<DESCRIPTION SENTINEL>>", "<<REPORT SENTINEL>>"

# Every line the default template adds around the inserted parts for a bundle: the one-file
# skeleton (tests/revise/test_prompt_x_t.py) with the contract and format sentences for files.
SKELETON = [
    "You revise a harness: a Python program that uses a language model (the solver) to answer "
    "the questions of one task. You are given the task, the current harness and the report of "
    "running it. Write an edit of the harness so that more of its answers are right.",
    "# The harness contract",
    "The harness is a folder of Python files, shown below file by file. Its entry file, "
    "harness.py, imports the others as modules by their names (`import util` for util.py, "
    "`from helpers import text` for helpers/text.py) and defines `run(question, env) -> str`, "
    "returning the final answer as a string. It may use the Python standard library. It runs "
    "in a sandbox with no network and no files but its own. `env` offers exactly:",
    "# The task",
    "# The current harness",
    *[line for path in FILES for line in (f"File {path}:", "```python", "```")],
    "# Execution report",
    "# How to answer",
    "First write one or two sentences saying what your edit changes. Then give the edit as one "
    "or more SEARCH/REPLACE blocks. The SEARCH part must copy lines of the current harness "
    "exactly (same indentation), and it must match one place only. Each block names the file it "
    "edits after SEARCH on its first line, `<<<<<<< SEARCH FILE_NAME` (a block that names none "
    "edits harness.py). The REPLACE part is the new text for those lines. The format, with "
    "placeholders in capitals:",
    "SENTENCES SAYING WHAT THE EDIT CHANGES",
    "<<<<<<< SEARCH FILE_NAME",
    "LINES COPIED FROM THE CURRENT HARNESS",
    "=======",
    "THE NEW LINES",
    ">>>>>>> REPLACE",
    "Write only the explanation and the blocks.",
]


def test_a_folder_harness_prompt_is_x_t_with_its_files_by_name():
    text = prompt(load_template("default"), DESCRIPTION, SRC, REPORT, Budget())
    parts = [DESCRIPTION, REPORT, api_section(("python",), Budget())]
    parts += [FILES[p].rstrip() for p in FILES]
    for part in parts:
        assert text.count(part) == 1, part
        text = text.replace(part, "", 1)
    assert [line for line in text.splitlines() if line.strip()] == SKELETON


def test_the_prompt_shows_no_header_line():
    text = prompt(load_template("default"), DESCRIPTION, SRC, REPORT, Budget())
    assert HEAD not in text


def test_placeholders_inside_the_harness_or_report_are_shown_as_they_are():
    src = "def run(question, env):\n    return '{report} {api} {harness}'\n"
    text = prompt(load_template("default"), "the {source}", src, "saw {description}", Budget())
    assert "return '{report} {api} {harness}'" in text
    assert "the {source}" in text and "saw {description}" in text


def test_a_template_of_ones_own_with_source_gets_the_bundle_text():
    text = prompt("HARNESS:\n{source}\nEND", DESCRIPTION, SRC, REPORT, Budget())
    assert text == f"HARNESS:\n{SRC.rstrip()}\nEND"


def test_the_search_agents_note_is_the_edit_format_only():
    assert "SEARCH NAME" in FILES_NOTE and HEAD.strip() in FILES_NOTE
    for hint in ("answer", "prose", "arithmetic", "python(", "normalize"):
        assert hint not in FILES_NOTE.lower()
