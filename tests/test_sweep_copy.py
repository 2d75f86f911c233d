"""Stagewise after the sweep starts from a copy of the chosen point's run
(whale.schedule.sweep_copy): the copy names its own folder, reads nothing of the sweep's score,
shows the phases a fresh run shows, and a kill while copying leaves the tables readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from whale.records import JsonlWriter, read_jsonl
from whale.schedule.sweep_copy import stagewise_from_sweep

POINT = "sweep/E0.25-I1/stagewise"
SWEPT = {"chosen": [0.25, 1], "points": [{"epochs": 0.25, "iters": 1, "dir": POINT}]}


@pytest.mark.parametrize("case", ["relative-then-absolute", "non-ascii"])
def test_the_copy_s_adapter_paths_name_its_own_folder(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    if case == "relative-then-absolute":  # `--out runs/x`, later `--resume /abs/runs/x`
        written, resumed = Path("runs/x"), tmp_path / "runs" / "x"
    else:  # JSONL is ASCII-escaped: "é" is stored as \u00e9
        written = resumed = tmp_path / "runs" / "caf\u00e9"
    src = written / POINT
    (src / "weight" / "adapters" / "step_0000").mkdir(parents=True)
    w = JsonlWriter(src / "weight" / "steps.jsonl")
    w.write({"step": 0, "adapter_path": str(src / "weight/adapters/step_0000")})
    w.close()
    stagewise_from_sweep(resumed, SWEPT, lambda m: None)
    (row,) = read_jsonl(resumed / "stagewise" / "weight" / "steps.jsonl")
    assert row["adapter_path"] == str(resumed / "stagewise" / "weight/adapters/step_0000")


def test_a_path_like_answer_in_the_ledger_is_not_rewritten(tmp_path):
    # The ledger and trajectories hold what harnesses wrote: never edited by the copy.
    src = tmp_path / POINT
    src.mkdir(parents=True)
    row = {"fingerprint": "f", "harness": "h", "question_id": "q", "kind": "harness_score",
           "answer": str(src / "x")}
    w = JsonlWriter(src / "outcomes.jsonl")
    w.write(row)
    w.close()
    stagewise_from_sweep(tmp_path, SWEPT, lambda m: None)
    assert read_jsonl(tmp_path / "stagewise" / "outcomes.jsonl") == [row]


def test_a_message_quoting_a_path_and_an_archived_trajectory_are_left_as_they_are(tmp_path):
    src = tmp_path / POINT
    (src / "harness" / "archive" / "c0001").mkdir(parents=True)
    ended = f"failed: RecordError: {src / 'harness' / 'x'}"
    w = JsonlWriter(src / "harness" / "sessions.jsonl")
    w.write({"ended": ended})
    w.close()
    traj = {"answer": str(src / "y")}
    w = JsonlWriter(src / "harness" / "archive" / "c0001" / "trajectories.jsonl")
    w.write(traj)
    w.close()
    stagewise_from_sweep(tmp_path, SWEPT, lambda m: None)
    dst = tmp_path / "stagewise" / "harness"
    assert read_jsonl(dst / "sessions.jsonl") == [{"ended": ended}]
    assert read_jsonl(dst / "archive" / "c0001" / "trajectories.jsonl") == [traj]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from tests.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def stagewise(root, tiny, reads_on):
    """A stagewise run (E*, I*) = (0.25, 1) on the tiny model; without reads it is scored once
    on validation after its run, as `_one_schedule` scores a sweep point."""
    from transformers import AutoTokenizer

    from tests.fakes import ScriptedModel
    from tests.test_schedule import EDIT, SEED, EvenTask, settings
    from whale.harness import RuntimeConfig
    from whale.revise.loop import LoopSettings
    from whale.revise.operator import ReviseOperator
    from whale.revise.proposer import Proposer, ProposerConfig
    from whale.runs import OutcomeStore
    from whale.schedule.loop import Cotrain, Reads, ScheduleSettings, no_read, score_split
    from whale.train.rsft import Solver, WeightPhase, trainer_factory
    from whale.train.serving import InProcessServing

    task = EvenTask()
    qs = task.questions()
    pool, held, val = qs[:8], qs[16:19], qs[19:22]
    store = OutcomeStore(root, "fp-test")
    serving = InProcessServing(tiny, alias="tiny", threads=1)
    solver = Solver(serving, "fp-test", RuntimeConfig(sandbox="auto", warm=0))
    rs = settings()
    weights = WeightPhase(root / "weight", task, pool, store, solver, rs,
                          trainer_factory(tiny, rs, 0),
                          lambda: AutoTokenizer.from_pretrained(tiny), seed=0, workers=2)  # fmt: skip
    op = ReviseOperator(root / "harness", pool, pool[:4], store,
                        Proposer(ScriptedModel([EDIT]), ProposerConfig(grammar="off")),
                        LoopSettings(rounds=1, g=1, workers=2, feedback=2))  # fmt: skip
    s = ScheduleSettings("stagewise", rollouts=16, stagewise=(0.25, 1))
    reads = Reads(root, "stagewise", task, store, solver, 2, held, val) if reads_on else None
    run = Cotrain(root, "stagewise", s, task, SEED, store, solver, weights, op, 2,
                  reads or no_read)  # fmt: skip
    try:
        out = run.run()
        if not reads_on:
            score_split(store, solver, task, store.harness(out["harness"]), val, 2,
                        {"schedule": "stagewise", "cycle": 1, "phase": "eval",
                         "kind": "validation"})  # fmt: skip
    finally:
        run.close()
        if reads:
            reads.close()
        weights.close()
        store.close()
        serving.close()


@pytest.mark.slow
def test_a_copied_stagewise_has_the_phase_rows_a_fresh_one_has(tmp_path, tiny):
    # The ledger is keyed by (fingerprint, harness, question): the sweep's validation score,
    # left in the copy, would answer stagewise's last read under the sweep's tags.
    from whale.schedule.curves import phase_table

    stagewise(tmp_path / "fresh" / "stagewise", tiny, reads_on=True)
    run_dir = tmp_path / "run"
    stagewise(run_dir / POINT, tiny, reads_on=False)
    stagewise_from_sweep(run_dir, SWEPT, lambda m: None)
    stagewise(run_dir / "stagewise", tiny, reads_on=True)

    def shape(d):
        return [(p["cycle"], p["phase"], p["rollouts"], p["eval_rollouts"],
                 p["validation_rollouts"], p["cum_rollouts"]) for p in phase_table(d)]  # fmt: skip

    assert shape(run_dir) == shape(tmp_path / "fresh")


@pytest.mark.slow
def test_a_kill_while_copying_leaves_the_tables_readable(tmp_path, tiny, monkeypatch):
    import whale.schedule.sweep_copy as sweep_copy
    from whale.schedule.curves import curve_rows

    run_dir = tmp_path / "run"
    stagewise(run_dir / POINT, tiny, reads_on=False)

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_copy, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        stagewise_from_sweep(run_dir, SWEPT, lambda m: None)
    from whale.records import RecordError

    with pytest.raises(RecordError, match="no schedule folder"):  # the half copy is none
        curve_rows(run_dir)  # `whale experiment table` before the resume
    monkeypatch.undo()
    stagewise_from_sweep(run_dir, SWEPT, lambda m: None)  # the resume makes it whole
    assert (run_dir / "stagewise" / "outcomes.jsonl").is_file()
