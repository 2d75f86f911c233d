import random

import pytest

from whale.records import RecordError
from whale.tasks import EvalAlreadyRead, Question, SealedSplit, SplitOverlap, check_disjoint, split


def q(i, text):
    return Question(id=f"q{i}", prompt=text, reference=None)


def test_split_is_disjoint_and_sized():
    pool = [q(i, f"question number {i}") for i in range(50)]
    s = split(pool, {"dev": 25, "eval": 20}, random.Random(0))
    assert len(s["dev"]) == 25 and len(s["eval"]) == 20
    assert not {x.id for x in s["dev"]} & {x.id for x in s["eval"]}


def test_same_text_different_id_counts_as_overlap():
    with pytest.raises(SplitOverlap, match="q2 .same text as q1"):
        check_disjoint({"dev": [q(1, "What is 2+2?")], "eval": [q(2, "what  is\n2+2")]})


def test_same_id_counts_as_overlap():
    with pytest.raises(SplitOverlap, match="q1 .id in dev and eval"):
        check_disjoint({"dev": [q(1, "a")], "eval": [q(1, "b")]})


def test_split_drops_duplicate_texts_before_drawing():
    pool = [q(i, "same text") for i in range(10)] + [q(100 + i, f"t{i}") for i in range(10)]
    s = split(pool, {"a": 5, "b": 6}, random.Random(1))
    check_disjoint(s)


def test_split_refuses_a_pool_too_small():
    with pytest.raises(ValueError, match="pool has 3"):
        split([q(i, f"x{i}") for i in range(3)], {"a": 2, "b": 2}, random.Random(0))


def test_a_sealed_split_is_not_reopened_for_other_questions(tmp_path):
    # issue 8: resumed with another seed or split size, the same harnesses read other questions
    pool = [q(i, f"question number {i}") for i in range(20)]
    SealedSplit(pool[:5], tmp_path / "eval_read.json").open("final", ["a", "b"])
    other = SealedSplit(pool[5:10], tmp_path / "eval_read.json")
    with pytest.raises(EvalAlreadyRead, match="with other questions"):
        other.open("final", ["a", "b"])


def test_a_cut_eval_read_record_is_an_error_naming_it(tmp_path):
    pool = [q(i, f"question number {i}") for i in range(5)]
    s = SealedSplit(pool, tmp_path / "eval_read.json")
    s.open("final", ["a"])
    (tmp_path / "eval_read.json").write_text('{"purpose": "fin')
    with pytest.raises(RecordError, match=r"eval_read\.json: not valid JSON"):
        s.open("final", ["a"])
