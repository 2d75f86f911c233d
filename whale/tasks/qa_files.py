"""Loaders for the official multi-hop QA file formats: HotpotQA, MuSiQue, 2WikiMultihopQA.

None of these datasets can be downloaded here; the loaders are tested on small files in the
exact formats (tests/tasks/test_qa_files.py writes them). Each builds its question pool and its
corpus from the dataset's own paragraphs (HotpotQA fullwiki: from a Wikipedia abstracts JSONL
of {id, title, text} given by path). A malformed record is an error naming the file, the
record and the field; a gold passage missing from the corpus is an error at load time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from whale.retrieval import Passage, read_corpus
from whale.tasks.base import Question
from whale.tasks.mhqa import MultiHopTask

_QA = (
    "Answer the question using the passages that env.tools.retrieve(query, k) returns "
    "(dicts with id, title, text, score). Return the short answer only."
)


class DatasetError(ValueError):
    pass


def _load(path: str | Path) -> Any:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"{p}: cannot read ({e.strerror})") from None
    try:
        if p.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{p}: not valid JSON (line {e.lineno}: {e.msg})") from None


def _field(path: Any, i: int, r: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(r, dict):
        raise DatasetError(f"{path}: record {i}: not an object")
    if key not in r:
        raise DatasetError(f"{path}: record {i}: missing field {key!r}")
    if not isinstance(r[key], kind):
        raise DatasetError(f"{path}: record {i}: field {key!r} is {type(r[key]).__name__}")
    return r[key]


def _records(path: str | Path) -> list[Any]:
    data = _load(path)
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a list of records")
    return data


class _Corpus:
    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], str] = {}
        self.passages: list[Passage] = []
        self.by_title: dict[str, str] = {}

    def add(self, title: str, text: str) -> str:
        key = (title, text)
        if key not in self.by_key:
            pid = f"p{len(self.passages)}"
            self.by_key[key] = pid
            self.passages.append(Passage(pid, title, text))
            self.by_title.setdefault(title, pid)
        return self.by_key[key]


def _title_context(path: Any, name: str, corpus: _Corpus, i: int, r: dict[str, Any]) -> None:
    for j, item in enumerate(_field(path, i, r, "context", list)):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
        ):
            raise DatasetError(f"{path}: record {i}: context[{j}] is not [title, [sentences]]")
        corpus.add(item[0], " ".join(str(s) for s in item[1]))


def _supporting_titles(path: Any, i: int, r: dict[str, Any]) -> list[str]:
    titles = []
    for j, sf in enumerate(_field(path, i, r, "supporting_facts", list)):
        if not (isinstance(sf, list) and sf and isinstance(sf[0], str)):
            raise DatasetError(f"{path}: record {i}: supporting_facts[{j}] is not [title, sent_id]")
        if sf[0] not in titles:
            titles.append(sf[0])
    return titles


def _title_format(path: str | Path, name: str, abstracts: str | Path | None) -> MultiHopTask:
    """HotpotQA (distractor / fullwiki) and 2WikiMultihopQA share this layout."""
    records = _records(path)
    corpus = _Corpus()
    if abstracts is not None:
        for p in read_corpus(abstracts):
            corpus.add(p.title, p.text)
    questions = []
    for i, r in enumerate(records):
        qid = str(_field(path, i, r, "_id", (str, int)))
        question = _field(path, i, r, "question", str)
        answer = _field(path, i, r, "answer", str)
        if abstracts is None or "context" in r:
            _title_context(path, name, corpus, i, r)
        gold = []
        for title in _supporting_titles(path, i, r):
            if title not in corpus.by_title:
                raise DatasetError(
                    f"{path}: record {i}: supporting title {title!r} is not in the corpus"
                )
            gold.append(corpus.by_title[title])
        ref = {"answer": answer, "supporting": gold, "type": r.get("type"), "hops": len(gold)}
        questions.append(Question(f"{name}:{qid}", question, ref, {"type": r.get("type")}))
    return MultiHopTask(name, _QA, questions, corpus.passages)


def hotpotqa(path: str | Path, abstracts: str | Path | None = None) -> MultiHopTask:
    """HotpotQA JSON (list of {_id, question, answer, supporting_facts, context, type, level});
    fullwiki files may omit `context` and need `abstracts`."""
    return _title_format(path, "hotpotqa", abstracts)


def twowiki(path: str | Path) -> MultiHopTask:
    """2WikiMultihopQA JSON (list of {_id, question, answer, supporting_facts, context, type})."""
    return _title_format(path, "2wiki", None)


def musique(path: str | Path) -> MultiHopTask:
    """MuSiQue JSONL ({id, question, answer, answer_aliases, answerable, paragraphs: [{idx,
    title, paragraph_text, is_supporting}]}). Unanswerable records are skipped."""
    corpus = _Corpus()
    questions = []
    for i, r in enumerate(_records(path)):
        qid = str(_field(path, i, r, "id", str))
        question = _field(path, i, r, "question", str)
        answer = _field(path, i, r, "answer", str)
        gold = []
        for j, para in enumerate(_field(path, i, r, "paragraphs", list)):
            title = _field(f"{path}: record {i} paragraphs", j, para, "title", str)
            text = _field(f"{path}: record {i} paragraphs", j, para, "paragraph_text", str)
            pid = corpus.add(title, text)
            if para.get("is_supporting"):
                gold.append(pid)
        if r.get("answerable", True) is False:
            continue
        aliases = [a for a in r.get("answer_aliases", []) if isinstance(a, str)]
        ref = {"answer": answer, "aliases": aliases, "supporting": gold, "hops": len(gold)}
        questions.append(Question(f"musique:{qid}", question, ref))
    return MultiHopTask("musique", _QA, questions, corpus.passages)
