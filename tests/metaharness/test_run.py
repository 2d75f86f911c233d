"""`run_search`: the whole command as a library call, with scripted models."""

import pytest

from tests.fakes import ScriptedModel
from tests.metaharness.test_loop import GOOD
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.metaharness.run import SearchConfig, run_search, search_splits
from whale.runs import ResumeMismatch


def go(tmp_path, task, **kw):
    cfg = SearchConfig(iterations=2, m=1, dev=6, eval=6, workers=3, **kw)
    return run_search(cfg, tmp_path, task, SEED, prose_solver(), ScriptedModel([GOOD]))


def test_a_search_run_improves_and_reads_the_eval_split_once(tmp_path):
    result, meta = go(tmp_path, SumTask(n=12))
    assert meta["seed_eval"]["accuracy"] == 0.0 and meta["final_eval"]["accuracy"] == 1.0
    assert (tmp_path / "eval_read.json").exists() and (tmp_path / "summary.md").exists()


def test_no_eval_question_appears_anywhere_under_the_archive(tmp_path):
    task = SumTask(n=12)
    go(tmp_path, task)
    _, held = search_splits(task, SearchConfig(dev=6, eval=6))
    text = "".join(p.read_text() for p in (tmp_path / "archive").rglob("*") if p.is_file())
    text += "".join(p.read_text() for p in (tmp_path / "sessions").rglob("*") if p.is_file())
    for q in held:
        assert f'"{q.id}"' not in text and q.prompt not in text
    ledger = (tmp_path / "outcomes.jsonl").read_text()
    assert all(q.id in ledger for q in held)  # the eval outcomes are in the run's ledger


def test_a_resume_may_not_change_the_experiment(tmp_path):
    task = SumTask(n=12)
    go(tmp_path, task)
    with pytest.raises(ResumeMismatch, match="seed") as e:
        go(tmp_path, task, seed=1)
    assert e.value.field == "seed"


def test_a_finished_resume_pays_nothing(tmp_path):
    task = SumTask(n=12)
    go(tmp_path, task)
    _, meta = go(tmp_path, task)
    assert meta["rollouts paid this invocation"] == 0
