"""Tasks from the user's own files: `jsonl:PATH`, `json:PATH`, `csv:PATH`, `parquet:PATH`.

One record is one question. Read with the standard library (JSON Lines, a JSON array of
objects, CSV with a header row; every CSV value is text) and `pyarrow` for Parquet (installed
with `datasets`; `pip install pyarrow` otherwise). The task's own config (`task.config`):

- `question_field` (default "question"): the question text, the prompt a harness gets;
- `reference_field` (default "answer"): the reference the grader compares with (text, a
  number or a list of them for the built-in graders; anything for a `py:` grader);
- `id_field`: the question id. Unset: the field "id" where the first record has one (then
  every record must), else the record's position (0-based, in the file's order);
- `description`: the task description a proposer reads (a default says "return the answer
  only"); the grader's own line is appended either way;
- `instruction`: text put after every question, after a blank line ("Answer in one word.");
- `grader`: a grader name or table (`whale.tasks.graders`; default "normalized");
- `judge`: the judge model, for `grader = "judge"` only.

The pool is every record, or, where the request's size is smaller, that many records drawn
with the request's seed (kept in the file's order). A malformed file or record is a
`DatasetError` naming the file, the record (JSONL/CSV: its line; JSON: its index; Parquet: its
row) and the field; duplicate ids are refused. A `py:` grader's module is imported here (a
missing module or function is a ConfigError before anything runs).
"""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path
from typing import Any

from whale.config import ConfigError
from whale.tasks.base import Grade, JailedGrading, Question, TaskBase
from whale.tasks.graders import Grader, build_grader, parse_grader
from whale.tasks.pytasks import TaskRequest
from whale.tasks.qa_files import DatasetError

FORMATS = ("jsonl", "json", "csv", "parquet")
CONFIG_KEYS = ("question_field", "reference_field", "id_field", "description", "instruction",
               "grader", "judge")  # fmt: skip
DEFAULT_DESCRIPTION = "Answer each question. Return the answer only, not the working."


class FileTask(TaskBase):
    """Questions from a file, graded by a named grader (`whale.tasks.graders`)."""

    def __init__(self, name: str, description: str, questions: list[Question],
                 grader: Grader) -> None:  # fmt: skip
        self.name, self.description = name, description
        self._questions, self.grader = questions, grader

    def questions(self) -> list[Question]:
        return list(self._questions)

    def grade(self, question: Question, answer: str) -> Grade:
        return self.grader.grade(_text(question), answer, question.reference)

    def expected(self, question: Question) -> str | None:
        ref = question.reference
        if isinstance(ref, str):
            return ref
        if isinstance(ref, list) and all(isinstance(r, str) for r in ref):
            return " | ".join(ref)
        return json.dumps(ref, ensure_ascii=False, default=str)

    def jailed_grading(self, question: Question, answer: str) -> JailedGrading | None:
        return self.grader.jailed(_text(question), answer, question.reference)


def _text(q: Question) -> str:
    """The question as the file has it (the prompt may carry the instruction too)."""
    return str(q.metadata.get("question", q.prompt))


