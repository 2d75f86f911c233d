"""What a Ray actor rebuilds the driver's Runtime from (`whale.harness.ray_executor`): the
Runtime and its model as plain picklable values. `describe_model` turns the driver's model into
an OpenAI-compatible endpoint the actors call (an embedded model is started on the driver);
a model that runs only in the driver's process is ExecutorUnavailable. No `ray` import here:
the specs are plain data."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlparse

from whale.harness.budget import Budget, Limits, PythonToolLimits
from whale.harness.packages import PackageSet
from whale.harness.runtime import ExecutorUnavailable, Runtime
from whale.harness.sandbox import Sandbox
from whale.models.base import ChatModel, prefix_fields
from whale.models.cache import CachedModel
from whale.models.embedded import EmbeddedLlama
from whale.models.fleet import Fleet
from whale.models.openai_compat import OpenAICompatible

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ModelSpec:
    """What an actor needs to call the driver's model: an OpenAI-compatible endpoint."""

    name: str  # the driver's backend identity (cache keys, records)
    model: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    retries: int = 4
    backoff_s: float = 0.5
    timeout_s: float = 120.0
    token_ids: bool = False
    cache_path: str | None = None
    # A fleet (whale.models.fleet): its endpoints; each actor routes over all of them with
    # its own `max_concurrency` per endpoint (so the cluster may have actors x that in flight).
    endpoints: tuple[str, ...] = ()
    max_concurrency: int = 0
    probe_s: float = 5.0
    attempt_timeout_s: float = 0.0
    # The driver's prefix policy (`ModelConfig.prefix_cache`): part of each call's cache key,
    # and, for an embedded native llama-server (`cache_prompt`), sent with each call as the
    # driver's own calls send it, so that an actor's reply is the one the driver would get.
    prefix_cache: str = "sampled"
    cache_prompt: bool = False

    def loopback(self) -> bool:
        urls = self.endpoints or (self.base_url,)
        return any((urlparse(u).hostname or "") in LOOPBACK for u in urls)

    def build(self) -> ChatModel:
        m: Any
        if self.endpoints:
            m = Fleet(self.model, self.endpoints, api_key=self.api_key,
                      max_concurrency=self.max_concurrency, timeout_s=self.timeout_s,
                      probe_s=self.probe_s, token_ids=self.token_ids,
                      attempt_timeout_s=self.attempt_timeout_s)  # fmt: skip
        else:
            fields = partial(prefix_fields, self.prefix_cache) if self.cache_prompt else None
            m = OpenAICompatible(self.model, self.base_url, api_key=self.api_key or "none",
                                 retries=self.retries, backoff_s=self.backoff_s,
                                 timeout_s=self.timeout_s, token_ids=self.token_ids,
                                 request_fields=fields)  # fmt: skip
        m.name = self.name  # the same identity as the driver's backend
        if not self.cache_path:
            return m
        return CachedModel(m, self.cache_path, prefix_cache=self.prefix_cache)  # the driver's keys


def describe_model(model: ChatModel | None) -> ModelSpec | None:
    """The picklable description of `model`, or ExecutorUnavailable for a model that cannot
    be called from another process. An embedded model is started here (on the driver)."""
    if model is None:
        return None
    resolve = getattr(model, "resolve_model", None)
    if callable(resolve):  # served on demand (the weight phase's solver): serve it now
        model = resolve()
    cache_path, inner = None, model
    if isinstance(model, CachedModel):
        cache_path, inner = str(model.path), model.inner
    name = inner.name
    client: Any
    if isinstance(inner, Fleet):
        return ModelSpec(
            name=name, model=inner.model, base_url="", endpoints=tuple(inner.urls()),
            api_key=inner.api_key, timeout_s=inner.timeout_s, token_ids=inner.token_ids,
            max_concurrency=inner.max_concurrency, probe_s=inner.probe_s, cache_path=cache_path,
            attempt_timeout_s=inner.attempt_timeout_s,
        )  # fmt: skip
    if isinstance(inner, EmbeddedLlama):
        client = inner.start()
    elif isinstance(inner, OpenAICompatible):
        client = inner
    else:
        raise ExecutorUnavailable(
            f"the ray executor calls the solver from its actors, so it needs an "
            f"OpenAI-compatible server (NAME@URL) or an embedded llama.cpp model; {name!r} "
            f"({type(inner).__name__}) runs only in this process: use executor.kind=local"
        )
    key = client.api_key
    return ModelSpec(
        name=name, model=client.model, base_url=client.base_url, api_key=key,
        retries=client.retries, backoff_s=client.backoff_s, timeout_s=client.timeout_s,
        token_ids=client.token_ids, cache_path=cache_path,
        prefix_cache=str(getattr(inner, "prefix_cache", "sampled")),
        cache_prompt=client.request_fields is not None,
    )  # fmt: skip


@dataclass(frozen=True)
class RuntimeSpec:
    """A Runtime, as plain picklable values, to rebuild on an actor."""

    model: ModelSpec | None
    budget: Budget
    limits: Limits
    python_limits: PythonToolLimits
    sandbox: Sandbox
    temperature: float
    seed: int | None
    warm: int
    # The prompt bound resolved here: an actor's model is a client that does not know n_ctx.
    prompt_chars: int | None = None
    # runtime.packages as the driver resolved it: the actors mount the same folder, which
    # must be at that path on their node (this machine's, for a local cluster).
    packages: PackageSet | None = None

    @classmethod
    def of(cls, rt: Runtime, per_actor: int) -> RuntimeSpec:
        if rt.tools:  # the tools process serves this machine's runs only (settings.RAY_REFUSAL)
            raise ExecutorUnavailable(
                "ray: user tools run in a tools process on the driver, which actors cannot "
                "reach; use the local executor"
            )
        return cls(describe_model(rt.model), rt.budget, rt.limits, rt.python_limits,
                   rt.sandbox, rt.temperature, rt.seed,
                   2 * per_actor if rt.warm > 0 else 0, rt.prompt_char_limit(),
                   rt.packages)  # fmt: skip

    def build(self) -> Runtime:
        if self.packages is not None and not os.path.isdir(self.packages.folder):
            where = self.packages.folder
            raise ExecutorUnavailable(f"ray: runtime.packages: {where} is not on this node "
                                      "(build or copy it there, at the same path)")  # fmt: skip
        return Runtime(
            model=None if self.model is None else self.model.build(), budget=self.budget,
            limits=self.limits, python_limits=self.python_limits, sandbox=self.sandbox,
            temperature=self.temperature, seed=self.seed, warm=self.warm,
            prompt_chars=self.prompt_chars, packages=self.packages,
        )  # fmt: skip
