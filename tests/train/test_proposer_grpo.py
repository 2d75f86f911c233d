"""Proposer GRPO on the tiny model: one update moves the adapter, the reward is called once per
update with contexts × g completions, rows carry the timings, a killed run resumes without
redoing an update, and the embedded backend serves a fresh adapter each update."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from whale.models.base import Completion, Sampling
from whale.train.proposer.grpo import (
    ROWS_FILE,
    GRPOSettings,
    UpdateStats,
    train_grpo,
    update_schedule,
)
from whale.train.sft import LoraSettings

PROMPTS = [
    ("rg:a/p1/0", "What is the sum of two and three?"),
    ("rg:b/p2/0", "Who wrote the letter?"),
]


def settings(**kw) -> GRPOSettings:
    base = dict(
        lora=LoraSettings(r=4, alpha=8), g=4, contexts_per_update=2, updates=1, lr=1e-3,
        max_completion=10, threads=1, gradient_checkpointing=False,
    )  # fmt: skip
    return GRPOSettings(**(base | kw))


class LetterReward:
    """Fraction of 'e' in the text: random completions differ, so groups have variance."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str]]] = []

    def __call__(self, contexts, texts) -> list[float]:
        self.calls.append((list(contexts), list(texts)))
        return [t.count("e") / max(1, len(t)) for t in texts]


def tensors(adapter: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))


def rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / ROWS_FILE).read_text().splitlines()]


def test_settings_validate():
    settings().validate()
    for bad in (dict(g=1), dict(micro_batch=3), dict(lr=0.0), dict(generation="vllm"),
                dict(epsilon=0.0), dict(updates=0), dict(temperature=0.0)):  # fmt: skip
        with pytest.raises(ValueError):
            settings(**bad).validate()


def test_schedule_cycles_a_small_pool():
    plan = update_schedule(PROMPTS + [("c", "x")], contexts_per_update=5, updates=3, seed=1)
    assert [len(u) for u in plan] == [5, 5, 5]
    flat = [cid for u in plan for cid, _ in u]
    for start in range(0, 15 - 2, 3):  # each run of 3 is one permutation of the pool
        assert sorted(flat[start : start + 3]) == ["c", "rg:a/p1/0", "rg:b/p2/0"]
    assert plan == update_schedule(PROMPTS + [("c", "x")], 5, 3, seed=1)
    assert plan != update_schedule(PROMPTS + [("c", "x")], 5, 3, seed=2)


