import os

import pytest

from whale.harness import harness_hash
from whale.metaharness import (
    Archive,
    ArchiveTools,
    CandidateMeta,
    ToolCall,
    ToolRefused,
    parse_call,
)

SRC = "def run(question, env):\n    return 'x'\n"
SRC2 = "def run(question, env):\n    return question.strip()\n"


@pytest.fixture
def tools(tmp_path):
    a = Archive(tmp_path / "archive", ["q1", "q2"])
    a.add(CandidateMeta("c0000", None, 0, "seed", harness_hash(SRC), True, score=0.0,
                        accuracy=0.0), SRC,
          [{"question_id": "q1", "answer": "x", "score": 0.0, "correct": False, "status": "ok"}])
    a.add(CandidateMeta("c0001", "c0000", 1, "strip", harness_hash(SRC2), True, score=0.5,
                        accuracy=0.5), SRC2)
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    return ArchiveTools(a, "Add two numbers.", char_budget=2000)


@pytest.mark.parametrize("name", ["read", "list", "grep"])
@pytest.mark.parametrize("path", ["../secret.txt", "c0000/../../secret.txt", "/etc/passwd",
                                  "~/x", "c0000/\x00"])
def test_every_path_tool_refuses_paths_outside_the_archive(tools, name, path):
    args = {"path": path, "pattern": "SECRET"}
    out = tools.call(ToolCall(name, args))
    assert out.startswith("error:") and "SECRET" not in out and "root:" not in out


@pytest.mark.parametrize("name", ["read", "list", "grep"])
def test_symlinks_are_refused_not_followed(tools, tmp_path, name):
    os.symlink(tmp_path / "secret.txt", tmp_path / "archive/c0000/link.txt")
    os.symlink(tmp_path, tmp_path / "archive/outside")
    for path in ("c0000/link.txt", "outside/secret.txt", "outside"):
        out = tools.call(ToolCall(name, {"path": path, "pattern": "SECRET"}))
        assert out.startswith("error:") and "symbolic link" in out and "SECRET" not in out


def test_grep_of_the_whole_archive_skips_links(tools, tmp_path):
    os.symlink(tmp_path / "secret.txt", tmp_path / "archive/c0000/link.txt")
    assert "SECRET" not in tools.call(ToolCall("grep", {"pattern": "SECRET"}))


def test_read_a_line_range(tools):
    out = tools.call(ToolCall("read", {"path": "c0001/harness.py", "start": 2, "end": 2}))
    assert out.strip() == "2      return question.strip()"


def test_diff_top_and_failures(tools):
    assert "+    return question.strip()" in tools.call(ToolCall("diff", {"a": "c0000", "b": "c0001"}))
    assert tools.call(ToolCall("top", {"k": 1})).startswith("c0001")
    assert "q1" in tools.call(ToolCall("failures", {"id": "c0000"}))


def test_output_is_cut_to_the_budget(tools, tmp_path):
    (tmp_path / "archive/c0000/big.txt").write_text("y\n" * 10_000)
    out = tools.call(ToolCall("read", {"path": "c0000/big.txt"}))
    assert len(out) <= 2000 and "output cut" in out


def test_text_protocol_parses_a_call_with_a_body():
    c = parse_call('I will look.\nCALL submit {"base": "c0001", "hypothesis": "strip"}\n'
                   "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n")
    assert c.name == "submit" and c.args["base"] == "c0001" and c.body.startswith("<<<<<<<")


@pytest.mark.parametrize("reply,why", [
    ("let me read the file", "no CALL line"),
    ("CALL read {path: x}", "not valid JSON"),
    ("CALL rm {}", "unknown tool"),
    ('CALL read ["x"]', "malformed CALL line"),
])
def test_text_protocol_rejects_malformed_replies_with_a_message(reply, why):
    with pytest.raises(ToolRefused, match=why):
        parse_call(reply)


def test_grep_reads_large_files_without_caching_them(tools, tmp_path):
    big = tmp_path / "archive/c0000/trajectories.jsonl"
    big.write_text("filler line\n" * 40_000 + "the NEEDLE is here\n")
    assert "c0000/trajectories.jsonl:40001" in tools.call(ToolCall("grep", {"pattern": "needle"}))
    assert big.parent not in tools._folders_cache  # a folder with a large file is not cached


def test_grep_sees_a_candidate_archived_after_the_first_grep(tools):
    assert "(no match)" == tools.call(ToolCall("grep", {"pattern": "brand new text"}))
    src = "def run(question, env):\n    return 'brand new text'\n"
    tools.archive.add(CandidateMeta("c0100", "c0001", 1, "new", harness_hash(src), True,
                                    score=0.1), src)
    assert "c0100/harness.py:2" in tools.call(ToolCall("grep", {"pattern": "BRAND NEW"}))
