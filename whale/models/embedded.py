"""The embedded default backend: `llama_cpp.server` on a GGUF file, on 127.0.0.1.

The server starts on the first call only (a harness that never calls the model never starts
one), listens on a free port, is waited on until `/v1/models` answers, and is stopped when the
process exits or `close()` is called. Calls go through `OpenAICompatible`.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from whale.models.base import Completion, Message, ModelError, Sampling
from whale.models.openai_compat import OpenAICompatible


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedLlama:
    def __init__(
        self,
        gguf: str | Path,
        alias: str | None = None,
        n_ctx: int = 4096,
        threads: int | None = None,
        ready_timeout_s: float = 180.0,
        timeout_s: float = 120.0,
    ) -> None:
        self.gguf = Path(gguf)
        self.alias = alias or self.gguf.stem
        self.name = f"embedded:{self.alias}"
        self.n_ctx, self.threads = n_ctx, threads or int(os.environ.get("WHALE_THREADS", "2"))
        self.ready_timeout_s, self.timeout_s = ready_timeout_s, timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: OpenAICompatible | None = None
        self._lock = threading.Lock()
        self._serial = threading.Lock()
        self.log_path: Path | None = None

    @property
    def started(self) -> bool:
        return self._client is not None

    def start(self) -> OpenAICompatible:
        with self._lock:
            if self._client is not None:
                return self._client
            if not self.gguf.exists():
                raise ModelError(f"GGUF file {self.gguf} does not exist")
            port = free_port()
            log = Path(os.environ.get("TMPDIR", "/tmp")) / f"whale-llama-{port}.log"
            self.log_path = log
            cmd = [
                sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf),
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(self.n_ctx),
                "--n_threads", str(self.threads), "--model_alias", self.alias,
            ]  # fmt: skip
            with open(log, "wb") as f:
                self._proc = subprocess.Popen(
                    cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
                )
            atexit.register(self.close)
            base = f"http://127.0.0.1:{port}/v1"
            deadline = time.monotonic() + self.ready_timeout_s
            while True:
                if self._proc.poll() is not None:
                    tail = log.read_text(errors="replace")[-2000:]
                    raise ModelError(f"llama.cpp server exited ({self._proc.returncode}):\n{tail}")
                try:
                    if httpx.get(f"{base}/models", timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.close()
                    raise ModelError(f"llama.cpp server not ready after {self.ready_timeout_s} s")
                time.sleep(0.1)
            self._client = OpenAICompatible(
                self.alias, base, api_key="none", timeout_s=self.timeout_s
            )
            return self._client

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion:
        # llama_cpp.server decodes one request at a time. Queue here, so that a call's timeout
        # counts its own decoding and not the wait behind other calls.
        client = self.start()
        with self._serial:
            return client.chat(messages, sampling, timeout)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if self._client is not None:
            self._client.close()
            self._client = None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, 9)
                proc.wait()
