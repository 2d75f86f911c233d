"""`VLLMServing` on the real Qwen2.5-Coder-0.5B (its transformers checkpoint, bf16 in vLLM):
the base answers a simple sum, an adapter loaded at run time changes the greedy reply, and
going back to the base gives the base's reply again. Needs the installed GGUF (`model`) and
its checkpoint (built on first use, ~45-80 s); the server takes ~30 s and ~5.7 GB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_model
from tests.train.test_lora_gguf import save_random_adapter
from tests.vllm.conftest import VLLMServer, start_vllm, stop_vllm
from whale.models.base import Sampling
from whale.train.serving import VLLMServing, adapter_digest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.model]

SUM = [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]
GREEDY = Sampling(max_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, VLLMServer]]:
    from whale.train.checkpoint import trainable_checkpoint

    require_model("qwen-coder-0.5b")
    ckpt = trainable_checkpoint("qwen-coder-0.5b")
    log = tmp_path_factory.mktemp("vllm_real") / "vllm.log"
    proc, server = start_vllm(ckpt, log, name="qwen-coder-0.5b", dtype="bfloat16",
                              max_model_len=2048, max_lora_rank=32)  # fmt: skip
    try:
        yield ckpt, server
    finally:
        stop_vllm(proc)


def test_real_model_base_then_adapter_then_base(real: tuple[Path, VLLMServer],
                                                tmp_path: Path) -> None:  # fmt: skip
    ckpt, server = real
    adapter = save_random_adapter(ckpt, tmp_path / "ad", std=0.05, r=32, alpha=64, seed=3)
    serving = VLLMServing(server.base_url)  # the base name is found from /models
    try:
        base = serving.serve(None)
        assert base.model == "qwen-coder-0.5b"  # type: ignore[attr-defined]
        first = base.chat(SUM, GREEDY)
        assert "42" in first.text and first.finish_reason == "stop"
        tuned = serving.serve(adapter)
        assert tuned.model == f"whale-{adapter_digest(adapter)}"  # type: ignore[attr-defined]
        assert tuned.chat(SUM, GREEDY).token_ids != first.token_ids
        again = serving.serve(None).chat(SUM, GREEDY)
        assert again.token_ids == first.token_ids and again.text == first.text
    finally:
        serving.close()
