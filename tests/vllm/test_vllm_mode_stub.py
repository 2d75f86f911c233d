"""GRPO's generation "vllm" against tests/servers.py's StubServer, in the default run (no vLLM
needed): settings validation, the adapter of the update loaded under its digest name and
unloaded at the end, and training on the ids the server returned (the stub's made-up ids,
where vLLM puts them). The real server: tests/vllm/test_vllm_grpo.py (`make test-vllm`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import whale.train.proposer.grpo as grpo
import whale.train.proposer.grpo_rollout as rollout_mod
from tests.servers import StubServer
from tests.tiny import make_tiny_model
from whale.train.sft import LoraSettings


def test_vllm_generation_needs_a_url() -> None:
    with pytest.raises(ValueError, match="vllm_url"):
        grpo.GRPOSettings(generation="vllm").validate()
    with pytest.raises(ValueError, match="vllm_url"):
        grpo.GRPOSettings(generation="vllm", vllm_url="127.0.0.1:8000").validate()
    grpo.GRPOSettings(generation="vllm", vllm_url="http://127.0.0.1:8000/v1").validate()


@pytest.mark.slow
def test_vllm_generation_trains_on_the_servers_ids(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from transformers import AutoTokenizer

    model = make_tiny_model(tmp_path / "tiny")
    eot = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids("<|im_end|>")
    batches: list[dict[str, Any]] = []
    real = grpo.make_rollout

    def spy(*a: Any, **kw: Any) -> Any:
        rollout = real(*a, **kw)

        def wrapped(prompts: list[Any], trainer: Any) -> dict[str, Any]:
            batches.append(rollout(prompts, trainer))
            return batches[-1]

        return wrapped

    monkeypatch.setattr(grpo, "make_rollout", spy)
    # The stub tokenizes every prompt as [7, 8, 9]: here the local template agrees with it (a
    # server with the same tokenizer and chat template); the test below covers a disagreement.
    monkeypatch.setattr(grpo, "template_ids", lambda tokenizer, prompt: [7, 8, 9])
    monkeypatch.setattr(rollout_mod, "template_ids", lambda tokenizer, prompt: [7, 8, 9])
    texts = iter(["a", "bb", "ccc", "dddd"] * 10)  # the texts differ, the stub's ids do not
    with StubServer([("ok", next(texts)) for _ in range(12)]) as stub:
        settings = grpo.GRPOSettings(
            lora=LoraSettings(r=4, alpha=8), g=2, contexts_per_update=2, updates=1, lr=1e-3,
            max_completion=8, threads=1, gradient_checkpointing=False, generation="vllm",
            vllm_url=stub.base_url, vllm_model="tiny", concurrency=1,
        )  # fmt: skip
        prompts = [("c1", "What is two and three?"), ("c2", "Who wrote the letter?")]
        _, (row,) = grpo.train_grpo(prompts, lambda c, t: [float(len(x)) for x in t], model,
                                    settings, tmp_path / "run", say=lambda m: None)  # fmt: skip
        (load, ping_models) = stub.lora_requests[0], {r["model"] for r in stub.requests}
        assert load[0] == "load_lora_adapter" and load[1]["lora_name"].startswith("whale-")
        assert load[1]["lora_path"] == str((tmp_path / "run" / "serving" / "step_0").resolve())
        assert ping_models == {load[1]["lora_name"]}  # every request went to the adapter
        assert stub.lora_requests[-1] == ("unload_lora_adapter",
                                          {"lora_name": load[1]["lora_name"]})  # fmt: skip
        assert stub.loras == {}
        assert all(r.get("return_token_ids") for r in stub.requests)
    (batch,) = batches
    assert batch["prompt_ids"] == [[7, 8, 9]] * 4  # the server's prompt ids
    assert batch["completion_ids"] == [[41, 42, eot]] * 4  # its ids, + end of turn on a stop
    assert row.token_mismatches == 0 and row.completion_tokens == 12
    # The same ids with opposite advantages in each group: the gradient cancels. Trained on
    # the texts' encodings ("a", "bb", ...) it would not.
    assert row.rewards == [2.0, 3.0, 4.0, 1.0] and row.grad_norm is not None
    assert row.grad_norm < 1e-6


def test_server_ids_that_are_not_this_tokenizers_tokens_are_not_trained_on() -> None:
    """Garbage ids from a server (negative, out of the vocabulary, too many) are ignored and
    the completion is rebuilt from its text (masked unless its count agrees)."""
    from types import SimpleNamespace

    class Tok:
        eos_token_id = 2

        def __len__(self) -> int:
            return 100

        def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, Any]:
            return {"input_ids": [5] * len(text)}

    def c(ids: Any, text: str = "ab", n: int = 2) -> Any:
        return SimpleNamespace(token_ids=ids, text=text, finish_reason="stop",
                               usage={"completion_tokens": n})  # fmt: skip

    tok, eot = Tok(), 3
    assert rollout_mod.completion_ids(c([10, 11]), tok, eot, 8) == ([10, 11, 3], True)
    for bad in ([-7, 10], [10, 10**12], [10] * 20, [1.5, 2]):
        ids, ok = rollout_mod.completion_ids(c(bad), tok, eot, 8)
        assert ids == [5, 5, 3] and ok  # rebuilt from the text, whose count agrees
    ids, ok = rollout_mod.completion_ids(c([-1], n=7), tok, eot, 8)
    assert not ok  # rebuilt, and the server's count disagrees: masked
