"""A failed run carries its kind (whale.harness.Failure) from where it failed to the records:
set by the worker or the broker, kept on the Outcome, written in the ledger row and the
trajectory record, and read back, also from records written before the field (their error
text's prefix: "load: ...")."""

from __future__ import annotations

import json

import pytest

from tests.fakes import ScriptedModel
from whale.evaluation import evaluate, outcome_record
from whale.harness import Budget, Failure, Runtime, Sandbox, Trajectory
from whale.harness.sandbox import SandboxKind
from whale.harness.trajectory import read_failure
from whale.runs.ledger import ledger_row
from whale.tasks import load_task

DOES_NOT_PARSE = "def run(question, env:\n    return 'x'\n"
RAISES_ON_IMPORT = "raise RuntimeError('no')\n\ndef run(question, env):\n    return 'x'\n"
RAISES_IN_RUN = "def run(question, env):\n    return str(1 // 0)\n"
ANSWERS = "def run(question, env):\n    return env.llm(question).text\n"


@pytest.fixture(scope="module")
def task():
    return load_task("rg:basic_arithmetic", size=2, seed=0)


def outcomes(sandbox: SandboxKind, source: str, task):
    rt = Runtime(model=ScriptedModel(), sandbox=Sandbox(sandbox), budget=Budget(run_timeout_s=20))
    return evaluate(rt, source, task, task.questions(), workers=2).outcomes


def row_of(outcome) -> dict:
    """A ledger row as the store writes it (JSON and back)."""
    return json.loads(json.dumps({"fingerprint": "f", "harness": "h", "split": "score",
                                  **outcome_record(outcome)}))  # fmt: skip


@pytest.mark.parametrize("source", [DOES_NOT_PARSE, RAISES_ON_IMPORT], ids=["parse", "import"])
def test_a_harness_that_does_not_load_is_load_from_run_to_ledger(sandbox, task, source):
    outs = outcomes(sandbox, source, task)
    assert [o.failure for o in outs] == [Failure.LOAD] * len(outs)
    assert all(o.status == "error" and o.error.startswith("load: ") for o in outs)
    _, back = ledger_row(row_of(outs[0]), "ledger:1")
    assert back.failure is Failure.LOAD


def test_a_harness_that_raises_when_it_runs_is_not_load(sandbox, task):
    outs = outcomes(sandbox, RAISES_IN_RUN, task)
    assert [o.failure for o in outs] == [Failure.HARNESS] * len(outs)
    assert "ZeroDivisionError" in outs[0].error


def test_a_run_that_ends_ok_has_no_failure(sandbox, task):
    outs = outcomes(sandbox, ANSWERS, task)
    assert [(o.status, o.failure) for o in outs] == [("ok", None)] * len(outs)


def test_a_jail_that_does_not_start_is_a_runtime_failure():
    rt = Runtime(model=None)

    def no_jail():
        raise OSError("no jail here")

    rt._take_worker = no_jail
    t = rt.run(ANSWERS, "x")
    assert (t.status, t.failure) == ("crashed", Failure.RUNTIME)


def test_an_old_ledger_row_without_the_field_reads_its_kind_from_the_error_text():
    row = {"fingerprint": "f", "harness": "h", "question_id": "q", "answer": None, "score": 0.0,
           "correct": False, "status": "error", "error": "load: SyntaxError: bad"}  # fmt: skip
    assert ledger_row(row, "ledger:1")[1].failure is Failure.LOAD
    ran = {**row, "error": "harness: Traceback ... ZeroDivisionError"}
    assert ledger_row(ran, "ledger:2")[1].failure is Failure.HARNESS
    slow = {**row, "status": "timeout", "error": "run exceeded 5 s"}
    assert ledger_row(slow, "ledger:3")[1].failure is None


def test_a_new_row_is_read_by_its_field_not_its_text():
    row = {"fingerprint": "f", "harness": "h", "question_id": "q", "answer": None, "score": 0.0,
           "correct": False, "status": "error", "error": "load: looks like a load failure",
           "failure": "harness"}  # fmt: skip
    assert ledger_row(row, "ledger:1")[1].failure is Failure.HARNESS


def test_a_row_with_an_unknown_kind_is_an_error_naming_the_line():
    from whale.records import RecordError

    row = {"fingerprint": "f", "harness": "h", "question_id": "q", "answer": None, "score": 0.0,
           "correct": False, "status": "error", "failure": "weather"}  # fmt: skip
    with pytest.raises(RecordError, match="ledger:7"):
        ledger_row(row, "ledger:7")


def test_a_version_1_trajectory_reads_as_the_current_version_with_its_kind():
    old = Trajectory("q", "h", status="error", error="load: harness does not parse").to_dict()
    del old["failure"]
    old["version"] = 1
    t = Trajectory.from_dict(json.loads(json.dumps(old)))
    assert t.failure is Failure.LOAD and t.version == Trajectory("q", "h").version


def test_a_trajectory_round_trips_its_kind():
    t = Trajectory("q", "h", status="crashed", error="runtime: OSError", failure=Failure.RUNTIME)
    assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_the_error_text_of_every_kind_names_that_kind(sandbox, task):
    """What an old record's reader derives from the text is what a new run records."""
    for source in (DOES_NOT_PARSE, RAISES_ON_IMPORT, RAISES_IN_RUN):
        for o in outcomes(sandbox, source, task):
            assert read_failure({"error": o.error}) is o.failure
