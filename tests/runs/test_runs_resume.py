"""The one rule for what a resume may change (whale.runs.resume), for every command's config:
a field saying where or how fast rollouts run may change, a budget field may (until the eval
split was read), anything else is refused with ResumeMismatch naming it."""

import json
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from whale import config as cfgmod
from whale.analysis.diagnose import DiagnoseConfig
from whale.harness import RuntimeConfig
from whale.metaharness.run import SearchConfig
from whale.models import ModelConfig
from whale.records import RecordError
from whale.revise.run import AdaptConfig
from whale.runs import (
    ResumeMismatch,
    check_seed,
    check_splits,
    record_seed,
    refuse_changes,
    resumable,
)
from whale.schedule.cotrain import CotrainConfig
from whale.train.proposer.run import ProposerTrainConfig, check_stage_changes

COMMANDS = [AdaptConfig, SearchConfig, CotrainConfig, ProposerTrainConfig, DiagnoseConfig]
# Where or how fast rollouts run: the same for every command.
WHERE = [{"workers": 1}, {"runtime": {"warm": 0}},
         {"runtime": {"executor": {"actors": 3}}}, {"solver": {"threads": 7}},
         {"solver": {"endpoints": ["http://a:1/v1", "http://b:1/v1"]}}]  # fmt: skip
# What a rollout produces: refused by every command.
DEFINING = [({"solver": {"timeout_s": 5.0}}, "solver.timeout_s"),
            ({"solver": {"name": "other"}}, "solver.name"),
            ({"runtime": {"budget": {"model_calls": 2}}}, "runtime.budget.model_calls"),
            ({"runtime": {"temperature": 0.5}}, "runtime.temperature")]  # fmt: skip
BUDGET = {AdaptConfig: {"rounds": 9}, SearchConfig: {"iterations": 9},
          CotrainConfig: {"schedules": ["adaptive", "fixed"]},
          ProposerTrainConfig: {"evaluate": {"only": ["rg:lcm"]}}}  # fmt: skip
OTHERS = {AdaptConfig: ({"seed": 1}, "seed"), SearchConfig: ({"m": 3}, "m"),
          CotrainConfig: ({"rollouts": 10}, "rollouts"),
          ProposerTrainConfig: ({"phases": 2}, "phases"),
          DiagnoseConfig: ({"rollouts": 9}, "rollouts")}  # fmt: skip


def changed(cls, tree):
    return cfgmod.build(cls, tree)


