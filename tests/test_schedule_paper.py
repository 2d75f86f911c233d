"""WHALE's schedules as the paper runs them (issue 21), with fakes for the weight phase, the
harness operator, the store and the solver: stagewise is one weight stage of E* epochs and one
harness stage of I* iterations; the validation split is disjoint from the others and no
switching rule reads it; the sweep picks (E*, I*) by validation accuracy; weight steps are finer
than the patience window."""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import tomli_w

from tests.revise.conftest import SumTask
from whale import config as cfgmod
from whale.operators import OperatorRecord
from whale.records import RecordError, read_jsonl
from whale.schedule.cotrain import (
    FORMAT,
    CotrainConfig,
    cotrain_splits,
    pool_size,
    validation_source,
)
from whale.schedule.loop import Cotrain, Reads, ScheduleSettings
from whale.tasks import TaskConfig, check_disjoint, load_task
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


def run(tmp_path, kind, rollouts=1000, accuracy=None, rewards=(0.5,), cost=4, **kw):
    """One schedule with the fakes; validation read at the boundaries (by `Reads`)."""
    log = Log()
    store = FakeStore(log, accuracy or {"eval": 0.5, "validation": 0.5})
    task = SumTask()
    qs = task.questions()
    weights = FakeWeights(log, rewards)
    op = FakeOperator(log, store, cost)
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


def test_a_stagewise_run_whose_harness_stage_spent_the_budget_says_so(tmp_path):
    # The sweep's points run I* as a cap the budget reaches first: their summaries must not
    # read as if the stage had run all its iterations.
    _, result, _, _ = run(tmp_path, "stagewise", rollouts=3 * 4 + 5 * 4, stagewise=(0.75, 5))
    assert result["stopped"] == "rollout budget 32 spent"


def test_with_n_cycles_given_a_harness_phase_that_spent_nothing_does_not_end_the_run(tmp_path):
    # Every candidate invalid costs no rollouts; the next phase may make valid ones. Only a
    # schedule with no N to end it stops on such a cycle (it would cycle for ever).
    log, result, _, _ = run(tmp_path, "harness-only", cost=0, cycles=4, harness_iters=2)
    assert [e for e in log if e[0] == "harness"] == [("harness", 2)] * 4
    assert result["stopped"].startswith("all its cycles")


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


def rg_splits(family, validation, size=None, **kw):
    """What `whale cotrain` draws (whale.schedule.setup.prepare): the task at `pool_size`, validation beyond
    it from the same task loaded larger. A real Reasoning Gym family; no model."""
    cfg = replace(CotrainConfig(), task=TaskConfig(id=f"rg:{family}", size=size),
                  validation=validation, **kw)  # fmt: skip

    def load(n):
        return load_task(cfg.task.id, size=n, seed=cfg.task.seed)

    task = load(pool_size(cfg))
    return cotrain_splits(task, cfg, validation_source(task, cfg, load))


def ids(qs):
    return [q.id for q in qs]


@pytest.mark.parametrize("family", ["basic_arithmetic", "acre"])
def test_validation_20_leaves_train_and_eval_of_a_real_task_as_validation_0(family):
    # acre: a larger dataset does NOT keep its first questions (it samples from a pool sized by
    # the dataset's size), so validation cannot simply be "the questions after the first N".
    without, with_val = rg_splits(family, 0), rg_splits(family, 20)
    assert ids(with_val.pool) == ids(without.pool) and ids(with_val.held) == ids(without.held)
    assert [q.prompt for q in with_val.pool + with_val.held] == \
        [q.prompt for q in without.pool + without.held]
    assert len(with_val.validation) == 20 and without.validation == []
    check_disjoint({"train": with_val.pool, "eval": with_val.held,
                    "validation": with_val.validation})  # by id and normalized text


def test_basic_arithmetic_keeps_its_first_questions_at_a_larger_size():
    """What the draw relies on for most families: question i depends on (seed, i) only."""
    small, large = load_task("rg:basic_arithmetic", size=30), load_task("rg:basic_arithmetic",
                                                                         size=50)  # fmt: skip
    assert [(q.id, q.prompt) for q in large.questions()[:30]] == \
        [(q.id, q.prompt) for q in small.questions()]


def test_with_a_given_task_size_validation_comes_from_what_train_and_eval_leave():
    with_val, without = rg_splits("basic_arithmetic", 20, 120), rg_splits("basic_arithmetic", 0,
                                                                           120)  # fmt: skip
    assert ids(with_val.pool + with_val.held) == ids(without.pool + without.held)
    assert {int(q.id.rsplit(":", 1)[1]) for q in with_val.validation} < set(range(120))


