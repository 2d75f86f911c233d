"""The outcome store reads back only what it can trust (issue 8: records a harness can break)."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import SEED, SumTask
from whale.harness import Runtime
from whale.records import RecordError
from whale.runs import OutcomeStore

ECHO = 'def run(question, env):\n    return "\\u2028{}\\u2028"\n'


def score(tmp_path, source, fingerprint="fp", n=3):
    task = SumTask()
    store = OutcomeStore(tmp_path, fingerprint)
    try:
        res = store.evaluate(Runtime(model=ScriptedModel(["7"])), source, task,
                             task.questions()[:n], "score", 2)  # fmt: skip
        return res, store.new_rollouts
    finally:
        store.close()


def test_an_answer_of_line_separators_survives_a_store_round_trip(tmp_path):
    # issue 8: this answer split its ledger record, and the reopened store died on KeyError
    first, paid = score(tmp_path, ECHO)
    assert paid == 3 and first.outcomes[0].answer == "\u2028{}\u2028"
    again, paid_again = score(tmp_path, ECHO)
    assert paid_again == 0 and [o.answer for o in again.outcomes] == ["\u2028{}\u2028"] * 3


def test_outcomes_are_not_reused_under_another_fingerprint(tmp_path):
    score(tmp_path, SEED, fingerprint="solver-a")
    _, paid = score(tmp_path, SEED, fingerprint="solver-b")
    assert paid == 3


def test_a_ledger_row_of_the_wrong_shape_is_an_error_naming_the_line(tmp_path):
    score(tmp_path, SEED)
    with open(tmp_path / "outcomes.jsonl", "a") as f:
        f.write(json.dumps({"fingerprint": "fp", "harness": "h", "question_id": 5}) + "\n")
    with pytest.raises(RecordError, match=r"outcomes\.jsonl:4: not a ledger row"):
        OutcomeStore(tmp_path, "fp")


def test_a_ledger_value_of_the_wrong_type_is_an_error_naming_the_field(tmp_path):
    score(tmp_path, SEED)
    rows = (tmp_path / "outcomes.jsonl").read_text().splitlines()
    row = json.loads(rows[0])
    row["score"] = "1.0"
    (tmp_path / "outcomes.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(RecordError, match=r"outcomes\.jsonl:1: score is '1.0'"):
        OutcomeStore(tmp_path, "fp")


def test_a_ledger_row_without_a_fingerprint_is_refused(tmp_path):
    score(tmp_path, SEED)
    row = json.loads((tmp_path / "outcomes.jsonl").read_text().splitlines()[0])
    del row["fingerprint"]  # as every row of a whale before issue 8
    (tmp_path / "outcomes.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(RecordError, match=r"outcomes\.jsonl:1: .*without an outcome fingerprint"):
        OutcomeStore(tmp_path, "fp")


def test_a_cut_harness_file_is_refused_on_load(tmp_path):
    store = OutcomeStore(tmp_path)
    h = store.save_harness(SEED)
    path = tmp_path / "harnesses" / f"{h}.py"
    path.write_text(SEED[:30])
    with pytest.raises(RecordError, match=f"{h}.py: its content hashes to .*, not {h}"):
        store.harness(h)
    store.close()


def test_saving_a_harness_again_mends_a_cut_copy(tmp_path):
    store = OutcomeStore(tmp_path)
    h = store.save_harness(SEED)
    (tmp_path / "harnesses" / f"{h}.py").write_text(SEED[:30])
    assert store.save_harness(SEED) == h and store.harness(h) == SEED
    store.close()


def test_a_deleted_trajectories_file_is_an_error_not_a_key_error(tmp_path):
    first, _ = score(tmp_path, SEED)
    (h,) = {p.stem for p in (tmp_path / "trajectories").iterdir()}
    (tmp_path / "trajectories" / f"{h}.jsonl").unlink()
    with pytest.raises(RecordError, match=f"trajectories/{h}.jsonl: no trajectory for 3"):
        score(tmp_path, SEED)
