"""A trained adapter served by a new embedded server, its GGUF written while the server starts
(issue 25): the served file is always the new one, a server that looked too early is started
again, and a failed conversion leaves no server behind. The real native llama-server on
SmolLM2-135M with real PEFT adapters (marked `model`)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

import whale.train.serving as serving_mod
from tests.conftest import require_model
from whale.models.base import Sampling
from whale.models.embedded import EmbeddedLlama, lora_digest
from whale.train.serving import EmbeddedServing

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
GREEDY = Sampling(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.train.test_lora_gguf import save_random_adapter
    from whale.train.checkpoint import trainable_checkpoint

    root = tmp_path_factory.mktemp("adapters")
    base = trainable_checkpoint("smollm2-135m")
    a = save_random_adapter(base, root / "a", std=0.05, seed=1)
    b = save_random_adapter(base, root / "b", std=0.05, seed=2)
    return a, b


def _serving() -> EmbeddedServing:
    from tests.models.test_native_server import require_native

    require_native()
    return EmbeddedServing(require_model("smollm2-135m"), "smol", n_ctx=256, threads=1,
                           timeout_s=120)  # fmt: skip


def _fresh(adapter: Path, tmp_path: Path) -> Path:
    """A copy of the adapter folder without its GGUF."""
    out = shutil.copytree(adapter, tmp_path / adapter.name)
    (out / "adapter.gguf").unlink(missing_ok=True)
    return out


def _slow_conversion(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    convert = serving_mod.adapter_to_gguf

    def slow(adapter: Path) -> Path:
        time.sleep(seconds)  # the server reaches its --lora file first
        return convert(adapter)

    monkeypatch.setattr(serving_mod, "adapter_to_gguf", slow)


def _servers_of_this_process() -> list[int]:
    """Live llama-server processes whose parent is this process."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"llama-server" in cmd:
            out.append(int(stat.parent.name))
    return out


def test_a_stale_gguf_in_the_folder_is_never_served(adapters, tmp_path, monkeypatch):
    a, b = (_fresh(x, tmp_path) for x in adapters)
    serving = _serving()
    try:
        served_b = serving.serve(b)
        b_text = served_b.chat(MESSAGES, GREEDY).text
        # Folder a holds b's GGUF (a weight step saved into a folder used before), and the
        # conversion is slow: a server that found the old file would serve b's weights.
        shutil.copy(b / "adapter.gguf", a / "adapter.gguf")
        stale = lora_digest(a / "adapter.gguf")
        _slow_conversion(monkeypatch, 3.0)
        served_a = serving.serve(a)
        assert served_a.name == f"embedded:smol+{lora_digest(a / 'adapter.gguf')}"
        assert not served_a.name.endswith(stale)
        assert served_a.chat(MESSAGES, GREEDY).text != b_text
    finally:
        serving.close()


def test_a_server_that_looked_before_the_file_was_there_is_started_again(
    adapters, tmp_path, monkeypatch
):
    a = _fresh(adapters[0], tmp_path)
    _slow_conversion(monkeypatch, 3.0)
    serving = _serving()
    try:
        model = serving.serve(a)
        assert serving.timings["restarts"] == 1
        assert model.name == f"embedded:smol+{lora_digest(a / 'adapter.gguf')}"
        assert model.chat(MESSAGES, GREEDY).text
    finally:
        serving.close()


def test_without_the_race_the_server_starts_once(adapters, tmp_path, monkeypatch):
    """A conversion done before the server looks starts the server once. The order is made
    exact here (the server is spawned only once the GGUF is in place): a real conversion
    takes ~0.1 s, which the 135M model's load may not outlast, and even a copy in
    milliseconds lost that race once on a busy CI machine, so the race itself is not
    asserted on."""
    a = _fresh(adapters[0], tmp_path)
    ready = serving_mod.adapter_to_gguf(shutil.copytree(a, tmp_path / "made"))
    converted = threading.Event()

    def instant(adapter: Path) -> Path:
        out = adapter / "adapter.gguf"
        tmp = out.with_name(".adapter.gguf.tmp")
        shutil.copyfile(ready, tmp)
        os.replace(tmp, out)
        converted.set()
        return out

    monkeypatch.setattr(serving_mod, "adapter_to_gguf", instant)
    serving = _serving()
    start = serving._start

    def start_once_converted(model: EmbeddedLlama) -> None:
        assert converted.wait(60)
        start(model)

    monkeypatch.setattr(serving, "_start", start_once_converted)
    try:
        model = serving.serve(a)
        assert serving.timings["restarts"] == 0
        assert model.name == f"embedded:smol+{lora_digest(a / 'adapter.gguf')}"
    finally:
        serving.close()


def test_a_failed_conversion_leaves_no_server(adapters, tmp_path, monkeypatch):
    a = _fresh(adapters[0], tmp_path)

    def broken(adapter: Path) -> Path:
        time.sleep(1.0)
        raise ValueError(f"{adapter}: DoRA is not supported")

    monkeypatch.setattr(serving_mod, "adapter_to_gguf", broken)
    serving = _serving()
    try:
        with pytest.raises(ValueError, match="DoRA"):
            serving.serve(a)
        assert serving._model is None and _servers_of_this_process() == []
    finally:
        serving.close()