@pytest.mark.slow
def test_one_update_moves_the_adapter_and_calls_the_reward_once(tiny_model_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    init = tmp_path / "init"
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")  # fmt: skip
    get_peft_model(base, config).save_pretrained(str(init))
    before = tensors(init)

    reward = LetterReward()
    out = tmp_path / "run"
    adapter, stats = train_grpo(PROMPTS, reward, tiny_model_dir, settings(), out,
                                init_adapter=init, say=lambda m: None)  # fmt: skip
    after = tensors(adapter)
    assert after.keys() == before.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert len(reward.calls) == 1
    contexts, texts = reward.calls[0]
    assert Counter(contexts) == {"rg:a/p1/0": 4, "rg:b/p2/0": 4}
    assert len(set(contexts[:4])) == len(set(contexts[4:])) == 1  # a group's g are together
    assert len(stats) == 1 and isinstance(stats[0], UpdateStats)
    (row,) = rows(out)
    assert row == json.loads(json.dumps(stats[0].__dict__))
    assert row["update"] == 1 and row["rewards"] == reward(contexts, texts)
    assert row["generation_s"] > 0 and row["gradient_s"] > 0 and row["reward_s"] >= 0
    assert 8 <= row["completion_tokens"] <= 8 * 10
    assert row["token_mismatches"] == 0 and row["serve_s"] == 0.0


class Killed(RuntimeError):
    pass


@pytest.mark.slow
def test_a_killed_run_resumes_at_the_next_update(tiny_model_dir, tmp_path):
    s = settings(updates=2)

    def kill_after_first(msg: str) -> None:
        if msg.startswith("grpo update 1/2"):
            raise Killed(msg)

    reward = LetterReward()
    out = tmp_path / "run"
    with pytest.raises(Killed):
        train_grpo(PROMPTS, reward, tiny_model_dir, s, out, say=kill_after_first)
    assert len(reward.calls) == 1
    assert [r["update"] for r in rows(out)] == [1]
    said: list[str] = []
    adapter, stats = train_grpo(PROMPTS, reward, tiny_model_dir, s, out, say=said.append)
    assert len(reward.calls) == 2  # update 2 only: update 1 was not redone
    assert said[0] == "grpo: resuming after update 1 of 2"
    assert [r.update for r in stats] == [1, 2] == [r["update"] for r in rows(out)]
    assert (adapter / "adapter_model.safetensors").is_file()

    # the same run, never killed: the resumed one sampled and scored exactly the same
    whole = LetterReward()
    train_grpo(PROMPTS, whole, tiny_model_dir, s, tmp_path / "whole", say=lambda m: None)
    assert whole.calls == reward.calls

    # a finished run returns at once; a different run in the same folder is refused
    again = LetterReward()
    assert train_grpo(PROMPTS, again, tiny_model_dir, s, out, say=lambda m: None)[0] == adapter
    assert again.calls == []
    with pytest.raises(ValueError, match="different GRPO run"):
        train_grpo(PROMPTS, again, tiny_model_dir, settings(updates=3), out, say=lambda m: None)


WORDS = ["the quick brown fox", "seven eight", "red green blue", "a tree", "where were we"]


class FakeChat:
    name = "fake"

    def __init__(self, tok, log: list, miscount_all: bool = False) -> None:
        self.tok, self.log, self.miscount_all = tok, log, miscount_all

    def chat(self, messages, sampling: Sampling, timeout=None) -> Completion:
        # the text names its prompt (its first word), so the reward's pairing can be checked
        text = f"{WORDS[sampling.seed % len(WORDS)]} {messages[-1]['content'].split()[0]}"
        n = len(self.tok(text, add_special_tokens=False)["input_ids"])
        miscount = (
            self.miscount_all or sampling.seed % 3 == 0
        )  # a server whose tokens the rebuild would not match
        self.log.append((messages, sampling, miscount, text))
        return Completion(text, "stop", {"completion_tokens": n + 5 * miscount})


class FakeServing:
    """Records each adapter dir served (and that it held a PEFT adapter at that moment)."""

    def __init__(self, tok, miscount_all: bool = False) -> None:
        self.tok, self.served, self.calls, self.miscount_all = tok, [], [], miscount_all

    def serve(self, adapter):
        self.served.append((Path(adapter), (Path(adapter) / "adapter_config.json").is_file()))
        return FakeChat(self.tok, self.calls, self.miscount_all)

    def close(self) -> None:
        pass


@pytest.mark.slow
def test_embedded_backend_serves_each_update_and_its_texts_reach_the_reward(
    tiny_model_dir, tmp_path
):
    from transformers import AutoTokenizer

    serving = FakeServing(AutoTokenizer.from_pretrained(tiny_model_dir))
    reward = LetterReward()
    s = settings(updates=2, g=2, generation="embedded", temperature=0.7, max_completion=12)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="SolverServing"):
        train_grpo(PROMPTS, reward, tiny_model_dir, s, out, say=lambda m: None)
    _, stats = train_grpo(PROMPTS, reward, tiny_model_dir, s, out, serving=serving,
                          say=lambda m: None)  # fmt: skip
    assert [d.name for d, _ in serving.served] == ["step_0", "step_1"]
    assert all(ok for _, ok in serving.served)
    assert len(reward.calls) == 2 and len(serving.calls) == 8
    msgs = dict(PROMPTS)
    for u, (contexts, texts) in enumerate(reward.calls):
        calls = serving.calls[4 * u : 4 * u + 4]  # this update's requests, in any order
        assert Counter(texts) == Counter(c[3] for c in calls)
        assert sorted(contexts) == ["rg:a/p1/0"] * 2 + ["rg:b/p2/0"] * 2
        for ctx, text in zip(contexts, texts, strict=True):
            assert text.endswith(" " + msgs[ctx].split()[0])
        assert all(c[0] == [{"role": "user", "content": c[0][0]["content"]}] for c in calls)
        assert stats[u].token_mismatches == sum(c[2] for c in calls)
        assert stats[u].serve_s > 0 and stats[u].generation_s >= stats[u].serve_s
    samplings = [c[1] for c in serving.calls]
    assert all(x.temperature == 0.7 and x.max_tokens == 12 and x.grammar is None for x in samplings)
    assert len({x.seed for x in samplings}) == 8
    assert sum(r.token_mismatches for r in stats) > 0  # the seeds did exercise the miscount
    assert list((out / "serving").iterdir()) == [out / "serving" / "step_1"]  # old ones removed


@pytest.mark.slow
def test_completions_the_server_miscounted_are_not_trained_on(tiny_model_dir, tmp_path):
    """Every rebuilt completion disagrees with the server's count: all are masked out of the
    loss, the gradient is zero and AdamW leaves the adapter as it was (LoRA's B stays 0)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    s = settings(g=2, generation="embedded")
    adapters = {}
    for miscount in (True, False):
        serving = FakeServing(tok, miscount_all=miscount)
        adapter, (row,) = train_grpo(PROMPTS, LetterReward(), tiny_model_dir, s,
                                     tmp_path / str(miscount), serving=serving,
                                     say=lambda m: None)  # fmt: skip
        assert row.token_mismatches == (4 if miscount else sum(c[2] for c in serving.calls))
        adapters[miscount] = tensors(adapter)
    b = [k for k in adapters[True] if "lora_B" in k]
    assert b and all(torch.count_nonzero(adapters[True][k]) == 0 for k in b)
    assert any(torch.count_nonzero(adapters[False][k]) > 0 for k in b)
