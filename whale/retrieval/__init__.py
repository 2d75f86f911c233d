"""Retrieval: BM25 over passage corpora (bm25s)."""

from whale.retrieval.bm25 import (
    BM25Index,
    IndexMismatch,
    Passage,
    cached_index,
    corpus_hash,
    read_corpus,
)

__all__ = ["BM25Index", "IndexMismatch", "Passage", "cached_index", "corpus_hash", "read_corpus"]
