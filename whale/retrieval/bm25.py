"""BM25 over a passage corpus, with bm25s (numba backend where installed, English stemming).

An index is a folder: the bm25s arrays (loaded with mmap), `passages.jsonl` (id, title, text),
and `meta.json` with the corpus hash. Loading an index for a corpus with another hash is
refused, so an index never silently answers for the wrong passages. A harness reaches it as
`env.tools.retrieve(query, k)`, counted against the retrieval budget by the broker.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

INDEX_VERSION = 2  # 2: passages.offsets.npy beside passages.jsonl
_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern


@functools.cache
def _stopwords() -> frozenset[str]:
    from bm25s.tokenization import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


class IndexMismatch(ValueError):
    pass


class PassageFile(Sequence[Passage]):
    """The passages of a saved index, read on demand: the JSONL file is memory-mapped and a
    saved array of line offsets finds passage i, so loading costs nothing per passage."""

    def __init__(self, jsonl: Path, offsets: Path) -> None:
        import mmap

        import numpy as np

        self._offsets = np.load(offsets, mmap_mode="r")
        self._f = open(jsonl, "rb")
        self._map = (
            mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if self._offsets.size else b""
        )

    def __len__(self) -> int:
        return int(self._offsets.size)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        start = int(self._offsets[i])
        end = self._map.find(b"\n", start)
        r = json.loads(self._map[start : end if end >= 0 else len(self._map)])
        return Passage(r["id"], r["title"], r["text"])


def corpus_hash(passages: Iterable[Passage]) -> str:
    h = hashlib.sha256()
    for p in passages:
        h.update(json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()[:32]


def read_corpus(path: str | Path) -> list[Passage]:
    """A JSONL corpus of {id, title, text}; a bad record is an error naming file, line, field."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: not JSON ({e.msg})") from None
            for key in ("id", "title", "text"):
                if not isinstance(r.get(key), str):
                    raise ValueError(f"{path}: line {n}: field {key!r} missing or not a string")
            out.append(Passage(r["id"], r["title"], r["text"]))
    return out


def _stemmer() -> Any:
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("english")


def _backend() -> str:
    try:
        import numba  # noqa: F401

        return "numba"
    except ImportError:
        return "numpy"


class BM25Index:
    def __init__(self, retriever: Any, passages: Sequence[Passage], chash: str) -> None:
        self._bm25 = retriever
        self.passages = passages
        self.corpus_hash = chash
        self._stem = _stemmer()
        self._stop = _stopwords()

    def __len__(self) -> int:
        return len(self.passages)

    @classmethod
    def build(
        cls, passages: Sequence[Passage], progress: Callable[[int, int], None] | None = None
    ) -> BM25Index:
        import bm25s

        stem = _stemmer()
        texts = [f"{p.title}\n{p.text}" for p in passages]
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False)
        if progress is not None:
            progress(1, 2)
        retriever = bm25s.BM25(backend=_backend())
        retriever.index(tokens, show_progress=False)
        if progress is not None:
            progress(2, 2)
        return cls(retriever, passages, corpus_hash(passages))

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._bm25.save(str(d / "bm25"), show_progress=False)
        import numpy as np

        offsets = np.zeros(len(self.passages), dtype=np.int64)
        with open(d / "passages.jsonl", "wb") as f:
            for i, p in enumerate(self.passages):
                offsets[i] = f.tell()
                f.write(json.dumps(asdict(p), ensure_ascii=False).encode() + b"\n")
        np.save(d / "passages.offsets.npy", offsets)
        meta = {"version": INDEX_VERSION, "corpus_hash": self.corpus_hash, "n": len(self)}
        (d / "meta.json").write_text(json.dumps(meta))
        return d

    @classmethod
    def load(
        cls,
        directory: str | Path,
        expect_hash: str | None = None,
        passages: Sequence[Passage] | None = None,
    ) -> BM25Index:
        """Load with mmap. `expect_hash` (the corpus the caller means) must match the index's."""
        import bm25s

        d = Path(directory)
        meta = json.loads((d / "meta.json").read_text())
        if meta.get("version") != INDEX_VERSION:
            raise IndexMismatch(
                f"{d}: index version {meta.get('version')}, expected {INDEX_VERSION}"
            )
        if expect_hash is not None and meta["corpus_hash"] != expect_hash:
            raise IndexMismatch(
                f"{d} was built from a different corpus (hash {meta['corpus_hash']}, "
                f"this corpus {expect_hash}): rebuild it with `whale index build`"
            )
        retriever = bm25s.BM25.load(str(d / "bm25"), mmap=True, load_vocab=True)
        retriever.backend = _backend()
        if passages is None:
            passages = PassageFile(d / "passages.jsonl", d / "passages.offsets.npy")
        return cls(retriever, passages, meta["corpus_hash"])

    def query_tokens(self, query: str) -> list[str]:
        """The query as bm25s tokenizes a corpus (lower case, \\w\\w+ words, English
        stopwords out, stemmed), keeping only terms the index knows. Done here rather than by
        bm25s.tokenize, whose per-call overhead dominated single-query latency."""
        words = [w for w in _TOKEN.findall(query.lower()) if w not in self._stop]
        vocab = self._bm25.vocab_dict
        return [t for t in self._stem.stemWords(words) if t in vocab]

    def retrieve(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """Top-k passages as {id, title, text, score}; an empty query returns nothing."""
        tokens = self.query_tokens(query)
        if not tokens:
            return []
        k = max(1, min(k, len(self.passages)))
        docs, scores = self._bm25.retrieve(
            [tokens], k=k, show_progress=False, n_threads=1, backend_selection=self._bm25.backend
        )
        out = []
        for i, s in zip(docs[0], scores[0], strict=True):
            if float(s) <= 0:
                continue
            p = self.passages[int(i)]
            out.append({"id": p.id, "title": p.title, "text": p.text, "score": round(float(s), 4)})
        return out


def cached_index(passages: Sequence[Passage], cache: str | Path | None = None) -> BM25Index:
    """The index of `passages`, built once and kept under ~/.cache/whale/indexes/vN/<hash>."""
    chash = corpus_hash(passages)
    root = Path(cache or os.environ.get("WHALE_CACHE") or Path.home() / ".cache" / "whale")
    d = root / "indexes" / f"v{INDEX_VERSION}" / chash  # an older layout is never reused
    if (d / "meta.json").exists():
        return BM25Index.load(d, expect_hash=chash, passages=passages)
    index = BM25Index.build(passages)
    tmp = d.with_name(f"{chash}.tmp{os.getpid()}")
    index.save(tmp)
    try:
        os.replace(tmp, d)
    except OSError:  # another process won the race; use its copy
        pass
    return index
