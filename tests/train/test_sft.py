"""The LoRA trainer on the tiny local model: loss on completion tokens only, token-normalized,
falls with training, resumes exactly from a save."""

from __future__ import annotations

import math

import pytest

from whale.train.data import IGNORE, Example, end_of_turn_id, template_ids
from whale.train.sft import (
    EmptyTrainingSet,
    LoraSettings,
    LoraTrainer,
    SFTSettings,
    trained_positions,
)

PAIRS = [
    ("What is the sum of two and three?", "It is five."),
    ("What is seven times eight?", "It is fifty six."),
    ("Which planet is largest?", "Answer: 42"),
    ("How many legs has a spider?", "The answer is 17."),
    ("Who wrote the letter?", "a clever girl who found that one coin was missing."),
]
LORA = LoraSettings(r=4, alpha=8)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def examples(tok) -> list[Example]:
    out = []
    for i, (q, a) in enumerate(PAIRS):
        p = template_ids(tok, [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": q}])
        c = tok(a, add_special_tokens=False)["input_ids"] + [end_of_turn_id(tok)]
        out.append(Example(p + c, [IGNORE] * len(p) + c, f"q{i}#0"))
    return out


def trainer(model_dir, lr=1e-2, batch_size=2, micro_batch=1, adapter=None, seed=0):
    # dtype fp32: the arithmetic checked here is fp32's (bf16: test_dtype.py)
    sft = SFTSettings(
        lr=lr, batch_size=batch_size, micro_batch=micro_batch, threads=1, dtype="fp32"
    )
    return LoraTrainer(model_dir, LORA, sft, seed=seed, adapter=adapter)


def test_loss_falls_with_training(tiny_model_dir, examples):
    t = trainer(tiny_model_dir, lr=5e-2)
    try:
        before = t.loss(examples)
        stats = [t.train(examples) for _ in range(8)]
        after = t.loss(examples)
    finally:
        t.close()
    assert after < before - 0.2, (before, after)  # a random model: it falls slowly
    assert stats[-1].loss < stats[0].loss
    s = stats[0]
    assert s.examples == 5 and s.optimizer_steps == 3  # 2 + 2 + 1
    assert s.tokens == sum(trained_positions(e) for e in examples) > 0
    assert s.wall_s > 0 and math.isclose(s.tokens_per_s, s.tokens / s.wall_s)


def test_loss_is_the_token_mean_over_completion_tokens(tiny_model_dir, examples):
    """At start LoRA's B is zero, so the adapted model is the base model: the trainer's loss
    must be transformers' own NLL over the completion positions only, pooled by token."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    comp_sum = all_sum = 0.0
    comp_n = all_n = 0
    with torch.no_grad():
        for e in examples:
            logits = base(input_ids=torch.tensor([e.input_ids])).logits[0, :-1]
            nll = F.cross_entropy(logits, torch.tensor(e.input_ids[1:]), reduction="none")
            keep = torch.tensor(e.labels[1:]) != IGNORE
            comp_sum, comp_n = comp_sum + float(nll[keep].sum()), comp_n + int(keep.sum())
            all_sum, all_n = all_sum + float(nll.sum()), all_n + len(nll)
    t = trainer(tiny_model_dir)
    try:
        got = t.loss(examples)
        t._fast_head = False  # the model's full forward computes the same loss
        full = t.loss(examples)
    finally:
        t.close()
    assert got == pytest.approx(comp_sum / comp_n, rel=1e-5)
    assert full == pytest.approx(got, rel=1e-5)
    assert abs(got - all_sum / all_n) > 1e-3  # the mask matters: prompt tokens are left out


def test_step_gradient_is_of_the_token_mean_over_the_step(tiny_model_dir, examples):
    """Token-normalized across the accumulated micro batches (as TRL/transformers do), not a
    mean of per-example means: the gradient handed to AdamW is that of sum(NLL) / tokens of
    the whole step, computed here independently from the model's full logits."""
    import torch
    import torch.nn.functional as F

    step = [examples[0], examples[4]]  # completions of different lengths
    assert trained_positions(step[0]) != trained_positions(step[1])
    sft = SFTSettings(lr=1e-2, batch_size=2, max_grad_norm=0.0, threads=1, dtype="fp32")
    t = LoraTrainer(tiny_model_dir, LORA, sft, seed=0)
    seen = []
    original = t.optimizer.step

    def check_then_step(*a, **k):
        got = [p.grad.clone() for p in t.params]
        total = sum(trained_positions(e) for e in step)
        ref = 0
        for e in step:
            logits = t.model(input_ids=torch.tensor([e.input_ids])).logits[0, :-1]
            nll = F.cross_entropy(logits, torch.tensor(e.labels[1:]), reduction="sum",
                                  ignore_index=IGNORE)
            ref = ref + nll / total
        want = torch.autograd.grad(ref, t.params)
        seen.append(max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)))
        seen.append(max(float(w.abs().max()) for w in want))
        return original(*a, **k)

    t.optimizer.step = check_then_step
    try:
        t.train(step)
    finally:
        t.close()
    diff, scale = seen
    assert scale > 0 and diff <= 1e-5 * scale, (diff, scale)


