"""BM25 index: build, retrieve, save/load, corpus-hash guard, and the retrieval budget."""

import json

import pytest

from whale.harness import Runtime
from whale.retrieval import BM25Index, IndexMismatch, Passage, corpus_hash, read_corpus

PASSAGES = [
    Passage("berlin", "Berlin", "Berlin is the capital of Germany and its largest city."),
    Passage("paris", "Paris", "Paris is the capital of France, on the Seine."),
    Passage("rome", "Rome", "Rome is the capital of Italy, founded long ago."),
] + [
    Passage(f"f{i}", f"Filler {i}", f"Filler passage about gardening number {i}.")
    for i in range(50)
]


@pytest.fixture(scope="module")
def index():
    return BM25Index.build(PASSAGES)


def test_retrieve_ranks_the_matching_passage_first(index):
    hits = index.retrieve("What is the capital of France?", 3)
    assert hits[0]["id"] == "paris" and set(hits[0]) == {"id", "title", "text", "score"}


def test_stemming_matches_word_forms(index):
    assert index.retrieve("gardens", 1)[0]["id"].startswith("f")


def test_empty_or_unknown_query_returns_nothing(index):
    assert index.retrieve("   ", 5) == [] and index.retrieve("zyxxqv", 5) == []


def test_save_and_load_round_trip(index, tmp_path):
    index.save(tmp_path / "idx")
    again = BM25Index.load(tmp_path / "idx", expect_hash=corpus_hash(PASSAGES))
    assert again.retrieve("capital of Italy", 1)[0]["id"] == "rome"


def test_index_of_another_corpus_is_refused(index, tmp_path):
    index.save(tmp_path / "idx")
    other = corpus_hash(PASSAGES[:-1])
    with pytest.raises(IndexMismatch, match="different corpus"):
        BM25Index.load(tmp_path / "idx", expect_hash=other)


def test_malformed_corpus_names_file_line_and_field(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"id": "a", "title": "t", "text": "x"})
        + "\n"
        + json.dumps({"id": "b", "title": 3})
        + "\n"
    )
    with pytest.raises(ValueError, match=r"c.jsonl: line 2: field 'title'"):
        read_corpus(path)


def test_harness_retrievals_are_budgeted(index):
    src = "def run(q, env):\n    for i in range(13):\n        env.tools.retrieve('capital ' + str(i), 2)\n    return 'x'\n"
    t = Runtime(model=None).run(src, "x", retriever=index)
    assert t.status == "budget_exceeded" and len(t.tool_calls()) == 12
    assert t.tool_calls()[0].result[0]["id"] in {"berlin", "paris", "rome"}
