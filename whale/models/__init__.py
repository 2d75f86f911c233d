"""Chat models: one protocol, backends for OpenAI-compatible servers and the embedded llama.cpp
default, a response cache, and the catalog of demo models that ship in registry packages."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from whale.config import above, at_least, check_choices
from whale.models.base import (
    ChatModel,
    Completion,
    ContextOverflow,
    Message,
    ModelError,
    ModelNotFound,
    ModelTimeout,
    ModelUnreachable,
    PrefixCache,
    Sampling,
    Speculative,
)
from whale.models.cache import CachedModel
from whale.models.catalog import CATALOG, DEFAULT_MODEL, UnknownModel, is_installed, model_path
from whale.models.embedded import EmbeddedLlama
from whale.models.fleet import Fleet, check_endpoints
from whale.models.hf import TransformersChat, adapter_digest
from whale.models.openai_compat import OpenAICompatible


@dataclass
class ModelConfig:
    """`name`: a catalog name (`qwen-coder-0.5b`), a path to a .gguf file, a transformers
    checkpoint folder (in-process generation: slow, exact, for trained weights and tests), or
    the served model name when `base_url` points at an OpenAI-compatible server. `name@URL`
    sets both.

    `endpoints`: base URLs of OpenAI-compatible servers that all serve `name` with the same
    weights; 2+ make a `Fleet` (load-balanced, failover, named `fleet:{name}` for the cache),
    one is the same as `base_url`. `max_concurrency`: calls in flight per fleet endpoint
    (0: unbounded). `probe_s`: how often a fleet probes an endpoint that is down.
    `attempt_timeout_s`: a fleet endpoint that gives one call no reply within this many
    seconds is marked down and the call tried on another (0: off; a timed-out call still has
    its endpoint probed, and marked down when the probe gets no answer either).

    `prefix_cache`: which calls the embedded native server may answer from a prompt prefix it
    has processed before (llama-server's `cache_prompt`, and the G samples of one prompt in
    one request): "sampled" (temperature > 0; the default), "all" (greedy calls too: their
    replies may then change, docs/models.md), "off". Other backends cache as their servers
    do (vLLM: `--enable-prefix-caching`).

    `speculative`: the embedded native server's speculative decoding, "off" (the default) or
    "ngram" (tokens drafted from n-grams of the context itself and kept where the model's own
    sampling confirms them: the same distribution, faster where a reply copies its prompt, as
    a proposer rewriting a harness does; `benchmarks/speculative.py`). Other backends decode
    as their servers are set up to (vLLM: `--speculative-config`)."""

    name: str = DEFAULT_MODEL
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    n_ctx: int = 4096
    threads: int = 2
    timeout_s: float = 120.0
    retries: int = 4
    cache: bool = True
    cache_path: str | None = None
    endpoints: list[str] = field(default_factory=list)
    max_concurrency: int = 0
    probe_s: float = 5.0
    attempt_timeout_s: float = 0.0
    prefix_cache: PrefixCache = "sampled"
    speculative: Speculative = "off"

    def validate(self) -> None:
        """Ranges, checked by `whale.config.build` (which has checked the types)."""
        check_choices(self)
        if not self.name.strip():
            raise ValueError("name: must not be empty")
        at_least(self, 1, "n_ctx", "threads")
        at_least(self, 0, "retries", "max_concurrency")
        above(self, 0, "timeout_s", "probe_s")
        at_least(self, 0, "attempt_timeout_s")
        check_endpoints(self.endpoints)
        if self.endpoints and (self.base_url or "@" in self.name):
            raise ValueError("endpoints: give the servers either as endpoints or as base_url "
                             "(or name@URL), not both")  # fmt: skip
        if self.max_concurrency and len(self.endpoints) < 2:
            raise ValueError("max_concurrency: limits the endpoints of a fleet; it needs 2+ "
                             f"endpoints (got {len(self.endpoints)})")  # fmt: skip


class ModelNotInstalled(ModelError):
    pass


def build_model(cfg: ModelConfig) -> ChatModel:
    """Make the backend a config names. Nothing starts here: the embedded server starts on the
    first call."""
    name, base_url = cfg.name, cfg.base_url
    if "@" in name and base_url is None:
        name, base_url = name.split("@", 1)
    if len(cfg.endpoints) == 1:
        base_url = check_endpoints(cfg.endpoints)[0]
    model: ChatModel
    if len(cfg.endpoints) >= 2:
        # Each endpoint retries a call at most once: the other endpoints are the retry.
        model = Fleet(
            name, cfg.endpoints, api_key=os.environ.get(cfg.api_key_env),
            max_concurrency=cfg.max_concurrency, retries=min(cfg.retries, 1),
            timeout_s=cfg.timeout_s, probe_s=cfg.probe_s,
            attempt_timeout_s=cfg.attempt_timeout_s,
        )  # fmt: skip
    elif base_url:
        model = OpenAICompatible(
            name, base_url, api_key=os.environ.get(cfg.api_key_env), retries=cfg.retries,
            timeout_s=cfg.timeout_s,
        )  # fmt: skip
    elif (Path(name) / PROPOSER_MARKER).is_file():  # a trained proposer (train-proposer)
        model = trained_adapter(Path(name), cfg)
    elif (Path(name) / "config.json").is_file():  # a transformers checkpoint folder
        from whale.models.hf import TransformersChat

        model = TransformersChat(name, threads=cfg.threads)
    elif name.endswith(".gguf"):
        if not Path(name).is_file():
            raise ModelNotInstalled(f"GGUF file {name} does not exist")
        model = EmbeddedLlama(name, n_ctx=cfg.n_ctx, threads=cfg.threads, timeout_s=cfg.timeout_s,
                              prefix_cache=cfg.prefix_cache,
                              speculative=cfg.speculative)  # fmt: skip
    elif name in CATALOG:
        if not is_installed(name):
            raise ModelNotInstalled(
                f"model {name!r} is not installed: run `whale models install {name}`"
            )
        model = EmbeddedLlama(model_path(name), alias=name, n_ctx=cfg.n_ctx, threads=cfg.threads,
                              timeout_s=cfg.timeout_s, prefix_cache=cfg.prefix_cache,
                              speculative=cfg.speculative)  # fmt: skip
    else:
        raise UnknownModel(name)
    if cfg.cache:
        path = cfg.cache_path or str(
            Path(os.environ.get("WHALE_CACHE") or Path.home() / ".cache" / "whale")
            / "responses.sqlite"
        )
        model = CachedModel(model, path)
    return model


# A folder `whale train-proposer` writes: a PEFT adapter, its llama.cpp LoRA GGUF and this
# marker naming the base model (catalog name or .gguf path) and the LoRA file.
PROPOSER_MARKER = "whale-proposer.json"


def trained_adapter(folder: Path, cfg: ModelConfig) -> ChatModel:
    """The embedded llama.cpp server on the marker's base GGUF with the folder's LoRA GGUF."""
    try:
        marker = json.loads((folder / PROPOSER_MARKER).read_text(encoding="utf-8"))
        base, lora = str(marker["base"]), folder / str(marker["lora"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        where = folder / PROPOSER_MARKER
        raise ModelNotInstalled(f"{where}: not a proposer marker ({e})") from None
    if base in CATALOG:
        if not is_installed(base):
            raise ModelNotInstalled(f"{folder}: base model {base!r} is not installed: run "
                                    f"`whale models install {base}`")  # fmt: skip
        gguf = model_path(base)
    else:
        gguf = Path(base)
    if not gguf.is_file() or not lora.is_file():
        raise ModelNotInstalled(f"{folder}: base {gguf} or adapter {lora} does not exist")
    return EmbeddedLlama(gguf, alias=folder.name, n_ctx=cfg.n_ctx, threads=cfg.threads,
                         timeout_s=cfg.timeout_s, lora=lora,
                         prefix_cache=cfg.prefix_cache, speculative=cfg.speculative)  # fmt: skip


def close_model(model: ChatModel | None) -> None:
    close = getattr(model, "close", None)
    if close is not None:
        close()


__all__ = [
    "CATALOG", "CachedModel", "ChatModel", "Completion", "ContextOverflow", "DEFAULT_MODEL",
    "EmbeddedLlama", "Fleet", "Message", "ModelConfig", "ModelError", "ModelNotFound",
    "ModelNotInstalled", "ModelTimeout", "ModelUnreachable", "OpenAICompatible", "Sampling",
    "TransformersChat", "PROPOSER_MARKER", "UnknownModel", "adapter_digest", "trained_adapter",
    "build_model", "close_model",
]  # fmt: skip