def test_validation_beyond_the_pool_chooses_nothing_another_seed_evaluates_or_trains_on():
    # With validation from the rest of the pool, seed 0's validation questions lie in seed 1's
    # eval: an (E*, I*) chosen on seed 0 and run on seed 1 would have read its eval. coin_flip
    # repeats itself (128 distinct of its first 200), so "beyond" must load past 220.
    s0, s1 = (rg_splits("coin_flip", 20, 200, seed=k, validation_from="beyond") for k in (0, 1))
    assert len(s0.validation) == 20 and ids(s0.validation) == ids(s1.validation)
    for sp in (s0, s1):
        check_disjoint({"train": sp.pool, "eval": sp.held, "validation": s0.validation})


def test_validation_from_the_rest_of_the_pool_lies_in_another_seed_s_eval_and_train():
    # Why "beyond" exists, and the figure docs/commands/cotrain.md quotes: with "rest", 5 of
    # seed 0's 20 validation questions of rg:coin_flip (task.size 200) are in seed 1's eval,
    # 9 in its train.
    s0, s1 = (rg_splits("coin_flip", 20, 200, seed=k) for k in (0, 1))
    val = set(ids(s0.validation))
    assert (len(val & set(ids(s1.held))), len(val & set(ids(s1.pool)))) == (5, 9)


def test_validation_beyond_the_pool_leaves_train_and_eval_as_drawn_without_it():
    beyond = rg_splits("coin_flip", 20, 200, validation_from="beyond")
    without = rg_splits("coin_flip", 0, 200)
    assert ids(beyond.pool + beyond.held) == ids(without.pool + without.held)


def test_a_validation_split_that_does_not_fit_the_given_pool_is_refused():
    with pytest.raises(ValueError, match="task.size"):
        cotrain_splits(SumTask(35), config())  # 20 + 10 leave 5 of the 8 asked


def test_the_sweep_needs_a_validation_split():
    cfg = config(validation=0, schedules=["stagewise"])
    cfg.sweep.enabled = True
    with pytest.raises(cfgmod.ConfigError, match="validation"):
        cfg.validate()


def test_the_sweep_is_refused_without_a_stagewise_schedule_to_use_its_choice():
    with pytest.raises(cfgmod.ConfigError, match="no stagewise"):
        cfgmod.load(CotrainConfig, overrides=["sweep.enabled=true", "schedules=['adaptive']"])


def test_the_sweep_is_refused_beside_a_given_stagewise():
    with pytest.raises(cfgmod.ConfigError, match="would replace the"):
        cfgmod.load(CotrainConfig, overrides=["sweep.enabled=true", "stagewise=[0.75, 3]",
                                              "schedules=['stagewise']"])  # fmt: skip


@pytest.mark.parametrize("value", ["[0.75, 3.5]", "[0.75]", "[0, 3]", "[0.75, 0]"])
def test_a_bad_stagewise_names_what_is_wanted(value):
    with pytest.raises(cfgmod.ConfigError, match=r"two values.*E\* > 0 epochs.*I\* an integer "
                       r">= 1"):  # fmt: skip
        cfgmod.load(CotrainConfig, overrides=[f"stagewise={value}"])


def test_stagewise_unset_is_the_default_and_given_is_used():
    assert CotrainConfig().settings("stagewise").stagewise == (0.75, 3)
    cfg = cfgmod.load(CotrainConfig, overrides=["stagewise=[1.5, 7]"])
    assert cfg.settings("stagewise").stagewise == (1.5, 7)


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


class Serving:
    def close(self):
        pass


def fake_schedules(monkeypatch, tmp_path, val=None):
    """run_cotrain with each schedule faked (a sweep point's validation accuracy from `val`);
    returns what ran: (schedule, (E*, I*), sweep point?, folder)."""
    import whale.schedule.cotrain as cotrain
    import whale.schedule.curves as curves

    ran = []

    def one_schedule(cfg, kind, root, task, source, splits, serving, ckpt, proposer, say,
                     sweep_point=False):  # fmt: skip
        ran.append((kind, cfg.stagewise_point(), sweep_point, root.relative_to(tmp_path)))
        out = {"schedule": kind, "stopped": "x", "training_rollouts": 10}
        root.mkdir(parents=True, exist_ok=True)
        if not (root / "phases.jsonl").exists():  # a record naming its own folder and point
            row = {"ran": str(root), "point": list(cfg.stagewise_point())}
            (root / "phases.jsonl").write_text(json.dumps(row) + "\n")
        if sweep_point:
            out.update(validation_accuracy=val[cfg.stagewise_point()], validation_n=8)
        return out

    monkeypatch.setattr(cotrain, "_one_schedule", one_schedule)
    monkeypatch.setattr(cotrain, "make_serving", lambda cfg: (Serving(), Path("ckpt")))
    monkeypatch.setattr(curves, "write_curves", lambda d, t=None: (d / "c.csv", None, d / "c.png"))
    monkeypatch.setattr(curves, "markdown_table", lambda d: "table")
    monkeypatch.setattr(curves, "schedule_summary", lambda d: [])
    return ran