@pytest.mark.parametrize("cls", COMMANDS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("tree", WHERE, ids=str)
def test_where_and_how_fast_may_change_for_every_command(cls, tree, tmp_path):
    refuse_changes(cls(), changed(cls, tree), tmp_path)


@pytest.mark.parametrize("cls", COMMANDS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("tree", "name"), DEFINING, ids=lambda x: str(x))
def test_what_a_rollout_produces_is_refused_for_every_command(cls, tree, name, tmp_path):
    with pytest.raises(ResumeMismatch, match=f"{name} was .* when the run started"):
        refuse_changes(cls(), changed(cls, tree), tmp_path)


@pytest.mark.parametrize("cls", COMMANDS, ids=lambda c: c.__name__)
def test_another_out_is_refused_for_every_command(cls, tmp_path):
    """A resumed run stays in its directory: another `out` would be recorded, not used."""
    with pytest.raises(ResumeMismatch) as e:
        refuse_changes(cls(), changed(cls, {"out": "elsewhere"}), tmp_path)
    assert e.value.field == "out"


@pytest.mark.parametrize("cls", list(BUDGET), ids=lambda c: c.__name__)
def test_each_command_may_extend_its_own_budget(cls, tmp_path):
    refuse_changes(cls(), changed(cls, BUDGET[cls]), tmp_path)


@pytest.mark.parametrize("cls", list(OTHERS), ids=lambda c: c.__name__)
def test_a_field_of_the_experiment_is_refused_by_name(cls, tmp_path):
    tree, name = OTHERS[cls]
    with pytest.raises(ResumeMismatch, match=f"--resume {tmp_path}: {name} was"):
        refuse_changes(cls(), changed(cls, tree), tmp_path)


def test_one_commands_budget_is_not_anothers(tmp_path):
    # rounds extends adapt; diagnose's rollouts would be a different probe, not more of it
    assert "rounds" in resumable(AdaptConfig) and "rollouts" not in resumable(DiagnoseConfig)
    with pytest.raises(ResumeMismatch, match="rollouts"):
        refuse_changes(CotrainConfig(), changed(CotrainConfig, {"rollouts": 10}), tmp_path)


@pytest.mark.parametrize(("cls", "tree"), [(AdaptConfig, {"rounds": 9}),
                                           (SearchConfig, {"max_rollouts": 500}),
                                           (SearchConfig, {"patience": [6, 2]})])  # fmt: skip
def test_the_budget_is_fixed_once_the_eval_split_was_read(cls, tree, tmp_path):
    (tmp_path / "eval_read.json").write_text("{}")
    with pytest.raises(ResumeMismatch, match="eval split was already read"):
        refuse_changes(cls(), changed(cls, tree), tmp_path)
    refuse_changes(cls(), changed(cls, {"workers": 1}), tmp_path)  # where: still free


def test_a_proposers_timeout_may_change_a_solvers_may_not(tmp_path):
    for cls in (AdaptConfig, SearchConfig, CotrainConfig, DiagnoseConfig):
        refuse_changes(cls(), changed(cls, {"proposer": {"timeout_s": 9.0}}), tmp_path)
    cfg = ProposerTrainConfig()
    refuse_changes(cfg, changed(ProposerTrainConfig, {"teacher": {"timeout_s": 9.0}}), tmp_path)


def test_diagnose_may_rejudge_with_another_z(tmp_path):
    refuse_changes(DiagnoseConfig(), changed(DiagnoseConfig, {"z": 100.0}), tmp_path)
    assert "z" not in resumable(CotrainConfig)


def test_a_command_specific_where_field_is_declared_by_its_config(tmp_path):
    refuse_changes(AdaptConfig(), changed(AdaptConfig, {"propose": {"concurrency": 1}}),
                   tmp_path)  # fmt: skip
    with pytest.raises(ResumeMismatch, match="propose.temperature"):
        refuse_changes(AdaptConfig(), changed(AdaptConfig, {"propose": {"temperature": 0.1}}),
                       tmp_path)  # fmt: skip


def test_train_proposer_holds_the_same_rule_once_its_stages_started(tmp_path):
    for d in ("rollouts", "contexts", "teacher", "grpo", "evaluate"):
        (tmp_path / d).mkdir()
    saved = ProposerTrainConfig()
    for tree in (*WHERE, BUDGET[ProposerTrainConfig], {"grpo": {"vllm_url": "http://h:1/v1"}}):
        check_stage_changes(saved, changed(ProposerTrainConfig, tree), tmp_path)
    with pytest.raises(RecordError, match="solver.timeout_s"):
        check_stage_changes(saved, changed(ProposerTrainConfig, DEFINING[0][0]), tmp_path)


@dataclass
class Toy:
    """A config with a field no kind names: it defines the experiment."""

    budget_fields: ClassVar[frozenset[str]] = frozenset({"steps"})
    solver: ModelConfig = field(default_factory=ModelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    steps: int = 1
    new_knob: int = 0
    workers: int = 1


def test_a_field_added_later_defines_the_experiment_until_given_a_kind(tmp_path):
    refuse_changes(Toy(), Toy(steps=2, workers=4), tmp_path)
    with pytest.raises(ResumeMismatch, match="new_knob was 0 when the run started, now 1"):
        refuse_changes(Toy(), Toy(new_knob=1), tmp_path)


def test_the_message_lists_what_may_change(tmp_path):
    with pytest.raises(ResumeMismatch) as e:
        refuse_changes(Toy(), Toy(new_knob=1), tmp_path)
    assert "these may: runtime.executor, runtime.warm" in str(e.value)
    assert isinstance(e.value, cfgmod.ConfigError)  # a config that cannot run, typed


def test_an_edited_seed_is_refused_and_an_unrecorded_one_passes(tmp_path):
    check_seed(tmp_path, "seed.py", "def run(q, env):\n    return 'a'\n")  # no seed.json
    record_seed(tmp_path, "seed.py", "def run(q, env):\n    return 'a'\n")
    check_seed(tmp_path, "seed.py", "def run(q, env):\n    return 'a'\n")
    with pytest.raises(ResumeMismatch, match="the file was edited"):
        check_seed(tmp_path, "seed.py", "def run(q, env):\n    return 'b'\n")


def test_the_refusal_names_its_field_for_a_script(tmp_path):
    from whale.errors import WhaleError

    with pytest.raises(WhaleError) as e:
        refuse_changes(AdaptConfig(), changed(AdaptConfig, {"seed": 1, "dev": 9}), tmp_path)
    assert e.value.field == "dev"  # the first, in dotted order; the message names both
    assert "(and seed)" in str(e.value)


# --- the splits a resume meets (check_splits) --------------------------------------------------
@dataclass
class Q:
    id: str
    prompt: str


def test_a_resume_meeting_the_same_splits_passes(tmp_path):
    splits = {"dev": [Q("a", "1+1"), Q("b", "2+2")], "eval": [Q("c", "3+3")]}
    check_splits(tmp_path, splits)
    check_splits(tmp_path, splits)


def test_a_question_moved_between_splits_is_refused(tmp_path):
    """What a changed split rule (or an edited data file) does: a question the run was tuned
    on lands in its eval split."""
    check_splits(tmp_path, {"dev": [Q("a", "1+1")], "eval": [Q("c", "3+3")]})
    with pytest.raises(ResumeMismatch, match="dev split.*other questions") as e:
        check_splits(tmp_path, {"dev": [Q("c", "3+3")], "eval": [Q("a", "1+1")]})
    assert e.value.field == "task"


def test_a_question_whose_text_changed_under_its_id_is_refused(tmp_path):
    check_splits(tmp_path, {"eval": [Q("c", "3+3")]})
    with pytest.raises(ResumeMismatch, match="text changed"):
        check_splits(tmp_path, {"eval": [Q("c", "3*3")]})


def _ledger(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"question_id": q, "split": s}) + "\n" for q, s in rows))


