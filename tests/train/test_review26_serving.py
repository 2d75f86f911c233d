"""review26: the adapter GGUF written while the server starts, on the python server."""

from __future__ import annotations

from pathlib import Path

import whale.train.serving as serving_mod
from whale.models.base import Completion, ModelError


class FakeLlama:
    """A server that, like llama-cpp-python's, exits when its --lora_path file is not there."""

    starts: list[bool] = []

    def __init__(self, gguf, alias, lora=None, lora_pending=False, **kw):
        self.lora, self.name, self.ready_s = lora, f"embedded:{alias}", 0.0

    def start(self):
        there = self.lora is None or Path(self.lora).is_file()
        FakeLlama.starts.append(there)
        if not there:
            raise ModelError(
                "llama.cpp server exited (1):\nTraceback (most recent call last):\n"
                f"RuntimeError: Failed to initialize LoRA adapter from lora path: {self.lora}"
            )

    def chat(self, messages, sampling, timeout=None):
        return Completion("x", "stop", {})

    def name_by_lora(self, digest=None):
        self.name += f"+{digest}"

    def close(self, final=True):
        pass


def test_review26_the_python_server_that_looked_too_early_is_started_again(tmp_path, monkeypatch):
    adapter = tmp_path / "step_0001"
    adapter.mkdir()

    def convert(a: Path) -> Path:  # slower than the server's look for the file
        while not FakeLlama.starts:
            pass
        (a / "adapter.gguf").write_bytes(b"gguf")
        return a / "adapter.gguf"

    monkeypatch.setattr(serving_mod, "EmbeddedLlama", FakeLlama)
    monkeypatch.setattr(serving_mod, "adapter_to_gguf", convert)
    monkeypatch.setattr(serving_mod, "lora_digest", lambda p: "d")
    serving = serving_mod.EmbeddedServing(tmp_path / "m.gguf", "m")
    model = serving.serve(adapter)
    assert FakeLlama.starts == [False, True] and serving.timings["restarts"] == 1
    assert model.name == "embedded:m+d"
