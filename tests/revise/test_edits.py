"""Apply on well-formed and malformed proposals: every failure names its block and fault."""

from whale import apply_edits
from whale.revise.edits import check_harness

PARENT = """def run(question, env):
    reply = env.llm(question)
    return reply.text.strip()
"""


def block(search, replace):
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def test_one_block_applies():
    r = apply_edits(
        PARENT, "Strip less.\n" + block("    return reply.text.strip()", "    return reply.text")
    )
    assert r.ok and r.mode == "blocks" and r.n_edits == 1 and "return reply.text\n" in r.source


def test_two_blocks_apply_in_order():
    p = (
        block("    reply = env.llm(question)", "    reply = env.llm(question, max_tokens=64)")
        + "\n"
        + block("    return reply.text.strip()", "    return reply.text.strip().split()[-1]")
    )
    r = apply_edits(PARENT, p)
    assert r.ok and r.n_edits == 2 and "max_tokens=64" in r.source and "split()[-1]" in r.source


def test_no_blocks_is_invalid():
    r = apply_edits(PARENT, "I would add a retry loop.")
    assert not r.ok and not r.parsed and "no SEARCH/REPLACE blocks" in r.reason
    assert r.source == PARENT


def test_unclosed_block_names_the_missing_marker():
    r = apply_edits(
        PARENT, "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n    return 'x'\n"
    )
    assert not r.ok and r.reason == "block 1: unclosed (no >>>>>>> REPLACE)"


def test_missing_divider_is_named():
    r = apply_edits(PARENT, "<<<<<<< SEARCH\n    return reply\n>>>>>>> REPLACE")
    assert not r.ok and "block 1: >>>>>>> REPLACE before =======" in r.reason


def test_zero_matches_names_the_block():
    p = (
        block("    reply = env.llm(question)", "    reply = env.llm(question)  # same")
        + "\n"
        + block("    return answer", "    return 'x'")
    )
    r = apply_edits(PARENT, p)
    assert not r.ok and r.reason.startswith("block 2: SEARCH text not found")


def test_two_matches_is_invalid():
    parent = "def run(question, env):\n    x = 1\n    x = 1\n    return str(x)\n"
    r = apply_edits(parent, block("    x = 1", "    x = 2"))
    assert not r.ok and "block 1: SEARCH text matches 2 places" in r.reason


def test_whitespace_only_difference_does_not_match_but_says_so():
    r = apply_edits(PARENT, block("\treturn reply.text.strip()", "\treturn 'x'"))
    assert not r.ok and "matches only if whitespace is ignored" in r.reason


def test_result_that_does_not_parse_is_invalid():
    r = apply_edits(PARENT, block("    return reply.text.strip()", "    return (reply.text"))
    assert not r.ok and r.parsed and not r.syntax_ok and "does not parse" in r.reason


def test_result_that_drops_run_is_invalid():
    r = apply_edits(PARENT, block("def run(question, env):", "def solve(question, env):"))
    assert not r.ok and r.syntax_ok and "drops run(question, env)" in r.reason


def test_result_with_wrong_run_signature_is_invalid():
    r = apply_edits(PARENT, block("def run(question, env):", "def run(question):"))
    assert not r.ok and "cannot be called as run(question, env)" in r.reason


def test_noop_is_invalid():
    r = apply_edits(PARENT, block("    return reply.text.strip()", "    return reply.text.strip()"))
    assert not r.ok and r.reason.startswith("no-op")


def test_fenced_rewrite_is_accepted_as_a_rewrite():
    new = "def run(question, env):\n    return env.llm(question).text\n"
    r = apply_edits(PARENT, f"Here is a better harness:\n```python\n{new}```\nDone.")
    assert r.ok and r.mode == "rewrite" and r.source == new


def test_fenced_rewrite_gets_the_same_checks():
    r = apply_edits(PARENT, "```python\ndef run(question, env):\n    return (\n```")
    assert not r.ok and r.mode == "rewrite" and "does not parse" in r.reason


def test_fenced_block_without_run_is_not_a_rewrite():
    r = apply_edits(PARENT, "Use this helper:\n```python\nimport re\nx = 1\n```")
    assert not r.ok and "no SEARCH/REPLACE blocks and no fenced python harness" in r.reason


def test_check_harness_accepts_defaults_and_varargs():
    assert check_harness("def run(question, env, tries=3):\n    return ''\n") is None
    assert check_harness("def run(*args):\n    return ''\n") is None
    assert check_harness("async def run(q, env):\n    return ''\n") is not None


