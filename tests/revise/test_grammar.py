import pytest

from whale.harness import load_harness, seed_names
from whale.revise.grammar import edit_grammar

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("name", seed_names())
def test_grammar_of_each_seed_compiles(name):
    llama_cpp.LlamaGrammar.from_string(edit_grammar(load_harness(name)), verbose=False)


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
