"""Generator twins (`contexts.TWINS`) may not be split across the SFT, RL and eval lists."""

import pytest

from whale import config as cfgmod
from whale.train.proposer.contexts import TWINS, FamilySplits, twin_groups
from whale.train.proposer.run import ProposerTrainConfig, _default_families


@pytest.mark.parametrize("where", [("sft", "eval"), ("rl", "eval"), ("sft", "rl")])
def test_twins_in_different_lists_are_refused_naming_the_pair(where):
    a, b = where
    with pytest.raises(cfgmod.ConfigError, match=r"rg:gcd .*rg:lcm"):
        FamilySplits(**{a: ["rg:gcd"], b: ["rg:lcm"]}).validate()


def test_the_config_names_the_pair():
    with pytest.raises(cfgmod.ConfigError, match="rg:chain_sum.*rg:decimal_chain_sum"):
        cfgmod.build(ProposerTrainConfig, {"families": {
            "sft": ["rg:chain_sum"], "rl": ["rg:letter_counting"],
            "eval": ["rg:decimal_chain_sum"]}})  # fmt: skip


def test_twins_in_one_list_are_allowed():
    FamilySplits(sft=["rg:gcd", "rg:lcm"], rl=["rg:letter_counting"],
                 eval=["rg:count_bits"]).validate()  # fmt: skip


def test_the_default_families_put_no_twins_apart():
    d = _default_families()
    d.validate()
    assert "rg:gcd" not in d.all() and "rg:lcm" in d.eval
    ProposerTrainConfig().validate()


def test_every_twin_and_default_family_is_a_reasoning_gym_family_with_a_grader():
    pytest.importorskip("reasoning_gym")
    from whale.tasks import load_task
    from whale.tasks.rg import families

    known = {f"rg:{f}" for f in families()}
    names = {n for pair in TWINS for n in pair} | set(_default_families().all())
    assert names <= known, sorted(names - known)
    task = load_task("rg:products", size=3)
    q = task.questions()[0]
    assert task.grade(q, str(task.expected(q))).correct
    assert not task.grade(q, "not a number").correct


def test_twins_of_one_family_are_twins_of_each_other():
    """products and decimal_chain_sum are both chain_sum's twins: one generator, one skill."""
    with pytest.raises(cfgmod.ConfigError, match=r"rg:decimal_chain_sum and rg:products"):
        FamilySplits(sft=["rg:products"], rl=["rg:letter_counting"],
                     eval=["rg:decimal_chain_sum"]).validate()  # fmt: skip
    FamilySplits(sft=["rg:products", "rg:decimal_chain_sum"], rl=["rg:letter_counting"],
                 eval=["rg:lcm"]).validate()  # fmt: skip


def test_twin_groups_are_the_transitive_closure_of_the_pairs():
    groups = twin_groups([("a", "b"), ("c", "d"), ("b", "c"), ("e", "f")])
    assert sorted(map(sorted, groups)) == [["a", "b", "c", "d"], ["e", "f"]]
    assert frozenset({"rg:chain_sum", "rg:decimal_chain_sum", "rg:products"}) in twin_groups()