def test_masked_tokens_get_no_gradient(tiny_model_dir, examples, tok):
    """Masked tokens appended after each completion (in the causal future of every trained
    token) change nothing: same step losses, same weights after. Unmasked, they would."""
    tail = tok("Monday Tuesday Wednesday", add_special_tokens=False)["input_ids"]
    padded = [Example(e.input_ids + tail, e.labels + [IGNORE] * len(tail), e.source)
              for e in examples]
    unmasked = [Example(e.input_ids + tail, e.labels + tail, e.source) for e in examples]
    results = []
    for data in (examples, padded, unmasked):
        t = trainer(tiny_model_dir)
        try:
            step = t.train(data).loss
            results.append((step, t.loss(examples)))
        finally:
            t.close()
    (s0, l0), (s1, l1), (s2, l2) = results
    assert s1 == pytest.approx(s0, rel=1e-6) and l1 == pytest.approx(l0, rel=1e-6)
    assert abs(l2 - l0) > 1e-4


def test_padded_micro_batches_train_like_pad_free(tiny_model_dir, examples):
    losses = []
    for micro in (1, 2):
        t = trainer(tiny_model_dir, micro_batch=micro)
        try:
            losses.append((t.train(examples).loss, t.loss(examples)))
        finally:
            t.close()
    assert losses[1][0] == pytest.approx(losses[0][0], rel=1e-4)
    assert losses[1][1] == pytest.approx(losses[0][1], rel=1e-4)


def _lengths(batches) -> list[list[int]]:
    return [[len(e.input_ids) for e in mb] for mb in batches]


def test_micro_batches_hold_at_most_their_examples_and_padded_tokens():
    from whale.train.sft import micro_batches

    step = [Example([1] * n, [1] * n, f"e{n}#0") for n in (300, 100, 120, 110, 900, 2000, 130)]
    assert _lengths(micro_batches(step, 8, 1024)) == [[100, 110, 120, 130], [300], [900], [2000]]
    assert _lengths(micro_batches(step, 2, 1024)) == [[100, 110], [120, 130], [300], [900],
                                                      [2000]]  # fmt: skip
    assert _lengths(micro_batches(step, 8, 100)) == [[100], [110], [120], [130], [300], [900],
                                                     [2000]]  # fmt: skip
    for most, tokens in ((8, 1024), (3, 500), (8, 50)):
        batches = micro_batches(step, most, tokens)
        assert sorted(e.source for mb in batches for e in mb) == sorted(e.source for e in step)
        assert all(len(mb) == 1 or len(mb) * max(map(len, (e.input_ids for e in mb))) <= tokens
                   for mb in batches)  # fmt: skip
    assert _lengths(micro_batches(step, 1, 1024)) == [[300], [100], [120], [110], [900], [2000],
                                                      [130]]  # one each, in order  # fmt: skip