@pytest.mark.parametrize("ledger", ["outcomes.jsonl", "adaptive/outcomes.jsonl"])
def test_a_run_from_before_the_record_whose_split_moved_is_refused(tmp_path, ledger):
    """No splits.json (a run made before it): the ledger says which questions the run was
    tuned on. One of them now drawn into the eval split (what this very change of the question
    identity does to some tasks' splits) must not be written down as the run's split."""
    _ledger(tmp_path / ledger, [("a", "score"), ("b", "feedback")])
    with pytest.raises(ResumeMismatch, match="'score' rollout of question a.*now in the eval"):
        check_splits(tmp_path, {"dev": [Q("b", "2+2")], "eval": [Q("a", "1+1")]})
    assert not (tmp_path / "splits.json").exists()


def test_a_run_from_before_the_record_whose_eval_rows_left_the_eval_split_is_refused(tmp_path):
    _ledger(tmp_path / "outcomes.jsonl", [("a", "score"), ("c", "eval")])
    with pytest.raises(ResumeMismatch, match="no longer in the eval"):
        check_splits(tmp_path, {"dev": [Q("a", "1+1"), Q("c", "3+3")], "eval": [Q("d", "4")]})


def test_a_run_from_before_the_record_whose_split_held_gets_it(tmp_path):
    _ledger(tmp_path / "outcomes.jsonl", [("a", "score"), ("c", "eval")])
    splits = {"dev": [Q("a", "1+1")], "eval": [Q("c", "3+3")]}
    check_splits(tmp_path, splits)
    assert (tmp_path / "splits.json").exists()
    check_splits(tmp_path, splits)


@pytest.mark.parametrize("record", ['{"eval": "x"}', '{"eval": {"ids": 3, "hash": "h"}}', "[]"])
def test_an_edited_splits_record_is_a_record_error(tmp_path, record):
    (tmp_path / "splits.json").write_text(record)
    with pytest.raises(RecordError, match="not a record of the run's splits"):
        check_splits(tmp_path, {"eval": [Q("c", "3+3")]})
