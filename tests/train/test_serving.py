"""Serving freshly trained adapters: vLLM's runtime LoRA protocol against a stub server
(load, request by adapter name, unload the previous one), transformers in process on the tiny
model, and llama.cpp with the converted adapter on a real model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import require_model
from tests.servers import StubServer
from whale.models.base import ModelError, Sampling
from whale.train.serving import EmbeddedServing, InProcessServing, VLLMServing, adapter_digest

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
GREEDY = Sampling(max_tokens=16, temperature=0.0)


def _fake_adapter(folder: Path, payload: bytes) -> Path:
    """Adapter files for the protocol tests: vLLM (here, the stub) reads them, not whale."""
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(payload)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    return folder


def test_adapter_digest_is_content_based(tmp_path: Path) -> None:
    a = _fake_adapter(tmp_path / "a", b"weights-1")
    b = _fake_adapter(tmp_path / "b", b"weights-1")
    c = _fake_adapter(tmp_path / "c", b"weights-2")
    assert adapter_digest(a) == adapter_digest(b) != adapter_digest(c)
    assert len(adapter_digest(a)) == 12
    (c / "adapter_config.json").write_text('{"r": 16}')
    assert adapter_digest(c) != adapter_digest(_fake_adapter(tmp_path / "d", b"weights-2"))


def test_vllm_loads_serves_and_unloads(tmp_path: Path) -> None:
    a1 = _fake_adapter(tmp_path / "step1", b"one")
    a2 = _fake_adapter(tmp_path / "step2", b"two")
    n1, n2 = f"whale-{adapter_digest(a1)}", f"whale-{adapter_digest(a2)}"
    with StubServer([("ok", "5")]) as stub:
        serving = VLLMServing(stub.base_url, "Qwen/base", api_key="k")
        base = serving.serve(None)
        assert stub.lora_requests == [] and stub.requests[-1]["model"] == "Qwen/base"
        assert base.chat(MESSAGES, GREEDY).text == "5"

        m1 = serving.serve(a1)
        assert stub.lora_requests == [
            ("load_lora_adapter", {"lora_name": n1, "lora_path": str(a1)})
        ]
        assert stub.requests[-1]["model"] == n1  # serve() waited for a reply on the adapter
        m1.chat(MESSAGES, GREEDY)
        assert stub.requests[-1]["model"] == n1 and n1 in m1.name
        with pytest.raises(ModelError):
            base.chat(MESSAGES, GREEDY)  # replaced: the old model refuses

        m2 = serving.serve(a2)
        assert stub.lora_requests[1:] == [
            ("load_lora_adapter", {"lora_name": n2, "lora_path": str(a2)}),
            ("unload_lora_adapter", {"lora_name": n1}),
        ]
        assert stub.loras == {n2: str(a2)}
        m2.chat(MESSAGES, GREEDY)
        assert stub.requests[-1]["model"] == n2
        with pytest.raises(ModelError):
            m1.chat(MESSAGES, GREEDY)

        # The same bytes in another folder: same name; the load is asked again (a restarted
        # server would have forgotten it), answered "already loaded", nothing unloaded.
        same = shutil.copytree(a2, tmp_path / "copy")
        serving.serve(same)
        assert len(stub.lora_requests) == 4 and stub.lora_requests[3][0] == "load_lora_adapter"
        assert stub.loras == {n2: str(a2)}

        # A restarted server (its adapters forgotten): serving the same adapter loads it again.
        stub.loras.clear()
        serving.serve(a2)
        assert stub.loras == {n2: str(a2)}

        # Another serving object finds the name loaded already (400): the same weights.
        other = VLLMServing(stub.base_url, "Qwen/base")
        other.serve(a2)
        assert stub.lora_requests[-1][0] == "load_lora_adapter" and stub.loras == {n2: str(a2)}

        # Back to the base: the adapter goes.
        serving.serve(None)
        assert stub.lora_requests[-1] == ("unload_lora_adapter", {"lora_name": n2})
        assert stub.requests[-1]["model"] == "Qwen/base" and stub.loras == {}
        serving.serve(a1)
        serving.close()
        assert stub.lora_requests[-1] == ("unload_lora_adapter", {"lora_name": n1})
        assert stub.loras == {}
        other.close()  # its adapter is gone already (404): not an error


def test_vllm_without_runtime_lora_says_why(tmp_path: Path) -> None:
    with StubServer([("status", 404, "Not Found")]) as stub:
        serving = VLLMServing(stub.base_url + "/nowhere", "base")
        with pytest.raises(ModelError, match="answered 404"):
            serving.serve(_fake_adapter(tmp_path / "a", b"x"))
        serving.close()


def _tiny_adapter(base: Path, out: Path) -> Path:
    from tests.train.test_lora_gguf import save_random_adapter

    return save_random_adapter(base, out, std=0.5, r=4, alpha=8)


def test_in_process_serves_base_then_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = _tiny_adapter(tiny_model_dir, tmp_path / "ad")
    serving = InProcessServing(tiny_model_dir, "tiny", threads=1)
    try:
        base = serving.serve(None)
        assert base.name == "hf:tiny"
        base_text = base.chat(MESSAGES, GREEDY).text
        tuned = serving.serve(adapter)
        assert tuned.name == f"hf:tiny+{adapter_digest(adapter)}"
        assert tuned.chat(MESSAGES, GREEDY).text != base_text
        assert serving.timings["total_s"] > 0
    finally:
        serving.close()


@pytest.mark.model
@pytest.mark.slow
def test_embedded_serves_converted_adapter(tmp_path: Path) -> None:
    from tests.train.test_lora_gguf import save_random_adapter
    from whale.train.checkpoint import trainable_checkpoint

    gguf = require_model("smollm2-135m")
    adapter = save_random_adapter(trainable_checkpoint("smollm2-135m"), tmp_path / "ad", std=0.05)
    serving = EmbeddedServing(gguf, "smol", n_ctx=512, threads=1, timeout_s=60)
    try:
        base = serving.serve(None)
        assert base.name == "embedded:smol"
        base_text = base.chat(MESSAGES, GREEDY).text
        tuned = serving.serve(adapter)
        assert (adapter / "adapter.gguf").is_file()
        assert tuned.name.startswith("embedded:smol+") and tuned.name != base.name
        assert set(serving.timings) == {"convert_s", "ready_s", "ping_s", "start_s", "total_s",
                                        "restarts"}
        assert serving.timings["start_s"] >= serving.timings["ready_s"] > 0
        assert tuned.chat(MESSAGES, GREEDY).text != base_text
        with pytest.raises(ModelError, match="closed"):
            base.chat(MESSAGES, GREEDY)  # one live server per serving object
        again = serving.serve(None)
        assert again.chat(MESSAGES, GREEDY).text == base_text
    finally:
        serving.close()
    with pytest.raises(ModelError):
        again.chat(MESSAGES, GREEDY)
