"""TransformersChat on the tiny local model (tests/tiny.py): sampling determinism, token ids,
finish reasons, stop strings, adapters. The tiny model's weights are random, so the tests
check properties of the backend, never the content of a reply."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny import make_tiny_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_hf"))


def test_tiny_template_round_trip(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "tool", "content": '{"x": 1}'},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n"
        '<|im_start|>tool\n{"x": 1}<|im_end|>\n'
    )
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    # The special tokens are single ids and the text survives encode -> decode.
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(tok.eos_token_id) == 4
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.decode(ids) == text
    assert 900 <= len(tok) <= 2048


MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def chat(tiny_dir: Path):
    from whale.models.hf import TransformersChat

    model = TransformersChat(tiny_dir, threads=1)
    yield model
    model.close()


def sample(temperature: float = 1.0, seed: int | None = 0, **kw):
    from whale.models.base import Sampling

    return Sampling(temperature=temperature, seed=seed, **kw)


def test_same_seed_same_sample_different_seed_differs(chat) -> None:
    a = chat.chat(MESSAGES, sample(seed=1, max_tokens=30))
    b = chat.chat(MESSAGES, sample(seed=1, max_tokens=30))
    c = chat.chat(MESSAGES, sample(seed=2, max_tokens=30))
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.token_ids != c.token_ids


def test_seeding_leaves_the_global_rng_alone(chat) -> None:
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    chat.chat(MESSAGES, sample(seed=7, max_tokens=5))
    assert torch.equal(torch.rand(3), expected)


def test_greedy_is_deterministic_and_ids_decode_to_text(chat) -> None:
    from transformers import AutoTokenizer

    a = chat.chat(MESSAGES, sample(temperature=0.0, seed=1, max_tokens=25))
    b = chat.chat(MESSAGES, sample(temperature=0.0, seed=2, max_tokens=25))
    assert a.token_ids == b.token_ids and a.token_ids
    tok = AutoTokenizer.from_pretrained(chat.model_dir)
    assert tok.decode(a.token_ids, skip_special_tokens=True) == a.text
    hot = chat.chat(MESSAGES, sample(seed=3, max_tokens=25))
    assert tok.decode(hot.token_ids, skip_special_tokens=True) == hot.text


def test_prompt_ids_are_the_chat_template_and_usage_counts(chat) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat.model_dir)
    expected = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)
    c = chat.chat(MESSAGES, sample(max_tokens=5))
    assert c.prompt_token_ids == list(expected["input_ids"])
    assert c.usage == {
        "prompt_tokens": len(c.prompt_token_ids),
        "completion_tokens": len(c.token_ids),
        "total_tokens": len(c.prompt_token_ids) + len(c.token_ids),
    }


def test_max_tokens_ends_with_length(chat) -> None:
    # Greedy on these random weights repeats one non-eos token (checked below), so the
    # reply runs to max_tokens.
    c = chat.chat(MESSAGES, sample(temperature=0.0, max_tokens=5))
    assert c.finish_reason == "length"
    assert len(c.token_ids) == 5 and c.usage["completion_tokens"] == 5
    assert chat._tokenizer.eos_token_id not in c.token_ids


def test_eos_ends_with_stop_and_keeps_the_eos_id(tiny_dir: Path, tmp_path: Path) -> None:
    """A zero final norm makes every logit 0, so greedy picks id 0, `<|endoftext|>`; listed as
    an eos id in the generation config (as Qwen2.5's is), it ends the reply at once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from whale.models.hf import TransformersChat

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    assert tok.convert_ids_to_tokens(0) == "<|endoftext|>"
    model.generation_config.eos_token_id = [tok.eos_token_id, 0]
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    c = TransformersChat(tmp_path).chat(MESSAGES, sample(temperature=0.0, max_tokens=20))
    assert c.token_ids == [0]
    assert c.finish_reason == "stop" and c.text == ""


def test_stop_string_cuts_the_text(chat) -> None:
    full = chat.chat(MESSAGES, sample(seed=5, max_tokens=40))
    stop = next(
        full.text[i : i + 3] for i in range(8, len(full.text) - 3) if full.text[i : i + 3].strip()
    )
    cut = full.text.index(stop)
    c = chat.chat(MESSAGES, sample(seed=5, max_tokens=40, stop=("no such stop", stop)))
    assert c.finish_reason == "stop"
    assert c.text == full.text[:cut]
    assert c.token_ids == full.token_ids[: len(c.token_ids)]
    decoded = chat._tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert decoded.startswith(full.text[:cut] + stop)
    assert len(c.token_ids) < len(full.token_ids)


def test_prompt_past_the_positions_overflows(chat) -> None:
    from whale.models.base import ContextOverflow

    long = [{"role": "user", "content": "the quick brown fox " * 300}]
    with pytest.raises(ContextOverflow):
        chat.chat(long, sample(max_tokens=5))


def test_timeout_and_unsupported_requests(chat) -> None:
    from whale.models.base import ModelError, ModelTimeout

    with pytest.raises(ModelTimeout):
        chat.chat(MESSAGES, sample(max_tokens=50), timeout=0.0)
    with pytest.raises(ModelError, match="grammar/tools"):
        chat.chat(MESSAGES, sample(grammar='root ::= "a"'))
    with pytest.raises(ModelError, match="grammar/tools"):
        chat.chat(MESSAGES, sample(tools="[]"))


def test_concurrent_calls_match_sequential_ones(chat) -> None:
    from concurrent.futures import ThreadPoolExecutor

    seeds = [11, 12, 13, 14]
    expected = [chat.chat(MESSAGES, sample(seed=s, max_tokens=8)).token_ids for s in seeds]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda s: chat.chat(MESSAGES, sample(seed=s, max_tokens=8)), seeds))
    assert [c.token_ids for c in got] == expected


def make_adapter(base: Path, out: Path, seed: int = 0) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
    peft_model.save_pretrained(out)
    return out


def test_adapter_changes_output_and_name(tiny_dir: Path, chat, tmp_path: Path) -> None:
    from whale.models.hf import TransformersChat, adapter_digest

    adapter = make_adapter(tiny_dir, tmp_path / "a0")
    other = make_adapter(tiny_dir, tmp_path / "a1", seed=1)
    tuned = TransformersChat(tiny_dir, adapter=adapter, alias="tiny")
    assert chat.name == f"hf:{tiny_dir.name}"
    assert tuned.name == f"hf:tiny+{adapter_digest(adapter)}"
    assert adapter_digest(adapter) != adapter_digest(other)
    assert len(adapter_digest(adapter)) == 12
    greedy = sample(temperature=0.0, max_tokens=20)
    assert tuned.chat(MESSAGES, greedy).token_ids != chat.chat(MESSAGES, greedy).token_ids
    assert tuned.chat(MESSAGES, greedy).token_ids == tuned.chat(MESSAGES, greedy).token_ids


def test_missing_model_or_adapter_is_not_found(tiny_dir: Path, tmp_path: Path) -> None:
    from whale.models.base import ModelNotFound
    from whale.models.hf import TransformersChat

    with pytest.raises(ModelNotFound):
        TransformersChat(tmp_path / "nothing")
    with pytest.raises(ModelNotFound):
        TransformersChat(tiny_dir, adapter=tmp_path)
