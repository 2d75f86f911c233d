"""The `select` step's rule: accuracy bounds, the seeded assignment that never splits generator
twins, a required variant, the shortfall error naming the rule and the counts, and the step
itself resuming family by family."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from whale import config as cfgmod
from whale.experiments.select import (
    SelectConfig,
    SelectionShort,
    assign,
    choose,
    reading_task,
    run_select,
    units,
)
from whale.train.proposer.contexts import twin_groups


def config(**kw) -> SelectConfig:
    base = {"candidates": [f"rg:f{i}" for i in range(10)], "n": 10, "accuracy": [0.1, 0.6],
            "lists": {"a": 2, "b": 1}}  # fmt: skip
    return cfgmod.build(SelectConfig, {**base, **kw})


def readings(cfg: SelectConfig, correct: dict[str, int] | None = None) -> dict:
    return {f: ((correct or {}).get(f, 3), cfg.n) for f in cfg.candidates}


def test_the_bounds_are_inclusive_and_families_outside_them_are_left_out():
    cfg = config(lists={"a": 2})
    got = choose(cfg, readings(cfg, {"rg:f0": 1, "rg:f1": 6, "rg:f2": 0, "rg:f3": 7}))
    passed = set(got.passed)
    assert {"rg:f0", "rg:f1"} <= passed  # 0.1 and 0.6 exactly
    assert not {"rg:f2", "rg:f3"} & passed
    rows = {r["family"]: r for r in got.families}
    assert rows["rg:f2"]["passed"] is False and rows["rg:f2"]["accuracy"] == 0.0


def test_generator_twins_are_one_unit_taken_transitively():
    fams = ["rg:gcd", "rg:lcm", "rg:chain_sum", "rg:products", "rg:decimal_chain_sum", "rg:maze"]
    assert units(fams) == [("rg:chain_sum", "rg:decimal_chain_sum", "rg:products"),
                           ("rg:gcd", "rg:lcm"), ("rg:maze",)]  # fmt: skip


@pytest.mark.parametrize("seed", range(25))
def test_no_seed_splits_twins_across_lists(seed):
    passed = [
        "rg:gcd",
        "rg:lcm",
        "rg:chain_sum",
        "rg:products",
        "rg:maze",
        "rg:count_bits",
        "rg:leg_counting",
        "rg:letter_counting",
        "rg:mini_sudoku",
        "rg:sudoku",
    ]
    lists, left = assign(passed, {"sft": 4, "rl": 2, "unseen": 3}, {}, seed)
    where = {f: n for n, fams in lists.items() for f in fams}
    where |= dict.fromkeys(left, "unassigned")
    for group in twin_groups():
        present = {where[f] for f in group if f in where}
        assert len(present) <= 1, (group, present)
    assert sorted(sum(lists.values(), []) + left) == sorted(passed)


def test_the_shuffle_is_seeded():
    passed = [f"rg:f{i}" for i in range(12)]
    lists = {"a": 4, "b": 4}
    assert assign(passed, lists, {}, 3) == assign(passed, lists, {}, 3)
    assert any(assign(passed, lists, {}, 3) != assign(passed, lists, {}, s) for s in range(4, 9))


def test_a_required_variant_fills_that_list_with_families_that_offer_it():
    passed = ["rg:a", "rg:b", "rg:c", "rg:d"]
    fmt_ok = {"rg:c", "rg:d"}
    lists, _ = assign(passed, {"x": 2, "y": 2}, {"y": "format"}, 0,
                      lambda f, v: f in fmt_ok)  # fmt: skip
    assert set(lists["y"]) == fmt_ok and set(lists["x"]) == {"rg:a", "rg:b"}


def test_too_few_passing_families_is_an_error_naming_the_rule_and_counts(tmp_path):
    cfg = config(lists={"sft": 3, "unseen": 2})
    got = choose(cfg, readings(cfg, {f"rg:f{i}": 0 for i in range(7)}))  # 3 pass
    assert got.short is not None
    text = " ".join(got.short.split())
    assert "3 of 10 candidate families passed" in text and "[0.1, 0.6] on 10 questions" in text
    assert "sft 3 + unseen 2 = 5" in text and "not lowered" in text


def fake_draw(family, cfg, task_fields):
    """The questions select would read, for families that do not exist (rg:f0, ...)."""
    return SimpleNamespace(questions=lambda: [SimpleNamespace(id=str(i)) for i in range(cfg.n)])


def test_the_step_reads_each_family_once_and_writes_selection_json(tmp_path):
    calls = []

    def evaluate(out, fields, task):
        calls.append(fields["task"]["id"])
        out.mkdir(parents=True)
        acc = 0.3 if fields["task"]["id"] != "rg:f9" else 0.0
        (out / "summary.json").write_text(json.dumps({"accuracy": acc, "n": fields["n"]}))
        return SimpleNamespace(
            held_out={"harness": SimpleNamespace(correct=round(acc * 10), n=fields["n"])}
        )

    fields = {
        "candidates": [f"rg:f{i}" for i in range(10)],
        "n": 10,
        "lists": {"a": 2, "b": 1},
        "variants": ["format"],
        "task_seed": 77,
        "eval": {"harness": "single_call"},
    }
    out = run_select(fields, tmp_path / "select", evaluate, lambda s: None, fake_draw)
    assert len(calls) == 10 and len(out["a"]) == 2 and len(out["b"]) == 1
    assert "rg:f9" not in out["families"] and out["a_format"] == []  # no rule for rg:f*
    sel = json.loads((tmp_path / "select" / "selection.json").read_text())
    assert sel["rule"]["task_seed"] == 77 and sel["short"] is None
    # resumed: every family is read back from its run, none evaluated again
    assert run_select(fields, tmp_path / "select", evaluate, lambda s: None, fake_draw) == out
    assert len(calls) == 10


def test_the_step_refuses_to_fill_short_lists(tmp_path):
    def evaluate(out, fields, task):
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"accuracy": 0.0, "n": fields["n"]}))
        return SimpleNamespace(held_out={"harness": SimpleNamespace(correct=0, n=fields["n"])})

    fields = {"candidates": ["rg:a", "rg:b"], "n": 4, "lists": {"a": 1}}
    with pytest.raises(SelectionShort) as e:
        run_select(fields, tmp_path / "s", evaluate, lambda s: None, fake_draw)
    assert e.value.field == "lists" and "0 of 2 candidate families passed" in str(e.value)
    assert json.loads((tmp_path / "s" / "selection.json").read_text())["short"]


@pytest.mark.parametrize(("kw", "name"), [
    ({"accuracy": [0.7, 0.2]}, "accuracy"),
    ({"lists": {"dir": 1}}, "lists.dir"),
    ({"require": {"c": "format"}}, "require.c"),
    ({"eval": {"task": {"id": "rg:x"}}}, "eval.task.id"),
    ({"candidates": ["rg:a", "rg:a"]}, "candidates"),
])  # fmt: skip
def test_a_bad_rule_is_a_config_error_naming_the_field(kw, name):
    with pytest.raises(cfgmod.ConfigError) as e:
        config(**kw)
    assert e.value.field == name


@pytest.mark.parametrize("family", ["rg:products", "rg:aiw", "rg:coin_flip"])
def test_select_reads_no_question_of_the_later_held_out_split(tmp_path, family):
    """Harness Learning's select reads 20 questions of task seed 1000 per candidate and its
    `proposer` step seals 20 held-out questions per family from task seed 0. For these
    candidates (small generator spaces) task seed 1000's first 20 hold, word for word, a
    held-out question of the later step (checked first: the attack is real); the questions
    select reads hold none, and are still 20."""
    from whale.tasks import load_task
    from whale.tasks.base import normalize_prompt
    from whale.train.proposer.contexts import ContextSettings, family_of

    cs = ContextSettings(seeds=["single_call"], dev=20, score=8, eval=20, feedback=6,
                         task_seed=0)  # the experiment's proposer step  # fmt: skip
    pool = load_task(family, size=(cs.dev + cs.eval) * 3 // 2 + 10, seed=cs.task_seed)
    fam = family_of(family, pool, cs, tmp_path)
    held = {normalize_prompt(q.prompt) for q in fam.held_out._questions}
    naive = {normalize_prompt(q.prompt) for q in load_task(family, size=20, seed=1000).questions()}
    assert naive & held
    cfg = cfgmod.build(SelectConfig, {"candidates": [family], "n": 20, "lists": {"a": 1}})
    drawn = reading_task(family, cfg, {}).questions()
    assert len(drawn) == 20
    assert not {normalize_prompt(q.prompt) for q in drawn} & held


def test_a_format_reading_is_drawn_clear_of_the_later_canonical_questions():
    """The format variant rewords the canonical questions: the questions read in it are the
    ones whose canonical words are not among the later steps' (ids kept by the variant)."""
    from whale.tasks import load_task
    from whale.tasks.base import normalize_prompt

    cfg = cfgmod.build(SelectConfig, {"candidates": ["rg:products"], "n": 20, "lists": {"a": 1}})
    later = {normalize_prompt(q.prompt) for q in load_task("rg:products", 200, 0).questions()}
    canon = {q.id: normalize_prompt(q.prompt)
             for q in load_task("rg:products", 200, 1000).questions()}  # fmt: skip
    drawn = reading_task("rg:products", cfg, {"variant": "format"}).questions()
    assert drawn and all(q.metadata.get("variant") == "format" for q in drawn)
    assert not {canon[q.id] for q in drawn} & later