def test_review_a_micro_batch_may_fill_its_token_limit_exactly():
    from whale.train.sft import micro_batches

    step = [Example([1] * n, [1] * n, f"e{i}#0") for i, n in enumerate((256, 250, 256, 256))]
    assert _lengths(micro_batches(step, 8, 1024)) == [[250, 256, 256, 256]]  # 4 x 256 = 1,024
    assert _lengths(micro_batches(step, 8, 1023)) == [[250, 256, 256], [256]]


def test_resume_continues_with_weights_and_optimizer_state(tiny_model_dir, examples, tmp_path):
    a = trainer(tiny_model_dir, batch_size=2)
    try:
        a.train(examples)
        a.train(examples)
        saved = a.save(tmp_path / "step2")
        assert not (tmp_path / "step2.tmp").exists()
        assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt",
                "trainer_state.json"} <= {p.name for p in saved.iterdir()}
        b = trainer(tiny_model_dir, batch_size=2, adapter=saved)
        try:
            assert b.loss(examples) == a.loss(examples)
            assert (b.passes, b.optimizer_steps) == (2, 6)
            sa, sb = a.train(examples), b.train(examples)
            assert sb.loss == pytest.approx(sa.loss, rel=1e-6)
            want = a.loss(examples)
            assert b.loss(examples) == pytest.approx(want, rel=1e-6)
        finally:
            b.close()
    finally:
        a.close()
    # the same weights with a fresh AdamW go elsewhere: the state above was really restored
    c = trainer(tiny_model_dir, batch_size=2, adapter=saved)
    try:
        c.optimizer.state.clear()
        c.train(examples)
        assert abs(c.loss(examples) - want) > 1e-5
    finally:
        c.close()


def test_save_over_an_existing_save(tiny_model_dir, examples, tmp_path):
    t = trainer(tiny_model_dir)
    try:
        t.train(examples)
        t.save(tmp_path / "a")
        t.train(examples)
        t.save(tmp_path / "a")
        want = t.loss(examples)
    finally:
        t.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    again = trainer(tiny_model_dir, adapter=tmp_path / "a")
    try:
        assert again.loss(examples) == want and again.passes == 2
    finally:
        again.close()


def test_resume_refuses_other_lora_settings(tiny_model_dir, examples, tmp_path):
    t = trainer(tiny_model_dir)
    try:
        t.train(examples)
        t.save(tmp_path / "a")
    finally:
        t.close()
    with pytest.raises(ValueError, match="trained with LoRA"):
        LoraTrainer(tiny_model_dir, LoraSettings(r=8, alpha=8), SFTSettings(threads=1), 0,
                    adapter=tmp_path / "a")


def test_empty_or_all_masked_sets_are_refused(tiny_model_dir, examples):
    t = trainer(tiny_model_dir)
    try:
        with pytest.raises(EmptyTrainingSet, match="no training examples"):
            t.train([])
        masked = [Example(e.input_ids, [IGNORE] * len(e.labels), e.source) for e in examples]
        with pytest.raises(EmptyTrainingSet, match="every label"):
            t.train(masked)
        with pytest.raises(EmptyTrainingSet):
            t.loss(masked)
        # only the last label unmasked is still one trained token; only the first is none
        first = [Example(e.input_ids, [e.input_ids[0]] + [IGNORE] * (len(e.labels) - 1),
                         e.source) for e in examples]
        with pytest.raises(EmptyTrainingSet):
            t.train(first)
        assert t.train(masked + examples[:1]).examples == 1
    finally:
        t.close()


def test_examples_over_max_len_are_refused(tiny_model_dir, examples):
    t = LoraTrainer(tiny_model_dir, LORA, SFTSettings(max_len=8, threads=1), seed=0)
    try:
        with pytest.raises(ValueError, match="over max_len 8"):
            t.train(examples)
    finally:
        t.close()
