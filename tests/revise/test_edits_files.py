"""Apply on a harness of several files: a block names the file it edits, Apply stays exact
(one match in that file, every file parses, the entry keeps `run`), and the files no block
names are left byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.bundles import FILES
from whale import apply_edits
from whale.harness.bundle import ENTRY, HEAD, TAIL, parse, render
from whale.metaharness.agent import call_grammar
from whale.revise.edits import parse_blocks
from whale.revise.grammar import edit_grammar

llama_cpp: Any
try:
    import llama_cpp
except ImportError:  # the grammar's consistency tests need no llama.cpp
    llama_cpp = None

SRC = render(FILES)


def block(search: str, replace: str, file: str | None = None) -> str:
    marker = "<<<<<<< SEARCH" + (f" {file}" if file is not None else "")
    return f"{marker}\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_a_block_naming_a_file_edits_it_and_leaves_the_others_byte_identical():
    r = apply_edits(SRC, "Strip less.\n" + block(
        "    return str(reply).strip()\n", "    return str(reply).strip(' ')\n", "util.py"))  # fmt: skip
    assert r.ok, r.reason
    before, after = parse(SRC), parse(r.source)
    assert after["util.py"] == "def clean(reply):\n    return str(reply).strip(' ')\n"
    assert list(after) == list(before)
    for path in ("harness.py", "helpers/text.py", "helpers/marks.py"):
        assert after[path].encode() == before[path].encode()


def test_a_block_naming_no_file_edits_the_entry():
    r = apply_edits(SRC, "x\n" + block("    reply = env.llm(question)\n",
                                        "    reply = env.llm(question, max_tokens=64)\n"))  # fmt: skip
    assert r.ok, r.reason
    assert (
        "max_tokens=64" in parse(r.source)[ENTRY] and parse(r.source)["util.py"] == FILES["util.py"]
    )


def test_blocks_in_two_files_apply_together():
    text = "x\n" + block("BANG = '!'\n", "BANG = '?'\n", "helpers/marks.py") + block(
        "    return str(reply).strip()\n", "    return str(reply)\n", "util.py")  # fmt: skip
    r = apply_edits(SRC, text)
    assert r.ok and r.n_edits == 2
    assert parse(r.source)["helpers/marks.py"] == "BANG = '?'\n"


def test_parse_blocks_reads_the_file_name():
    edits = parse_blocks(block("a\n", "b\n", "helpers/text.py") + block("c\n", "d\n"))
    assert [e.file for e in edits] == ["helpers/text.py", None]


@pytest.mark.parametrize(
    "name, why",
    [
        ("missing.py", "block 1: the harness has no file missing.py (its files: harness.py, "
                       "util.py, helpers/text.py, helpers/marks.py)"),
        ("../x.py", "block 1: '../x.py' is not a file of a harness (a file name is a relative "
                    "path"),
        ("/etc/x.py", "block 1: '/etc/x.py' is not a file of a harness"),
        ("util.py extra", "block 1: 'util.py extra' is not a file of a harness"),
    ],
)  # fmt: skip
def test_a_block_naming_a_file_the_harness_lacks_is_refused(name, why):
    r = apply_edits(SRC, "x\n" + block("X = 1\n", "X = 2\n", name))
    assert not r.ok and r.source == SRC and r.reason.startswith(why), r.reason


def test_a_replace_that_would_forge_a_file_header_is_refused():
    forged = f"    return str(reply)\n{HEAD}evil.py{TAIL}\nimport os\n"
    r = apply_edits(SRC, "x\n" + block("    return str(reply).strip()\n", forged, "util.py"))
    assert not r.ok and "its REPLACE has a line that begins with '# === whale file:'" in r.reason
    one = "def run(question, env):\n    return question\n"  # a one-file harness too
    r = apply_edits(one, "x\n" + block("def run(question, env):\n", f"{HEAD}harness.py{TAIL}\n"
                                       "def run(question, env):\n"))  # fmt: skip
    assert not r.ok and "whale's file headers" in r.reason


def test_a_result_where_another_file_does_not_parse_is_refused_naming_it():
    r = apply_edits(SRC, "x\n" + block("def clean(reply):\n", "def clean(reply)\n", "util.py"))
    assert not r.ok and not r.syntax_ok
    assert r.reason == "result does not parse: util.py: SyntaxError: expected ':' (line 1)"


def test_the_entry_must_keep_run():
    r = apply_edits(SRC, "x\n" + block("def run(question, env):\n", "def solve(question, env):\n"))
    assert not r.ok and r.reason == "result drops run(question, env) (in harness.py)"


def test_a_no_op_is_refused():
    r = apply_edits(SRC, "x\n" + block("BANG = '!'\n", "BANG = '!'   \n", "helpers/marks.py"))
    assert not r.ok and r.reason.startswith("no-op")


def test_a_search_found_in_another_file_says_which():
    r = apply_edits(SRC, "x\n" + block("    return str(reply).strip()\n", "    return 1\n"))
    assert not r.ok
    assert r.reason == ("block 1: SEARCH text not found in harness.py (it is in util.py: name the "
                        "file on the SEARCH line, <<<<<<< SEARCH util.py)")  # fmt: skip


def test_a_match_is_unique_within_its_file_only():
    files = {**FILES, "a.py": "X = 1\nX = 1\n", "b.py": "X = 1\n"}
    src = render(files)
    r = apply_edits(src, "x\n" + block("X = 1\n", "X = 2\n", "a.py"))
    assert not r.ok and r.reason.startswith("block 1: SEARCH text matches 2 places in a.py")
    r = apply_edits(src, "x\n" + block("X = 1\n", "X = 2\n", "b.py"))
    assert r.ok and parse(r.source)["a.py"] == "X = 1\nX = 1\n"


def test_overlapping_blocks_in_one_file_are_refused():
    text = (
        "x\n"
        + block("def clean(reply):\n    return str(reply).strip()\n", "Y = 1\n", "util.py")
        + block("    return str(reply).strip()\n", "Z\n", "util.py")
    )
    r = apply_edits(SRC, text)
    assert not r.ok and r.reason == "block 2: its SEARCH overlaps block 1"


def test_a_fenced_rewrite_replaces_the_entry_only():
    new = "import util\n\ndef run(question, env):\n    return util.clean(question)\n"
    r = apply_edits(SRC, f"Simpler.\n```python\n{new}```\n")
    assert r.ok and r.mode == "rewrite"
    assert parse(r.source)[ENTRY] == new and parse(r.source)["util.py"] == FILES["util.py"]
    whole = f"```python\n{SRC}```\n"  # the whole bundle, headers and all, in one fence
    r = apply_edits(SRC, whole)
    assert not r.ok and "a fenced rewrite replaces harness.py only" in r.reason


def test_a_fenced_pair_edits_the_one_file_it_is_found_in():
    text = ("Change the mark.\n```python\nBANG = '!'\n```\nreplace with\n```python\n"
            "BANG = '?'\n```\n")  # fmt: skip
    r = apply_edits(SRC, text)
    assert (
        r.ok and r.mode == "fenced-pair" and parse(r.source)["helpers/marks.py"] == "BANG = '?'\n"
    )


def test_a_one_file_harness_takes_its_own_name_and_no_other():
    one = "def run(question, env):\n    return question\n"
    r = apply_edits(one, "x\n" + block("    return question\n", "    return 'a'\n", "harness.py"))
    assert r.ok and r.source == "def run(question, env):\n    return 'a'\n"
    r = apply_edits(one, "x\n" + block("    return question\n", "    return 'a'\n", "util.py"))
    assert (
        not r.ok and r.reason == "block 1: the harness has no file util.py (its files: harness.py)"
    )


def test_a_parent_that_is_no_valid_bundle_makes_no_candidate():
    bad = f"{HEAD}../x.py{TAIL}\nX = 1\n"
    r = apply_edits(bad, "x\n" + block("X = 1\n", "X = 2\n"))
    assert not r.ok and r.reason.startswith("the harness is not a valid bundle of files")


# --- the edit grammar ---------------------------------------------------------------------


def _searches(grammar: str, start: str, longest: int = 3) -> list[str]:
    """Every SEARCH text of up to `longest` lines that the rule `start` lets the model write."""
    rules = dict(r.split(" ::= ", 1) for r in grammar.splitlines())
    out = []
    for first in rules[start].split(" | "):
        name, text = first, ""
        for _ in range(longest):
            body = rules[name]
            text += json.loads(rules[body.split()[0]])
            out.append(text)
            if " " not in body:
                break
            name = body.split()[1].rstrip("?")
    return out


def test_the_grammar_makes_each_block_name_a_file_and_copy_its_lines():
    g = edit_grammar(SRC)
    files = parse(SRC)
    assert '"<<<<<<< SEARCH util.py\\n" f1-search' in g
    for k, path in enumerate(files):
        searches = _searches(g, f"f{k}-search")
        assert searches
        for search in searches:
            r = apply_edits(SRC, f"x\n<<<<<<< SEARCH {path}\n{search}=======\n# gone\n"
                                 ">>>>>>> REPLACE\n")  # fmt: skip
            assert "not found" not in r.reason and "no file" not in r.reason, (path, search, r)


def test_an_empty_file_is_not_offered_to_the_grammar():
    g = edit_grammar(render({**FILES, "helpers/__init__.py": ""}))
    assert "SEARCH helpers/__init__.py" not in g and "SEARCH helpers/marks.py" in g


@pytest.mark.skipif(llama_cpp is None, reason="llama_cpp is not installed")
def test_the_grammars_of_a_bundle_compile():
    llama_cpp.LlamaGrammar.from_string(edit_grammar(SRC), verbose=False)
    one = "def run(question, env):\n    return question\n"
    llama_cpp.LlamaGrammar.from_string(call_grammar({"c0000": SRC, "c0100": one}), verbose=False)
