""""No cap" is None (issue 22), not 10**9 or 10**6: a schedule without a rollout budget runs
uncapped in its arithmetic (fakes for the weight phase, the harness operator, the store and the
solver), says so in its progress lines, and its None survives the saved config.toml; a config
saved before, holding 1000000000, still loads as that cap."""

from __future__ import annotations

import itertools

import pytest

from tests.revise.conftest import SumTask
from tests.test_schedule_paper import FakeSolver, FakeStore, Log
from whale import config as cfgmod
from whale.operators import OperatorRecord
from whale.schedule.cotrain import CotrainConfig
from whale.schedule.loop import Cotrain, ScheduleSettings, phases
from whale.train.rsft import RsftSettings, WeightStep

SEED = "def run(question, env):\n    return '1'\n"


class BigWeights:
    """Weight steps of 0.25 epoch and 100 samples each, more than the default budget (300)
    allows in all; records the `left` each step is handed."""

    def __init__(self) -> None:
        self.settings = RsftSettings(step_epochs=0.25)
        self.lefts: list[int | None] = []

    def step(self, h, k, position, left, tags):
        self.lefts.append(left)
        return WeightStep(step=k, position=position, prompts=1, consumed=1, samples=100,
                          accepted=50, reward=0.5)  # fmt: skip

    def epochs(self, consumed):
        return consumed / 4


class BudgetOperator:
    """A harness phase of 150 rollouts that records the budget it was given."""

    def __init__(self, store) -> None:
        self.store, self.budgets = store, []

    def improve(self, task, rt, harness, budget):
        self.budgets.append(budget)
        h = self.store.save_harness(harness)
        return harness, OperatorRecord("fake", h, h, 0.0, 0.0, 150, 1, "1 iteration")


def run(tmp_path, s: ScheduleSettings):
    store = FakeStore(Log(), {})
    weights, op, said = BigWeights(), BudgetOperator(store), []
    root = tmp_path / s.kind
    root.mkdir()
    cot = Cotrain(root, s.kind, s, SumTask(), SEED, store, FakeSolver(), weights, op, 1,
                  say=said.append)  # fmt: skip
    try:
        result = cot.run()
    finally:
        cot.close()
    return result, weights, op, said


def test_a_weight_phase_without_a_cap_runs_past_any_budget_to_its_epochs(tmp_path):
    s = ScheduleSettings("weight-only", rollouts=None, weight_epochs=2.0, cycles=1)
    result, weights, _, _ = run(tmp_path, s)
    assert weights.lefts == [None] * 8  # 2 epochs of 0.25-epoch steps, never a number
    assert result["training_rollouts"] == 800 and result["stopped"] == "all its cycles"


def test_a_harness_phase_without_a_cap_gets_a_budget_without_rollouts(tmp_path):
    s = ScheduleSettings("harness-only", rollouts=None, harness_iters=1, cycles=3)
    result, _, op, _ = run(tmp_path, s)
    assert [b.rollouts for b in op.budgets] == [None, None, None]
    assert result["training_rollouts"] == 450


def test_the_progress_line_of_an_uncapped_schedule_shows_no_cap(tmp_path):
    s = ScheduleSettings("weight-only", rollouts=None, weight_epochs=0.5, cycles=1)
    *_, said = run(tmp_path, s)
    phase_line = next(m for m in said if "phase:" in m)
    assert phase_line.endswith("; 200 training rollouts")
    assert not any("unspent" in m or "equal cost" in m for m in said)


def test_the_progress_line_of_a_capped_schedule_shows_its_cap(tmp_path):
    s = ScheduleSettings("weight-only", rollouts=1000, weight_epochs=0.5, cycles=1)
    result, *_, said = run(tmp_path, s)
    assert next(m for m in said if "phase:" in m).endswith("; 200/1000 training rollouts")
    assert "(800 of 1000 rollouts unspent)" in result["stopped"]


def test_the_cycles_of_a_schedule_without_n_have_no_hidden_bound():
    # The loop stops such a schedule (budget spent, or a cycle that spent nothing); phases()
    # itself used to stop after 10**6 cycles.
    s = ScheduleSettings("harness-only", rollouts=10)
    assert sum(1 for _ in itertools.islice(phases(s), 10**6 + 1)) == 10**6 + 1


@pytest.mark.parametrize("kind", ["adaptive", "weight-only", "harness-only"])
def test_no_cap_and_no_n_is_refused_for_a_schedule_that_does_not_end_by_itself(kind):
    with pytest.raises(ValueError, match="rollouts: no cap"):
        ScheduleSettings(kind, rollouts=None)


@pytest.mark.parametrize("kind", ["fixed", "stagewise"])
def test_no_cap_is_allowed_for_a_schedule_that_ends_by_itself(kind):
    assert ScheduleSettings(kind, rollouts=None).rollouts is None


def test_no_cap_without_cycles_is_a_config_error_naming_rollouts():
    with pytest.raises(cfgmod.ConfigError, match="rollouts: no cap"):
        cfgmod.load(CotrainConfig, overrides=["rollouts=none"])


# --- the saved config -------------------------------------------------------------------------

RSFT = ["schedules=['weight-only']", "cycles=1"]  # what `whale rsft` sets


def test_no_cap_given_by_set_is_none():
    cfg = cfgmod.load(CotrainConfig, overrides=[*RSFT, "rollouts=none"])
    assert cfg.rollouts is None and cfg.settings("weight-only").rollouts is None


def test_no_cap_survives_the_saved_config(tmp_path):
    cfg = cfgmod.load(CotrainConfig, overrides=[*RSFT, "rollouts=none"])
    cfgmod.save(cfg, tmp_path / "config.toml")
    assert 'rollouts = "none"' in (tmp_path / "config.toml").read_text()
    again = cfgmod.load(CotrainConfig, tmp_path / "config.toml")
    assert again.rollouts is None and again == cfg
    # a resume reads the saved config back through to_dict (whale.api._open)
    assert cfgmod.load(CotrainConfig, base=cfgmod.to_dict(again)) == cfg


def test_a_none_whose_default_is_none_is_left_out_as_before(tmp_path):
    text = cfgmod.to_dict(CotrainConfig())
    assert "cycles" not in text and "out" not in text and "checkpoint" not in text


def test_a_string_field_keeps_the_word_none_as_a_string():
    cfg = cfgmod.load(CotrainConfig, overrides=["harness=none"])
    assert cfg.harness == "none"


def test_a_config_saved_with_1000000000_as_no_cap_loads_as_that_cap(tmp_path):
    # `whale rsft` without --rollouts saved this before issue 22
    path = tmp_path / "config.toml"
    path.write_text('schedules = ["weight-only"]\ncycles = 1\nrollouts = 1000000000\n')
    cfg = cfgmod.load(CotrainConfig, path)
    assert cfg.rollouts == 10**9 and cfg.settings("weight-only").rollouts == 10**9
    assert cfgmod.to_dict(cfg)["rollouts"] == 10**9  # saved back unchanged on resume
