import json

import pytest

from whale import apply_edits
from whale.harness import load_harness, seed_names
from whale.revise.grammar import edit_grammar

try:
    import llama_cpp
except ImportError:  # the consistency tests below need no llama.cpp
    llama_cpp = None
needs_llama = pytest.mark.skipif(llama_cpp is None, reason="llama_cpp is not installed")


@needs_llama
@pytest.mark.parametrize("name", seed_names())
def test_grammar_of_each_seed_compiles(name):
    llama_cpp.LlamaGrammar.from_string(edit_grammar(load_harness(name)), verbose=False)


@needs_llama
def test_grammar_escapes_quotes_backslashes_and_tabs():
    src = 'def run(question, env):\n\tx = "a\\\\b"  # "quoted"\n\treturn x\n'
    g = edit_grammar(src)
    llama_cpp.LlamaGrammar.from_string(g, verbose=False)
    assert "\\t" in g and '\\"quoted\\"' in g


def test_search_alternatives_are_the_parents_own_lines():
    g = edit_grammar("def run(question, env):\n    return 'x'\n")
    assert 'l0 ::= "def run(question, env):\\n"' in g and "s0 ::= l0 s1?" in g


def test_grammar_allows_as_many_blocks_as_asked():
    src = "def run(question, env):\n    return 'x'\n"
    assert edit_grammar(src, max_blocks=1).splitlines()[0] == "root ::= expl block"
    assert edit_grammar(src, max_blocks=3).splitlines()[0] == "root ::= expl block block? block?"


def _searches(grammar, longest=4):
    """Every SEARCH text of up to `longest` lines that the grammar lets the model write."""
    rules = dict(r.split(" ::= ", 1) for r in grammar.splitlines())
    out = []
    for start in rules["search"].split(" | "):
        name, text = start, ""
        for _ in range(longest):
            body = rules[name]
            lit = rules[body.split()[0]]
            text += json.loads(lit)
            out.append(text)
            if " " not in body:
                break
            name = body.split()[1].rstrip("?")
    return out


@pytest.mark.parametrize("name", seed_names())
def test_every_search_the_grammar_allows_is_found_by_apply(name):
    src = load_harness(name)
    for search in _searches(edit_grammar(src)):
        r = apply_edits(src, f"x\n<<<<<<< SEARCH\n{search}=======\n# gone\n>>>>>>> REPLACE\n")
        assert "not found" not in r.reason, (search, r.reason)


def test_a_parent_line_that_reads_as_a_marker_is_never_part_of_a_search():
    src = 'def run(question, env):\n    s = """\n=======\n"""\n    return s\n'
    g = edit_grammar(src)
    assert all("=======" not in s for s in _searches(g, longest=9))
    assert "s2 ::=" not in g and "s1 ::= l1\n" in g