def test_the_sweep_picks_the_grid_point_by_validation_and_stagewise_runs_it(tmp_path,
                                                                           monkeypatch):
    import whale.schedule.cotrain as cotrain

    val = {(0.5, 2): 0.3, (0.5, 3): 0.7, (1.0, 2): 0.7, (1.0, 3): 0.1}
    ran = fake_schedules(monkeypatch, tmp_path, val)
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


def test_stagewise_starts_from_the_chosen_sweep_point_s_records_naming_its_own_folder(
        tmp_path, monkeypatch):  # fmt: skip
    # The chosen point ran stagewise's config and seed: its records replay, and the sweep's
    # cost is not paid a second time. The copy's paths name the stagewise folder.
    import whale.schedule.cotrain as cotrain

    fake_schedules(monkeypatch, tmp_path, {(0.5, 2): 0.3, (0.5, 3): 0.7})
    cfg = config(schedules=["stagewise"])
    cfg.sweep = cotrain.SweepSettings(enabled=True, epochs=[0.5], iters=[2, 3])
    cotrain.run_cotrain(cfg, tmp_path, SumTask(60), SEED, None)
    (row,) = read_jsonl(tmp_path / "stagewise" / "phases.jsonl")
    assert row == {"ran": str(tmp_path / "stagewise"), "point": [0.5, 3]}  # the chosen one
    assert not (tmp_path / ".stagewise.tmp").exists()


def test_the_sweep_choice_is_recorded_in_summary_and_sweep_json(tmp_path, monkeypatch):
    import whale.schedule.cotrain as cotrain

    fake_schedules(monkeypatch, tmp_path, {(0.5, 2): 0.2, (0.5, 3): 0.6})
    cfg = config(schedules=["stagewise"])
    cfg.sweep = cotrain.SweepSettings(enabled=True, epochs=[0.5], iters=[2, 3])
    cotrain.run_cotrain(cfg, tmp_path, SumTask(60), SEED, None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stagewise"] == {"e_star": 0.5, "i_star": 3, "from": "the sweep (sweep.json)"}
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert (sweep["stagewise"]["e_star"], sweep["stagewise"]["i_star"]) == (0.5, 3)
    saved = tomllib.loads((tmp_path / "config.toml").read_text())
    assert "stagewise" not in saved and saved["sweep"]["enabled"]  # what was asked: a sweep


def test_without_a_sweep_the_summary_says_which_stagewise_ran(tmp_path, monkeypatch):
    import whale.schedule.cotrain as cotrain

    fake_schedules(monkeypatch, tmp_path)
    cotrain.run_cotrain(config(schedules=["stagewise"], stagewise=[1.5, 4]), tmp_path,
                        SumTask(60), SEED, None)  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stagewise"] == {"e_star": 1.5, "i_star": 4, "from": "the config"}


# --- resuming a run of an older layout ---------------------------------------------------------


def test_a_run_is_stamped_with_its_format_and_resumes(tmp_path, monkeypatch):
    import whale.schedule.cotrain as cotrain

    ran = fake_schedules(monkeypatch, tmp_path)
    cotrain.run_cotrain(config(), tmp_path, SumTask(60), SEED, None)
    assert json.loads((tmp_path / "format.json").read_text()) == {"format": FORMAT}
    cotrain.run_cotrain(config(), tmp_path, SumTask(60), SEED, None)  # the resume
    assert len(ran) == 2


@pytest.mark.parametrize("stamp", [None, {"format": 1}])
def test_a_run_of_an_older_format_is_not_resumed(tmp_path, monkeypatch, stamp):
    """A run made before stagewise = (E*, I*), the validation split and one archive per
    schedule: its config.toml lacks them, loads with today's defaults and would otherwise
    resume as unchanged."""
    import whale.schedule.cotrain as cotrain

    ran = fake_schedules(monkeypatch, tmp_path)
    old = {k: v for k, v in cfgmod.to_dict(config()).items()
           if k not in ("validation", "sweep", "stagewise")}  # fmt: skip
    (tmp_path / "config.toml").write_text(tomli_w.dumps(old))
    if stamp is not None:
        (tmp_path / "format.json").write_text(json.dumps(stamp))
    with pytest.raises(RecordError, match="start a new run") as e:
        cotrain.run_cotrain(config(), tmp_path, SumTask(60), SEED, None)
    assert ("no format.json" if stamp is None else "format 1") in str(e.value)
    assert ran == [] and (stamp is not None or not (tmp_path / "format.json").exists())


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
    from tests.metaharness.test_loop import GOOD
    from tests.revise.conftest import SEED as SUM_SEED
    from tests.revise.conftest import prose_solver
    from whale.schedule.cotrain import _one_schedule

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