def test_the_rule_records_what_it_kept_clear_of(tmp_path):
    cfg = config(exclude_seed=3, exclude_size=50)
    assert choose(cfg, readings(cfg)).rule["exclude"] == {"seed": 3, "size": 50}
    with pytest.raises(cfgmod.ConfigError) as e:
        config(task_seed=5, exclude_seed=5)
    assert e.value.field == "exclude_seed"


# --- review26 -----------------------------------------------------------------------------------
def test_review26_a_family_left_with_no_clear_question_fails_the_rule_without_a_crash(tmp_path):
    """rg:emoji_mystery's prompts all normalize to one text (the emoji are not word characters),
    so every question of task seed 1000 is among the later pool: select read it on n = 0, and
    `whale eval` refuses n = 0 (a ConfigError that stopped the whole step)."""
    calls = []

    def evaluate(out, fields, task):
        calls.append(fields["task"]["id"])
        if fields["n"] < 1:
            raise cfgmod.ConfigError("n: must be >= 1", "n")
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"accuracy": 0.5, "n": fields["n"]}))
        return SimpleNamespace(held_out={"harness": SimpleNamespace(correct=fields["n"] // 2,
                                                                     n=fields["n"])})  # fmt: skip

    def draw(family, cfg, task_fields):
        n = 0 if family == "rg:f0" else cfg.n
        return SimpleNamespace(questions=lambda: [SimpleNamespace(id=str(i)) for i in range(n)])

    fields = {"candidates": ["rg:f0", "rg:f1"], "n": 4, "lists": {"a": 1}, "accuracy": [0, 1]}
    out = run_select(fields, tmp_path / "s", evaluate, lambda s: None, draw)
    assert out["families"] == ["rg:f1"] and calls == ["rg:f1"]


