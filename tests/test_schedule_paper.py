"""WHALE's schedules as the paper runs them (issue 21), with fakes for the weight phase, the
harness operator, the store and the solver: stagewise is one weight stage of E* epochs and one
harness stage of I* iterations; the validation split is disjoint from the others and no
switching rule reads it; the sweep picks (E*, I*) by validation accuracy; weight steps are finer
than the patience window."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.revise.conftest import SumTask
from whale import config as cfgmod
from whale.cotrain import CotrainConfig, cotrain_splits
from whale.operators import OperatorRecord
from whale.records import read_jsonl
from whale.schedule import Cotrain, Reads, ScheduleSettings
from whale.tasks import check_disjoint
from whale.tasks.base import normalize_prompt
from whale.train.patience import WeightPatience
from whale.train.rsft import RsftSettings, WeightStep

SEED = "def run(question, env):\n    return '1'\n"


class Log(list):
    """What happened, in order: ("weight", step), ("harness", iterations), ("read", split)."""


class FakeRuntime:
    def close(self):
        pass


class FakeSolver:
    digest = None
    adapter = None
    fingerprint = "fp"

    def runtime(self, workers, temperature=None, seed=None):
        return FakeRuntime()


class FakeResult:
    def __init__(self, accuracy, n):
        self.accuracy, self.score, self.n = accuracy, accuracy, n

    def summary(self):
        return {"truncation_rate": 0.0, "format_failures": 0}


class FakeStore:
    """Harness sources by hash; `evaluate` logs the split it reads and answers `accuracy[split]`."""

    def __init__(self, log, accuracy):
        self.log, self.accuracy, self.saved = log, accuracy, {}

    def save_harness(self, source):
        h = hashlib.sha256(source.encode()).hexdigest()[:12]
        self.saved[h] = source
        return h

    def harness(self, h):
        return self.saved[h]

    def rebind(self, fingerprint, **tags):
        self.tags = tags

    def evaluate(self, rt, source, task, questions, split, workers):
        self.log.append(("read", split))
        return FakeResult(self.accuracy[split], len(questions))


class FakeWeights:
    """Weight steps of 0.25 epoch (1 prompt of a pool of 4, G = 4 samples) whose rewards are
    `rewards` in turn (then the last one again)."""

    def __init__(self, log, rewards=(0.5,), settings=None):
        self.log, self.rewards = log, list(rewards)
        self.settings = settings or RsftSettings(step_epochs=0.25)

    def step(self, h, k, position, left, tags):
        self.log.append(("weight", k))
        n = min(4, left)
        r = self.rewards[min(k, len(self.rewards) - 1)]
        return WeightStep(step=k, position=position, prompts=1, consumed=1, samples=n,
                          accepted=int(r * n), reward=r)  # fmt: skip

    def epochs(self, consumed):
        return consumed / 4


class FakeOperator:
    """Each harness phase: `budget.iterations` iterations of `cost` rollouts each, and the
    harness gains a comment line; patience (J_min, P_h) ends it after J_min iterations."""

    def __init__(self, log, store, cost=4):
        self.log, self.store, self.cost = log, store, cost

    def improve(self, task, rt, harness, budget):
        iters = budget.iterations if budget.patience is None else max(1, budget.patience[0])
        self.log.append(("harness", budget.iterations))
        source = harness + "# next\n"
        spent = iters * self.cost
        rec = OperatorRecord("fake", self.store.save_harness(harness),
                             self.store.save_harness(source), 0.0, 0.0, spent, iters,
                             f"{iters} iterations")  # fmt: skip
        return source, rec


def run(tmp_path, kind, rollouts=1000, accuracy=None, rewards=(0.5,), **kw):
    """One schedule with the fakes; validation read at the boundaries (by `Reads`)."""
    log = Log()
    store = FakeStore(log, accuracy or {"eval": 0.5, "validation": 0.5})
    task = SumTask()
    qs = task.questions()
    weights = FakeWeights(log, rewards)
    op = FakeOperator(log, store)
    s = ScheduleSettings(kind, rollouts=rollouts, **kw)
    root = tmp_path / kind
    root.mkdir(parents=True)
    reads = Reads(root, kind, task, store, FakeSolver(), 1, qs[:4], qs[4:7])
    cot = Cotrain(root, kind, s, task, SEED, store, FakeSolver(), weights, op, 1, read=reads)
    try:
        result = cot.run()
    finally:
        cot.close()
        reads.close()
    return log, result, read_jsonl(root / "phases.jsonl"), read_jsonl(root / "reads.jsonl")


# --- stagewise ---------------------------------------------------------------------------------


def test_stagewise_runs_one_weight_stage_of_e_star_then_one_harness_stage_of_i_star(tmp_path):
    log, result, phases, reads = run(tmp_path, "stagewise", stagewise=(0.75, 5), cycles=3)
    training = [e for e in log if e[0] != "read"]
    assert training == [("weight", 0), ("weight", 1), ("weight", 2), ("harness", 5)]
    assert [(p["cycle"], p["phase"], p["epochs"], p["steps"]) for p in phases] == \
        [(1, "weight", 0.75, 3), (1, "harness", 0.0, 5)]
    assert [(r["cycle"], r["boundary"]) for r in reads] == \
        [(0, "start"), (1, "weight"), (1, "harness")]
    assert result["training_rollouts"] == 3 * 4 + 5 * 4


def test_stagewise_is_still_stopped_by_the_rollout_budget(tmp_path):
    log, result, phases, _ = run(tmp_path, "stagewise", rollouts=10, stagewise=(2.0, 5))
    assert [e for e in log if e[0] != "read"] == [("weight", 0), ("weight", 1), ("weight", 2)]
    assert result["training_rollouts"] == 10 and "rollout budget" in phases[0]["stopped"]
    assert result["stopped"] == "rollout budget 10 spent"  # the harness stage never started


def test_a_harness_phase_is_not_started_without_one_scoring_left(tmp_path):
    # Each phase scores 2 x 4 rollouts; 20 - 16 = 4 left, less than a scoring of 6.
    log, result, _, _ = run(tmp_path, "harness-only", rollouts=20, harness_iters=2,
                            scoring_rollouts=6)  # fmt: skip
    assert [e for e in log if e[0] == "harness"] == [("harness", 2), ("harness", 2)]
    assert result["training_rollouts"] == 16
    assert "4 left, less than one scoring of the search split (6)" in result["stopped"]


# --- the validation split ----------------------------------------------------------------------


def config(**kw):
    return replace(CotrainConfig(), **{"train": 20, "search": 5, "eval": 10, "validation": 8,
                                       **kw})


def test_the_validation_split_is_disjoint_from_pool_search_and_eval():
    task = SumTask(60)
    sp = cotrain_splits(task, config())
    assert (len(sp.pool), len(sp.held), len(sp.validation)) == (20, 10, 8)
    check_disjoint({"train": sp.pool, "eval": sp.held, "validation": sp.validation})
    texts = {normalize_prompt(q.prompt) for q in sp.pool + sp.held}
    assert not texts & {normalize_prompt(q.prompt) for q in sp.validation}
    search = {q.id for q in sp.pool[:5]}  # the harness phase's questions: the pool's first
    assert not search & {q.id for q in sp.validation}


def test_a_validation_split_leaves_train_and_eval_as_drawn_without_it():
    task = SumTask(60)
    with_val, without = cotrain_splits(task, config()), cotrain_splits(task, config(validation=0))
    assert without.validation == []
    assert (with_val.pool, with_val.held) == (without.pool, without.held)


def test_the_sweep_needs_a_validation_split():
    cfg = config(validation=0)
    cfg.sweep.enabled = True
    with pytest.raises(cfgmod.ConfigError, match="validation"):
        cfg.validate()


def decisions(log, phases):
    return ([e for e in log if e[0] != "read"],
            [{k: v for k, v in p.items() if k != "wall_s"} for p in phases])  # fmt: skip


def test_no_switching_rule_reads_the_validation_split(tmp_path):
    """Adaptive, where every phase ends by a rule: the same run with a validation split that
    reads 0.0 and one that reads 1.0 takes the same steps and ends each phase the same way."""
    rewards = (0.2, 0.5, 0.5, 0.5, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9)
    low = run(tmp_path / "low", "adaptive", rollouts=120, rewards=rewards,
              accuracy={"eval": 0.5, "validation": 0.0}, patience=(2, 1))  # fmt: skip
    high = run(tmp_path / "high", "adaptive", rollouts=120, rewards=rewards,
               accuracy={"eval": 0.5, "validation": 1.0}, patience=(2, 1))  # fmt: skip
    assert decisions(low[0], low[2]) == decisions(high[0], high[2])
    assert any("patience" in p["stopped"] for p in low[2] if p["phase"] == "weight")
    assert [r["validation_accuracy"] for r in low[3]] != [r["validation_accuracy"]
                                                          for r in high[3]]


def test_the_validation_split_is_read_only_at_phase_boundaries(tmp_path):
    log, _, phases, reads = run(tmp_path, "adaptive", rollouts=120, rewards=(0.2, 0.5, 0.4),
                                patience=(2, 1))  # fmt: skip
    # Between two reads lie exactly one phase's steps: its weight steps, or one harness call.
    chunks, cur = [], []
    for e in log:
        if e == ("read", "validation"):
            chunks.append(cur)
            cur = []
        elif e[0] != "read":
            cur.append(e[0])
    assert chunks[0] == []  # the start read
    assert [(set(c), len(c)) for c in chunks[1:]] == \
        [({p["phase"]}, p["steps"] if p["phase"] == "weight" else 1) for p in phases]
    # and each validation read right after the eval read of the same boundary
    for i, e in enumerate(log):
        if e == ("read", "validation"):
            assert log[i - 1] == ("read", "eval")
    assert len(reads) == len(phases) + 1 and all(r["validation_n"] == 3 for r in reads)


# --- the sweep ---------------------------------------------------------------------------------


def test_the_sweep_picks_the_grid_point_by_validation_and_stagewise_runs_it(tmp_path,
                                                                           monkeypatch):
    import whale.analysis.curves as curves
    import whale.cotrain as cotrain

    val = {(0.5, 2): 0.3, (0.5, 3): 0.7, (1.0, 2): 0.7, (1.0, 3): 0.1}
    ran = []

    def one_schedule(cfg, kind, root, task, source, splits, serving, ckpt, proposer, say,
                     sweep_point=False):  # fmt: skip
        ran.append((kind, tuple(cfg.stagewise), sweep_point, root.relative_to(tmp_path)))
        out = {"schedule": kind, "stopped": "x", "training_rollouts": 10}
        if sweep_point:
            out.update(validation_accuracy=val[tuple(cfg.stagewise)], validation_n=8)
        return out

    class Serving:
        def close(self):
            pass

    monkeypatch.setattr(cotrain, "_one_schedule", one_schedule)
    monkeypatch.setattr(cotrain, "make_serving", lambda cfg: (Serving(), Path("ckpt")))
    monkeypatch.setattr(curves, "write_curves", lambda d, t=None: (d / "c.csv", None, d / "c.png"))
    monkeypatch.setattr(curves, "markdown_table", lambda d: "table")
    monkeypatch.setattr(curves, "schedule_summary", lambda d: [])
    cfg = config(schedules=["stagewise", "adaptive"])
    cfg.sweep = cotrain.SweepSettings(enabled=True, epochs=[1.0, 0.5], iters=[3, 2])
    meta = cotrain.run_cotrain(cfg, tmp_path, SumTask(60), SEED, None)
    got = json.loads((tmp_path / "sweep.json").read_text())
    assert got["chosen"] == [0.5, 3]  # 0.7, tied with (1.0, 2): the cheaper point
    assert [(p["epochs"], p["iters"], p["validation_accuracy"]) for p in got["points"]] == \
        [(0.5, 2, 0.3), (0.5, 3, 0.7), (1.0, 2, 0.7), (1.0, 3, 0.1)]
    assert [r[:3] for r in ran] == [("stagewise", (0.5, 2), True), ("stagewise", (0.5, 3), True),
                                    ("stagewise", (1.0, 2), True), ("stagewise", (1.0, 3), True),
                                    ("stagewise", (0.5, 3), False),
                                    ("adaptive", (0.5, 3), False)]  # fmt: skip
    assert ran[1][3] == Path("sweep/E0.5-I3/stagewise") and ran[4][3] == Path("stagewise")
    assert meta["sweep"]["chosen"] == [0.5, 3]


# --- the weight step -------------------------------------------------------------------------


def test_the_weight_step_is_finer_than_the_patience_window():
    s = RsftSettings()
    assert s.step_epochs == 0.05 and s.window == s.t_min == s.p_w == 0.2


def test_with_steps_of_005_epoch_a_flat_reward_ends_the_phase_at_025_epoch():
    p = WeightPatience()
    track = []
    for i in range(1, 10):
        track.append((round(0.05 * i, 2), 0.5, 8))
        if p.should_stop(track):
            break
    assert track[-1][0] == 0.25  # with steps of W = 0.2 it was 0.4


def test_a_sweep_point_reads_validation_once_after_its_run_and_nothing_else(tmp_path):
    """The real `_one_schedule` path of a sweep point (search operator, scripted proposer and
    solver): no boundary reads, one validation read of the final harness after the run."""
    from tests.fakes import ScriptedModel
    from tests.revise.conftest import SEED as SUM_SEED
    from tests.revise.conftest import prose_solver
    from tests.search.test_loop import GOOD
    from whale.cotrain import _one_schedule

    class Serving:
        def serve(self, adapter):
            return prose_solver()

        def close(self):
            pass

    cfg = config(harness_iters=1, m=1, rollouts=40, workers=2)
    cfg.solver.cache = False
    cfg.runtime.warm = 0
    task = SumTask(60)
    splits = cotrain_splits(task, cfg)
    root = tmp_path / "sweep" / "E0.5-I1" / "harness-only"
    got = _one_schedule(cfg, "harness-only", root, task, SUM_SEED, splits, Serving(),
                        Path("unused"), ScriptedModel([GOOD]), lambda m: None,
                        sweep_point=True)  # fmt: skip
    rows = read_jsonl(root / "outcomes.jsonl")
    kinds = [r["kind"] for r in rows]
    n_val = len(splits.validation)
    assert kinds[-n_val:] == ["validation"] * n_val and "eval" not in kinds
    assert set(kinds[:-n_val]) == {"harness_score"}  # every training row came first
    assert {r["question_id"] for r in rows[-n_val:]} == {q.id for q in splits.validation}
    assert got["validation_n"] == n_val and got["validation_accuracy"] == 1.0  # GOOD's harness
    assert not (root / "reads.jsonl").exists()
