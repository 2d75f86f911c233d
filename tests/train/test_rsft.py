"""The weight phase's prompt stream."""

from whale.tasks import Question
from whale.train.rsft import step_prompts


def test_a_step_across_an_epoch_boundary_holds_distinct_prompts():
    """13 prompts in steps of 3: the 5th step crosses into epoch 2 and would repeat a prompt
    (one sample paid twice, found by an attack); it skips the repeat instead."""
    pool = [Question(id=f"q{i}", prompt=f"p{i}", reference=None) for i in range(13)]
    position, seen = 0, []
    for _ in range(20):
        prompts, consumed = step_prompts(pool, position, 3, seed=0)
        ids = [q.id for q in prompts]
        assert len(ids) == len(set(ids)) == 3 and consumed >= 3
        seen += ids
        position += consumed
    assert set(seen) == {q.id for q in pool}