def test_review26_a_family_whose_pool_depends_on_its_size_is_not_read():
    """rg:acre draws its whole pool from the size (60/20/20 split, then a shuffle): its first
    70 questions of seed 0 (the proposer step's pool) are mostly not among its first 200, so
    the exclusion cannot see them. Such a family is not read (n = 0: it fails the rule)."""
    from whale.tasks import load_task
    from whale.tasks.base import normalize_prompt

    later200 = {normalize_prompt(q.prompt) for q in load_task("rg:acre", 200, 0).questions()}
    pool70 = {normalize_prompt(q.prompt) for q in load_task("rg:acre", 70, 0).questions()}
    assert pool70 - later200  # the hole is real
    cfg = cfgmod.build(SelectConfig, {"candidates": ["rg:acre"], "n": 20, "lists": {"a": 1}})
    assert reading_task("rg:acre", cfg, {}).questions() == []
    # a family whose i-th question depends only on seed and i is read as before
    assert len(reading_task("rg:products", cfg, {}).questions()) == 20


def test_review26_a_reading_made_before_the_exclusion_is_not_read_back(tmp_path):
    """A family's summary.json from a run that read other questions (the naive first n of task
    seed 1000, before the exclusion; or another exclude setting) is run again, not trusted."""
    calls = []

    def evaluate(out, fields, task):
        calls.append([q.id for q in task.questions()])
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"accuracy": 0.5, "n": fields["n"]}))
        return SimpleNamespace(held_out={"harness": SimpleNamespace(correct=2, n=fields["n"])})

    fields = {"candidates": ["rg:f0"], "n": 4, "lists": {"a": 1}, "accuracy": [0, 1]}
    old = tmp_path / "s" / "rg_f0"
    old.mkdir(parents=True)  # what the step left before the exclusion: no record of the draw
    (old / "summary.json").write_text(json.dumps({"accuracy": 1.0, "n": 4}))
    run_select(fields, tmp_path / "s", evaluate, lambda s: None, fake_draw)
    assert len(calls) == 1  # run again
    run_select(fields, tmp_path / "s", evaluate, lambda s: None, fake_draw)
    assert len(calls) == 1  # its own reading is read back
    sel = json.loads((tmp_path / "s" / "selection.json").read_text())
    assert sel["families"][0]["accuracy"] == 0.5
