"""Tasks from the user's files (issue 23): `jsonl:`, `json:`, `csv:` and `parquet:` load the same
questions; the task's settings (fields, id, instruction, description, grader) are honored; a
malformed file or record is named with its file, record and field; size and seed draw the pool;
and `whale eval --task jsonl:PATH` runs end to end with a user grader out of process."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.servers import StubServer
from whale import grading
from whale.cli import app
from whale.config import ConfigError
from whale.evaluation import read_jsonl
from whale.tasks import Grade, TaskBase, UnknownTask, load_task

ROWS = [
    {"id": "q1", "question": "What is 2 + 2?", "answer": "4"},
    {"id": "q2", "question": "Capital of France?", "answer": "Paris"},
    {"id": "q3", "question": "Largest planet?", "answer": "Jupiter"},
]


def write(path: Path, rows: list[dict]) -> Path:
    fmt = path.suffix[1:]
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_each_format_loads_the_same_questions(tmp_path, fmt):
    task = load_task(f"{fmt}:{write(tmp_path / f'd.{fmt}', ROWS)}")
    assert isinstance(task, TaskBase) and task.name == f"{fmt}:d.{fmt}"
    qs = task.questions()
    assert [(q.id, q.prompt, q.reference) for q in qs] == [
        (r["id"], r["question"], r["answer"]) for r in ROWS
    ]
    assert task.expected(qs[1]) == "Paris"
    assert task.grade(qs[1], " paris. ") == Grade(1.0, True, "normalized: match")
    assert not task.grade(qs[1], "Lyon").correct
    assert task.jailed_grading(qs[1], "Paris") is None  # normalized grades in process


def test_the_field_names_are_settings(tmp_path):
    rows = [{"key": 7, "prompt": "Two plus two?", "gold": ["4", "four"]}]
    task = load_task(f"jsonl:{write(tmp_path / 'd.jsonl', rows)}", config={
        "question_field": "prompt", "reference_field": "gold", "id_field": "key"})  # fmt: skip
    (q,) = task.questions()
    assert (q.id, q.prompt, q.reference) == ("7", "Two plus two?", ["4", "four"])
    assert task.grade(q, "Four").correct and task.expected(q) == "4 | four"


def test_without_an_id_field_the_id_is_the_records_position(tmp_path):
    rows = [{"question": f"q{i}?", "answer": str(i)} for i in range(3)]
    task = load_task(f"json:{write(tmp_path / 'd.json', rows)}")
    assert [q.id for q in task.questions()] == ["0", "1", "2"]


def test_the_instruction_follows_each_question_and_the_description_is_the_users(tmp_path):
    task = load_task(f"jsonl:{write(tmp_path / 'd.jsonl', ROWS)}", config={
        "instruction": "Answer in one word.", "description": "Trivia about the world.",
        "grader": "exact"})  # fmt: skip
    q = task.questions()[0]
    assert q.prompt == "What is 2 + 2?\n\nAnswer in one word."
    assert task.description.startswith("Trivia about the world. Grading: ")
    assert "exactly" in task.description  # the grader's own line, for the proposer


def test_the_grader_setting_chooses_the_grader(tmp_path):
    rows = [{"question": "pi?", "answer": 3.14159}]
    path = write(tmp_path / "d.jsonl", rows)
    strict = load_task(f"jsonl:{path}", config={"grader": "numeric"})
    loose = load_task(f"jsonl:{path}", config={"grader": {"name": "numeric", "tolerance": 0.01}})
    q = strict.questions()[0]
    assert not strict.grade(q, "3.14").correct and loose.grade(q, "3.14").correct


def test_a_regex_task_is_graded_in_the_jail(tmp_path):
    rows = [{"question": "A number in the forties?", "answer": r"4\d"}]
    task = load_task(f"jsonl:{write(tmp_path / 'd.jsonl', rows)}", config={"grader": "regex"})
    q = task.questions()[0]
    assert task.jailed_grading(q, "42") is not None
    assert grading.grade(task, q, "42", "bwrap") == Grade(1.0, True)
    assert not grading.grade(task, q, "52", "bwrap").correct


def test_size_and_seed_draw_the_pool_in_file_order(tmp_path):
    rows = [{"question": f"question {i}?", "answer": str(i)} for i in range(50)]
    path = write(tmp_path / "d.jsonl", rows)
    a = [q.id for q in load_task(f"jsonl:{path}", size=10, seed=1).questions()]
    again = [q.id for q in load_task(f"jsonl:{path}", size=10, seed=1).questions()]
    other = [q.id for q in load_task(f"jsonl:{path}", size=10, seed=2).questions()]
    assert len(a) == 10 and a == again and a != other
    assert [int(i) for i in a] == sorted(int(i) for i in a)
    assert len(load_task(f"jsonl:{path}", size=500).questions()) == 50  # all there is


# --- malformed files and records are named -------------------------------------------------


def _refused(tmp_path, name: str, text: str, config=None) -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UnknownTask) as e:
        load_task(f"{path.suffix[1:]}:{path}", config=config)
    assert str(path) in str(e.value)
    return str(e.value)


def test_a_bad_json_line_is_named(tmp_path):
    msg = _refused(tmp_path, "d.jsonl", '{"question": "a", "answer": "b"}\n\n{"question": \n')
    assert "line 3: not valid JSON" in msg


def test_a_missing_field_names_the_record_and_the_field(tmp_path):
    text = '{"question": "a", "answer": "b"}\n{"question": "c"}\n'
    assert "line 2: missing field 'answer'" in _refused(tmp_path, "d.jsonl", text)
    assert "record 1: missing field 'prompt'" in _refused(
        tmp_path, "d.json", '[{"prompt": "a", "answer": 1}, {"answer": 2}]',
        {"question_field": "prompt"})  # fmt: skip


@pytest.mark.parametrize(
    "record, message",
    [('{"question": 3, "answer": "b"}', "field 'question' is int"),
     ('{"question": " ", "answer": "b"}', "field 'question' is empty"),
     ('{"question": "a", "answer": {"x": 1}}', "field 'answer' is dict"),
     ('{"question": "a", "answer": ""}', "field 'answer' is empty"),
     ('["question", "answer"]', "not an object"),
     ('{"id": true, "question": "a", "answer": "b"}', "field 'id' is bool")],
)  # fmt: skip
def test_a_record_of_the_wrong_shape_is_named(tmp_path, record, message):
    assert f"line 1: {message}" in _refused(tmp_path, "d.jsonl", record + "\n")


def test_a_reference_the_grader_cannot_read_is_named(tmp_path):
    msg = _refused(tmp_path, "d.jsonl", '{"question": "a", "answer": "forty"}\n',
                   {"grader": "numeric"})  # fmt: skip
    assert "line 1: field 'answer' is not a number" in msg


def test_an_id_missing_from_a_later_record_and_a_repeated_id_are_named(tmp_path):
    text = '{"id": 1, "question": "a", "answer": "b"}\n{"question": "c", "answer": "d"}\n'
    assert "line 2: missing field 'id'" in _refused(tmp_path, "d.jsonl", text)
    text = '{"id": 1, "question": "a", "answer": "b"}\n{"id": 1, "question": "c", "answer": "d"}\n'
    assert "line 2: id '1' repeats the id of line 1" in _refused(tmp_path, "e.jsonl", text)


def test_a_bad_csv_is_named(tmp_path):
    assert "line 3: more values than the header" in _refused(
        tmp_path, "d.csv", "question,answer\na,b\nc,d,e\n")  # fmt: skip
    assert "empty" in _refused(tmp_path, "e.csv", "")


def test_a_json_file_must_hold_a_list_and_parquet_must_be_parquet(tmp_path):
    assert "expected a list of records" in _refused(tmp_path, "d.json", '{"question": "a"}')
    pytest.importorskip("pyarrow")
    assert "not a Parquet file" in _refused(tmp_path, "d.parquet", "not parquet at all")


def test_a_missing_file_and_an_empty_file_are_named(tmp_path):
    with pytest.raises(UnknownTask, match="cannot read"):
        load_task(f"jsonl:{tmp_path / 'nope.jsonl'}")
    assert "no records" in _refused(tmp_path, "d.jsonl", "\n\n")


@pytest.mark.parametrize(
    "config, field",
    [({"question": "q"}, "task.config.question"),
     ({"question_field": 3}, "task.config.question_field"),
     ({"judge": "some-model"}, "task.config.judge"),
     ({"grader": "nope"}, "task.config.grader"),
     ({"grader": "py:no_such_grader_module_q:score"}, "task.config.grader")],
)  # fmt: skip
def test_a_bad_setting_is_a_config_error_naming_its_field(tmp_path, config, field):
    with pytest.raises(ConfigError) as e:
        load_task(f"jsonl:{write(tmp_path / 'd.jsonl', ROWS)}", config=config)
    assert e.value.field == field


# --- the whole way: whale eval ------------------------------------------------------------


def test_whale_eval_runs_a_jsonl_task_with_a_user_grader_out_of_process(tmp_path):
    (tmp_path / "my_grader.py").write_text(
        "def score(question, answer, reference):\n"
        "    if answer == 'Paris':\n        raise RuntimeError('no')\n"
        "    return answer == reference\n"
    )
    data = write(tmp_path / "d.jsonl", ROWS)
    (tmp_path / "c.toml").write_text(
        f'n = 3\n[task]\nid = "jsonl:{data}"\n[task.config.grader]\n'
        f'name = "py:{tmp_path / "my_grader.py"}:score"\ntimeout_s = 5\n'
    )
    with StubServer([("ok", "Answer: 4"), ("ok", "Answer: Paris"), ("ok", "Answer: Mars")]) as s:
        r = CliRunner().invoke(app, [
            "eval", "--config", str(tmp_path / "c.toml"), "--harness", "single_call",
            "--model", f"stub@{s.base_url}", "--out", str(tmp_path / "run"), "--no-cache",
            "--json", "--workers", "1"], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["status"] == {"ok": 3} and summary["accuracy"] == pytest.approx(1 / 3)
    rows = {row["answer"]: row for row in read_jsonl(tmp_path / "run" / "outcomes.jsonl")}
    assert set(rows) == {"4", "Paris", "Mars"}
    assert rows["4"]["correct"] is True
    assert rows["Paris"]["feedback"] == f"{grading.SCORER_ERROR}: RuntimeError"
    assert rows["Mars"]["correct"] is False and rows["Mars"]["feedback"] == ""


def test_whale_tasks_lists_the_file_and_python_doors_as_built_in():
    r = CliRunner().invoke(app, ["tasks"])
    lines = {ln.split()[0]: ln for ln in r.output.splitlines()}
    for pattern in ("jsonl:PATH", "json:PATH", "csv:PATH", "parquet:PATH", "py:TARGET"):
        assert lines[pattern].split()[1] == "built-in"