def _read_text(path: Path, encoding: str = "utf-8") -> str:
    try:
        return path.read_text(encoding=encoding)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _jsonl(path: Path) -> list[tuple[str, Any]]:
    out = []
    # split on "\n" only (read_text made "\r\n" one): splitlines() also cuts at U+2028 and
    # U+0085, which JSON writes raw inside strings (json.dumps(..., ensure_ascii=False))
    for n, line in enumerate(_read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((f"line {n}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: line {n}: not valid JSON ({e.msg})") from None
    return out


def _json(path: Path) -> list[tuple[str, Any]]:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a list of records (a JSON array)")
    return [(f"record {i}", r) for i, r in enumerate(data)]


def _csv(path: Path) -> list[tuple[str, Any]]:
    reader = csv.DictReader(io.StringIO(_read_text(path, "utf-8-sig"), newline=""))
    out: list[tuple[str, Any]] = []
    try:
        for row in reader:
            where = f"line {reader.line_num}"
            if None in row:  # more cells than the header names
                raise DatasetError(f"{path}: {where}: more values than the header has columns")
            out.append((where, {k: v for k, v in row.items() if v is not None}))
    except csv.Error as e:
        raise DatasetError(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    if reader.fieldnames is None:
        raise DatasetError(f"{path}: empty (a CSV file needs a header row)")
    return out


def _parquet(path: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    if not path.is_file():
        raise DatasetError(f"{path}: cannot read (no such file)")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow's errors are many; each names the file
        raise DatasetError(f"{path}: not a Parquet file ({type(e).__name__}: {e})") from None
    return [(f"row {i}", r) for i, r in enumerate(rows)]


READERS = {"jsonl": _jsonl, "json": _json, "csv": _csv, "parquet": _parquet}


def _settings(req: TaskRequest) -> dict[str, Any]:
    conf = dict(req.config)
    unknown = sorted(set(conf) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"task {req.id}: unknown task.config field(s) {unknown}; known: "
                          f"{list(CONFIG_KEYS)}", f"task.config.{unknown[0]}")  # fmt: skip
    for key in CONFIG_KEYS[:5]:
        if key in conf and (not isinstance(conf[key], str) or not conf[key].strip()):
            raise ConfigError(f"task.config.{key}: expected a non-empty string (got "
                              f"{conf[key]!r})", f"task.config.{key}")  # fmt: skip
    return conf


def _field(path: Path, where: str, record: Any, key: str) -> Any:
    if not isinstance(record, dict):
        raise DatasetError(f"{path}: {where}: not an object")
    if record.get(key) is None:
        raise DatasetError(f"{path}: {where}: missing field {key!r}")
    return record[key]


def file_task(req: TaskRequest, fmt: str) -> FileTask:
    """The task `FMT:PATH` names, with `req.config` read as the module docstring says."""
    conf = _settings(req)
    settings = parse_grader(conf.get("grader", "normalized"))
    if "judge" in conf and settings.kind != "judge":
        raise ConfigError(f"task.config.judge: only the judge grader reads it (the grader is "
                          f"{settings.name!r})", "task.config.judge")  # fmt: skip
    grader = build_grader(settings, conf.get("judge"))
    path = Path(req.arg).expanduser()
    records = READERS[fmt](path)
    if not records:
        raise DatasetError(f"{path}: no records")
    q_key = conf.get("question_field", "question")
    ref_key = conf.get("reference_field", "answer")
    id_key = conf.get("id_field")
    first = records[0][1]
    if id_key is None and isinstance(first, dict) and "id" in first:
        id_key = "id"
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for i, (where, r) in enumerate(records):
        text = _field(path, where, r, q_key)
        if not isinstance(text, str) or not text.strip():
            what = "empty" if isinstance(text, str) else type(text).__name__
            raise DatasetError(f"{path}: {where}: field {q_key!r} is {what}, not question text")
        ref = _field(path, where, r, ref_key)
        try:
            grader.check_reference(ref)
        except ValueError as e:
            raise DatasetError(f"{path}: {where}: field {ref_key!r} {e}") from None
        qid: Any = i
        if id_key is not None:
            qid = _field(path, where, r, id_key)
            if isinstance(qid, bool) or not isinstance(qid, str | int):
                kind = type(qid).__name__
                raise DatasetError(
                    f"{path}: {where}: field {id_key!r} is {kind}, expected text or an integer"
                )
        qid = str(qid)
        if qid in seen:
            raise DatasetError(f"{path}: {where}: id {qid!r} repeats the id of {seen[qid]}")
        seen[qid] = where
        prompt = text if "instruction" not in conf else f"{text}\n\n{conf['instruction']}"
        questions.append(Question(qid, prompt, ref, {"question": text, "where": where}))
    if req.size < len(questions):
        keep = sorted(random.Random(req.seed).sample(range(len(questions)), req.size))
        questions = [questions[k] for k in keep]
    description = conf.get("description", DEFAULT_DESCRIPTION).strip()
    description = f"{description} Grading: {grader.describe()}."
    return FileTask(f"{fmt}:{path.name}", description, questions, grader)
