"""The generated multi-hop benchmark: deterministic, answerable, big enough to need retrieval."""

import re

import pytest

from whale.tasks import load_task
from whale.tasks.mhqa import World, WorldSize, generated_task

SMALL = 3000


@pytest.fixture(scope="module")
def task():
    return generated_task(seed=3, size=200, passages=SMALL)


def test_same_seed_same_world_and_questions():
    a, b = (
        generated_task(seed=5, size=20, passages=SMALL),
        generated_task(seed=5, size=20, passages=SMALL),
    )
    assert a.passages == b.passages
    assert [(q.prompt, q.reference) for q in a.questions()] == [
        (q.prompt, q.reference) for q in b.questions()
    ]


def test_other_seed_other_world():
    assert (
        generated_task(seed=1, size=5, passages=SMALL).passages
        != generated_task(seed=2, size=5, passages=SMALL).passages
    )


def test_default_corpus_has_at_least_50000_passages():
    assert WorldSize().passages >= 50_000
    assert len(World(0).passages) >= 50_000


def test_questions_have_2_to_4_gold_passages_in_the_corpus(task):
    ids = {p.id for p in task.passages}
    for q in task.questions():
        gold = q.reference["supporting"]
        assert 2 <= len(gold) <= 4 and set(gold) <= ids


def test_every_answer_follows_from_its_gold_passages(task):
    by_id = {p.id: p for p in task.passages}
    for q in task.questions():
        gold = [by_id[g] for g in q.reference["supporting"]]
        answer = q.reference["answer"]
        if q.reference["type"].startswith("compare"):
            # Both named in the question; the answer is the one whose passage has the earlier year.
            years = {
                p.title: int(re.search(r"(born|founded) in (\d{4})", p.text).group(2)) for p in gold
            }
            assert all(title in q.prompt for title in years)
            assert answer == min(years, key=years.get)
        else:
            # A chain: the question names the first passage's title, each passage names the next
            # one's title, and the last passage states the answer.
            assert gold[0].title in q.prompt
            for a, b in zip(gold, gold[1:], strict=False):
                assert b.title in a.text
            assert answer in gold[-1].text


def test_distractors_share_names_with_chain_people(task):
    people = [p for p in task.passages if p.id.startswith("person:")]
    surnames = [p.title.split()[-1] for p in people]
    assert len(set(surnames)) < len(surnames) / 2


def test_grading_is_em_for_correct_and_f1_for_score(task):
    q = task.questions()[0]
    right = task.grade(q, q.reference["answer"].upper() + ".")
    assert right.correct and right.score == 1.0
    assert not task.grade(q, "something else entirely").correct


def test_task_id_mhqa_loads_with_seed_and_size():
    t = load_task("mhqa", size=7, seed=2, config={"passages": SMALL})
    assert len(t.questions()) == 7 and t.questions()[0].id == "mhqa:2:0"


# --- limits (issue 8: asked for more questions than the world holds, it looped forever) ----


def test_a_world_can_be_drawn_to_exactly_its_capacity():
    world = World(0, WorldSize().scaled(48))
    n = world.capacity()
    assert len({q.prompt for q in generated_task(seed=0, size=n, passages=48).questions()}) == n


def test_asking_past_the_capacity_raises_naming_the_limit():
    limit = World(0, WorldSize().scaled(48)).capacity()
    with pytest.raises(ValueError, match=f"asked for 2005 questions.* at most {limit} distinct"):
        generated_task(seed=0, size=2005, passages=48)


@pytest.mark.parametrize("passages", [0, 8, 47, -5])
def test_a_world_below_the_minimum_is_refused_not_clamped(passages):
    with pytest.raises(ValueError, match=f"task.config.passages = {passages} is below the minimum"):
        generated_task(seed=0, size=5, passages=passages)


@pytest.mark.parametrize("size", [0, -1])
def test_a_non_positive_size_is_refused(size):
    with pytest.raises(ValueError, match="size must be a positive integer"):
        generated_task(seed=0, size=size, passages=SMALL)


def test_load_task_refuses_a_non_positive_size():
    from whale.tasks import UnknownTask

    with pytest.raises(UnknownTask, match="size must be a positive integer"):
        load_task("mhqa", size=-1, config={"passages": SMALL})