def test_two_fenced_snippets_joined_by_replace_with_are_one_pair():
    p = (
        "The answer is the last number.\n```python\n    return reply.text.strip()\n```\n\n"
        "Replace with:\n```python\n    return reply.text.split()[-1]\n```\n"
    )
    r = apply_edits(PARENT, p)
    assert r.ok and r.mode == "fenced-pair" and "split()[-1]" in r.source


def test_fenced_pair_whose_first_snippet_is_not_in_the_harness_is_not_a_pair():
    p = "```python\n    x = 1\n```\nreplace with\n```python\n    x = 2\n```"
    r = apply_edits(PARENT, p)
    assert not r.ok and r.mode == "none"


def test_overlapping_blocks_are_invalid():
    p = (
        block("    reply = env.llm(question)\n    return reply.text.strip()", "    return 'a'")
        + "\n"
    )
    p += block("    return reply.text.strip()", "    return 'b'")
    r = apply_edits(PARENT, p)
    assert not r.ok and r.reason == "block 2: its SEARCH overlaps block 1"


def test_a_block_repeated_word_for_word_counts_once():
    b = block("    return reply.text.strip()", "    return reply.text")
    r = apply_edits(PARENT, b + "\n" + b)
    assert r.ok and r.n_edits == 1


def test_search_does_not_match_inside_a_longer_line():
    # The input: SEARCH `x = 1` against a parent line `x = 10` applied and gave `x = 20`.
    parent = "def run(question, env):\n    x = 10\n    return str(x)\n"
    r = apply_edits(parent, block("    x = 1", "    x = 2"))
    assert not r.ok and r.source == parent
    assert "not found" in r.reason and "only inside longer lines" in r.reason


def test_search_does_not_match_the_tail_of_a_line():
    parent = "def run(question, env):\n    y = x = 1\n    return str(y)\n"
    r = apply_edits(parent, block("x = 1", "x = 2"))
    assert not r.ok and "only inside longer lines" in r.reason


def test_trailing_whitespace_is_ignored_when_matching():
    parent = "def run(question, env):  \n    return 'a'\t\n"
    new = "def run(question, env):\n    return 'b'"
    r = apply_edits(parent, block("def run(question, env):\n    return 'a'   ", new))
    assert r.ok and r.source == new + "\n"


def test_crlf_proposal_matches_lf_parent_lines():
    p = block("    return reply.text.strip()", "    return reply.text").replace("\n", "\r\n")
    r = apply_edits(PARENT, p)
    assert r.ok and r.source.endswith("    return reply.text\n") and "\r" not in r.source


def test_parent_without_final_newline_matches_its_last_line_and_keeps_no_newline():
    parent = PARENT.rstrip("\n")
    r = apply_edits(parent, block("    return reply.text.strip()", "    return reply.text"))
    assert r.ok and r.source.endswith("    return reply.text")


def test_empty_replace_deletes_the_lines_and_a_blank_replace_leaves_one_blank_line():
    parent = "def run(question, env):\n    x = 1\n    return 'a'\n"
    gone = apply_edits(parent, "<<<<<<< SEARCH\n    x = 1\n=======\n>>>>>>> REPLACE\n")
    blank = apply_edits(parent, "<<<<<<< SEARCH\n    x = 1\n=======\n\n>>>>>>> REPLACE\n")
    assert gone.source == "def run(question, env):\n    return 'a'\n"
    assert blank.source == "def run(question, env):\n\n    return 'a'\n"


def test_fenced_pair_follows_the_whole_line_rule():
    # Before: the first snippet `x = 1` was found inside `x = 10` and the pair applied.
    parent = "def run(question, env):\n    x = 10\n    return str(x)\n"
    p = "```python\n    x = 1\n```\nReplace with:\n```python\n    x = 2\n```\n"
    r = apply_edits(parent, p)
    assert not r.ok and r.source == parent and r.mode != "fenced-pair"


def test_a_line_repeated_as_part_of_longer_lines_still_matches_once():
    parent = "def run(question, env):\n    x = 1\n    xs = [x] * 10\n    x = 10\n    return 'a'\n"
    r = apply_edits(parent, block("    x = 1", "    x = 2"))
    assert r.ok and "    x = 2\n    xs = [x] * 10\n    x = 10\n" in r.source
