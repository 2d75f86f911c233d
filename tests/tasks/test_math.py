import json

import pytest

from whale.tasks import UnknownTask, load_task


def test_gsm8k_format(tmp_path):
    p = tmp_path / "gsm8k.jsonl"
    p.write_text(
        json.dumps(
            {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}
        )
        + "\n"
    )
    task = load_task(f"math:{p}")
    (q,) = task.questions()
    assert q.reference == "7" and task.grade(q, "7").correct and task.grade(q, "\\boxed{7}").correct
    assert not task.grade(q, "8").correct


def test_math_format_reads_the_boxed_answer(tmp_path):
    p = tmp_path / "math.jsonl"
    p.write_text(
        json.dumps({"problem": "What is 1/2 + 1/4?", "solution": "We get $\\boxed{\\frac{3}{4}}$."})
        + "\n"
    )
    task = load_task(f"math:{p}")
    assert task.grade(task.questions()[0], "0.75").correct


def test_math_record_without_an_answer_is_named(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"problem": "x", "solution": "no box here"}) + "\n")
    with pytest.raises(UnknownTask, match=r"bad.jsonl: record 0: 'solution' has no"):
        load_task(f"math:{p}")


def test_champ_problems_load():
    task = load_task("champ")
    qs = task.questions()
    assert len(qs) == 270 and task.grade(qs[0], qs[0].reference).correct
