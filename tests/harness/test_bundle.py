"""The bundle format of a harness of several files (whale/harness/bundle.py): read a folder,
parse, render, write a folder back, and every rule a hostile bundle or folder breaks."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.bundles import FILES, bundle, write
from whale.harness import load_harness, worker
from whale.harness.bundle import (
    ENTRY,
    HEAD,
    MAX_FILES,
    TAIL,
    BundleError,
    files_of,
    flat_tree,
    from_files,
    is_bundle,
    parse,
    read_folder,
    render,
    syntax_tree,
    write_folder,
)
from whale.harness.contract import MAX_SOURCE_CHARS, run_contract_fault
from whale.runs.setup import HarnessUnavailable
from whale.runs.setup import load_harness as load_seed


def test_a_folder_is_one_bundle_entry_first_then_sorted(tmp_path):
    src = read_folder(write(tmp_path))
    heads = [line for line in src.split("\n") if line.startswith(HEAD)]
    assert heads == [f"{HEAD}{p}{TAIL}" for p in
                     ("harness.py", "helpers/marks.py", "helpers/text.py", "util.py")]  # fmt: skip
    assert parse(src) == {p: FILES[p] for p in parse(src)} and set(parse(src)) == set(FILES)
    assert load_harness(str(tmp_path)) == src  # the name a user gives: the folder's path


def test_a_folder_of_harness_py_alone_is_that_file_unchanged(tmp_path):
    (tmp_path / ENTRY).write_text(FILES[ENTRY])
    src = read_folder(tmp_path)
    assert src == FILES[ENTRY] and not is_bundle(src) and files_of(src) == {ENTRY: src}


def test_parse_and_render_are_inverse_and_a_final_newline_is_added():
    files = {ENTRY: FILES[ENTRY], "util.py": "X = 1", "empty.py": "", "blank.py": "\n"}
    src = render(files)
    assert parse(src) == {**files, "util.py": "X = 1\n"}
    assert render(parse(src)) == src


def test_from_files_keeps_one_file_as_it_is_and_refuses_a_forged_header():
    assert from_files({ENTRY: "def run(q, env):\n    return q"}) == "def run(q, env):\n    return q"
    with pytest.raises(BundleError, match="marks whale's file headers"):
        from_files({ENTRY: f"{HEAD}util.py{TAIL}\ndef run(q, env):\n    return q\n"})


@pytest.mark.parametrize(
    "name",
    ["../x.py", "/etc/x.py", "a/../x.py", "a\\b.py", "x.txt", "1x.py", "a b.py", "x", ".x.py",
     "a//b.py", "__init__.py", "é.py", "x.py\nimport os"],
)  # fmt: skip
def test_a_file_name_that_is_no_relative_module_path_is_refused(name):
    with pytest.raises(BundleError, match="file name|__init__"):
        render({ENTRY: FILES[ENTRY], name: "X = 1\n"})


@pytest.mark.parametrize(
    "files, why",
    [
        ({"util.py": "X = 1\n"}, "no harness.py"),
        ({ENTRY: "", "util.py": "", "Util.py": ""}, "differ only in case"),
        ({ENTRY: "", "util.py": "", "util/__init__.py": ""}, "both the module util"),
        ({ENTRY: "", "util.py": "", "util/x.py": ""}, "both a module and a folder"),
        ({ENTRY: "", "harness/x.py": ""}, "both a module and a folder"),
        ({ENTRY: "", **{f"m{i}.py": "" for i in range(MAX_FILES)}}, "over the limit of 64"),
        ({ENTRY: "", "a/b/c/d/e/f/g/h/i.py": ""}, "at most 8 parts"),
    ],
)
def test_files_that_break_a_rule_are_refused_naming_it(files, why):
    with pytest.raises(BundleError, match=why):
        render(files)


def test_parse_refuses_malformed_repeated_and_too_many_headers():
    with pytest.raises(BundleError, match="line 3: a malformed file header"):
        parse(f"{HEAD}harness.py{TAIL}\nx = 1\n{HEAD}util.py ==\n")
    with pytest.raises(BundleError, match="line 3: a second file 'harness.py'"):
        parse(bundle({ENTRY: "x = 1\n"}) + bundle({ENTRY: "y = 2\n"}))
    many = bundle({ENTRY: "", **{f"m{i}.py": "" for i in range(5000)}})
    with pytest.raises(BundleError, match="more than 64 files"):
        parse(many)


def test_a_header_forged_inside_a_file_is_a_header_whose_name_is_checked():
    forged = bundle({ENTRY: FILES[ENTRY], "util.py": f"X = 1\n{HEAD}../../escape.py{TAIL}\n"})
    with pytest.raises(BundleError, match="'../../escape.py': a file name"):
        parse(forged)


def test_the_worker_reads_the_header_the_bundle_writes():
    assert (worker._BUNDLE_HEAD, worker._BUNDLE_TAIL) == (HEAD, TAIL)


# --- the contract on a bundle -------------------------------------------------------------


def test_a_valid_bundle_keeps_the_contract(tmp_path):
    assert run_contract_fault(read_folder(write(tmp_path))) is None


def test_a_file_that_does_not_parse_is_a_fault_naming_it():
    src = render({**FILES, "util.py": "def clean(reply)\n    return reply\n"})
    assert run_contract_fault(src) == "does not parse: util.py: SyntaxError: expected ':' (line 1)"


def test_the_entry_must_define_run():
    src = render({**FILES, ENTRY: "import util\n\ndef solve(q, env):\n    return q\n"})
    assert run_contract_fault(src) == "defines no callable run(question, env) (in harness.py)"
    src = render({**FILES, ENTRY: "def run(q, env)\n"})
    assert run_contract_fault(src).startswith("does not parse: harness.py: SyntaxError")


def test_a_bundle_that_breaks_the_format_is_a_fault_saying_so():
    fault = run_contract_fault(bundle({ENTRY: FILES[ENTRY], "../x.py": "X = 1\n"}))
    assert fault.startswith("is not a valid bundle of files: '../x.py': a file name")


def test_a_huge_bundle_is_refused_by_size_before_parsing():
    src = bundle({ENTRY: FILES[ENTRY], "big.py": "X = 1\n" * (MAX_SOURCE_CHARS // 6 + 1)})
    assert "over the limit of 1000000" in run_contract_fault(src)


# --- reading a folder ---------------------------------------------------------------------


def test_a_folder_without_harness_py_is_refused(tmp_path):
    (tmp_path / "agent.py").write_text(FILES[ENTRY])
    with pytest.raises(BundleError, match="no harness.py"):
        read_folder(tmp_path)


def test_a_folder_with_other_files_links_or_bad_text_is_refused(tmp_path):
    write(tmp_path)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(BundleError, match="notes.txt is not a .py file"):
        read_folder(tmp_path)
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "link.py").symlink_to("/etc/passwd")
    with pytest.raises(BundleError, match="link.py is not a regular file"):
        read_folder(tmp_path)
    (tmp_path / "link.py").unlink()
    (tmp_path / "lib").symlink_to("/usr/lib", target_is_directory=True)
    with pytest.raises(BundleError, match="lib is a symbolic link"):
        read_folder(tmp_path)
    (tmp_path / "lib").unlink()
    (tmp_path / "latin.py").write_bytes(b"X = '\xe9'\n")
    with pytest.raises(BundleError, match="latin.py is not UTF-8"):
        read_folder(tmp_path)


def test_hidden_entries_and_pycache_are_skipped(tmp_path):
    write(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("x")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    assert set(parse(read_folder(tmp_path))) == set(FILES)


def test_a_folder_of_thousands_of_files_stops_at_the_limit(tmp_path):
    write(tmp_path)
    for i in range(200):
        (tmp_path / f"m{i:04d}.py").write_text("X = 1\n")
    with pytest.raises(BundleError, match="more than 64 .py files"):
        read_folder(tmp_path)
    for i in range(200, 3000):
        (tmp_path / f"m{i:04d}.py").write_text("X = 1\n")
    with pytest.raises(BundleError, match="more than 1000 files and folders"):
        read_folder(tmp_path)


def test_a_folder_of_thousands_of_empty_folders_stops_at_the_limit(tmp_path):
    write(tmp_path)
    for i in range(1500):
        (tmp_path / f"d{i:04d}").mkdir()
    with pytest.raises(BundleError, match="more than 1000 files and folders"):
        read_folder(tmp_path)


def test_a_folder_nested_past_the_limit_is_refused(tmp_path):
    write(tmp_path)
    (tmp_path / "/".join("abcdefghij")).mkdir(parents=True)
    with pytest.raises(BundleError, match="nested past 8 folders"):
        read_folder(tmp_path)


def test_a_huge_file_in_a_folder_is_refused(tmp_path):
    write(tmp_path)
    (tmp_path / "big.py").write_text("X = 1\n" * (MAX_SOURCE_CHARS // 6 + 1))
    with pytest.raises(BundleError, match="over the limit of 1000000"):
        read_folder(tmp_path)


def test_the_command_line_names_a_bad_folder_as_the_harness_field(tmp_path):
    with pytest.raises(HarnessUnavailable, match="no harness.py") as e:
        load_seed(str(tmp_path))
    assert e.value.field == "harness"


# --- writing a folder ---------------------------------------------------------------------


def test_write_folder_gives_back_the_same_files(tmp_path):
    src = read_folder(write(tmp_path / "in"))
    out = write_folder(src, tmp_path / "out")
    assert read_folder(out) == src
    assert (out / "helpers" / "text.py").read_bytes() == FILES["helpers/text.py"].encode()
    write_folder(render({ENTRY: FILES[ENTRY], "util.py": FILES["util.py"]}), out)  # replaced
    assert sorted(p.name for p in out.rglob("*.py")) == ["harness.py", "util.py"]


def test_write_folder_refuses_a_hostile_bundle_and_writes_nothing(tmp_path):
    dest = tmp_path / "a" / "out"
    dest.parent.mkdir()
    for bad in ("../escape.py", "/tmp/escape.py", "../../escape.py"):
        with pytest.raises(BundleError):
            write_folder(bundle({ENTRY: FILES[ENTRY], bad: "X = 1\n"}), dest)
    assert list(tmp_path.rglob("*")) == [tmp_path / "a"]


def test_write_folder_never_writes_through_a_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "out").symlink_to(target, target_is_directory=True)
    with pytest.raises(BundleError, match="not a folder"):
        write_folder(render(FILES), tmp_path / "out")
    assert os.listdir(target) == []


# --- static views -------------------------------------------------------------------------


def test_syntax_tree_puts_each_node_at_its_line_in_the_bundle():
    src = render(FILES)
    lines = src.split("\n")
    defs = {n.name: n.lineno for n in ast.walk(syntax_tree(src)) if isinstance(n, ast.FunctionDef)}
    assert set(defs) == {"run", "clean", "shout"}
    for name, line in defs.items():
        assert lines[line - 1].startswith(f"def {name}(")
    assert [n.name for n in syntax_tree(src).body if isinstance(n, ast.FunctionDef)][-1] == "run"


def test_flat_tree_reads_a_call_through_a_module_as_a_call_of_its_function():
    src = render(FILES)
    calls = {ast.unparse(n.func) for n in ast.walk(flat_tree(src)) if isinstance(n, ast.Call)}
    assert {"clean", "shout"} <= calls and "util.clean" not in calls
    assert ast.unparse(syntax_tree(src)).count("util.clean") == 1


def test_syntax_tree_of_an_invalid_bundle_is_a_syntax_error():
    with pytest.raises(SyntaxError, match="not a valid bundle"):
        syntax_tree(bundle({ENTRY: "", "../x.py": ""}))


def test_syntax_tree_of_one_file_is_ast_parse(tmp_path: Path):
    src = FILES[ENTRY]
    assert ast.dump(syntax_tree(src)) == ast.dump(ast.parse(src))
