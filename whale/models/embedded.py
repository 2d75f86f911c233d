"""The embedded default backend: a llama.cpp server on a GGUF file, on 127.0.0.1.

The server starts on the first call only (a harness that never calls the model never starts
one), listens on a free port, is waited on until `/v1/models` answers, and is stopped when the
process exits or `close()` is called. Calls go through `OpenAICompatible`.

Two servers, chosen at start:
- the native `llama-server` (see `native`; `make install` builds it), with `slots` parallel
  slots of `n_ctx` tokens each and continuous batching: up to `slots` calls decode together;
- else `python -m whale.models.llama_server` (llama-cpp-python's server), which decodes one
  request at a time (a one-line warning says so, and how to build the native one).
`WHALE_EMBEDDED_SERVER=python` forces the second (`native` forces the first: a missing binary
is then an error). Both run with llama.cpp's AMX weight repacking off where it crashes (see
`llama_server`). Calls beyond what the server decodes at once wait here, for a free slot,
so that a call's timeout counts its own decoding and not its wait behind other calls.

Determinism (whale's response cache assumes a greedy or seeded request gives one reply): the
native server repeats a request's reply when it is decoded the same way (prompt caching is off
for this, see `native.command`), but llama.cpp is not batch-invariant: decoded alongside other
requests, a greedy reply can differ from the one it gets alone (docs/measurements.md). The python
server, one request at a time, does not have this.

Prompt prefixes (`prefix_cache`, issue 25): the native server's prompt cache is off, and a
request turns it on for itself (`cache_prompt`) where the policy says so: by default sampled
calls (temperature > 0) only, so that a greedy reply never depends on what the server ran
before. `chat_n` asks for the samples of one prompt (the proposer's G) in one request, the
prompt evaluated once (docs/models.md). Not covered: that request ends when its longest sample
does, so a timeout fails all its samples where separate calls would have kept the short ones.

The server cannot outlive this process (see `serverproc`): it dies by its parent-death signal
when this process is killed (kill -9 included), `close()` and `kill_servers()` kill its process
group, and servers left by dead whale processes are reaped when a new one starts.
After `close()` (or `kill_servers()`) an instance refuses calls with `ModelError`: it never
restarts its server, and calls waiting for their turn fail within 50 ms.

Tool calls (`Sampling.tools`): the native server renders the tools with the model's chat
template and parses the calls out of the reply (`--jinja`, see `native.command`); the python
server renders them but returns the call as text, so a call with tools is refused there
(ModelError, before any server starts) rather than answered without its calls. Every `tool`
message reaches either server with a `tool_call_id` (`server_messages`).

With `lora` (a llama.cpp LoRA adapter GGUF) the server applies the adapter to every request
(`--lora`, or `--lora_path` for the python server; scale 1) and the name becomes
`embedded:{alias}+{digest}`, the digest being sha256[:12] of the adapter file's bytes, so that
the response cache and the records never mix replies of the base and of an adapter (or of two
adapters).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import httpx

import whale.models.native as native
import whale.models.serverproc as serverproc
import whale.models.vocab as vocab
from whale.models.base import (
    PREFIX_CACHE,
    SPECULATIVE,
    Completion,
    ContextOverflow,
    Message,
    ModelError,
    PartialBatch,
    Sampling,
    crosses_seed_space,
    each,
    prefix_fields,
    reuses_prefix,
    template_messages,
)
from whale.models.openai_compat import OpenAICompatible

# llama-server's message for a prompt longer than a slot (a 400 that OpenAICompatible does not
# classify): "request (N tokens) exceeds the available context size (M tokens), ...".
_NATIVE_OVERFLOW = "exceeds the available context size"
_warned_python = False
# chat_n's request fields: one logprob per token, read after sampling (so that nothing is
# computed over the vocabulary), to count each choice's tokens.
_COUNTED = {"n_probs": 1, "post_sampling_probs": True}
# How often a starting server is asked whether it answers: a refused connection costs
# microseconds, and the old 100 ms added 50 ms on average to every start.
_POLL_S = 0.02
T = TypeVar("T")

# Started instances, for `kill_servers` (a signal handler must not take locks).
_LIVE: dict[int, EmbeddedLlama] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_servers() -> None:
    """Close every embedded model of this process at once: SIGKILL to each server's process
    group, no waiting, no locks (safe in a signal handler). In-flight calls fail at once."""
    for m in list(_LIVE.values()):
        m.abort()


def server_kind(server: str | None = None) -> str:
    """"native" or "python": the server a start would use now. `server` (else
    `$WHALE_EMBEDDED_SERVER`) forces one; unset, the native one if its binary is there."""
    forced = (server or os.environ.get("WHALE_EMBEDDED_SERVER", "")).strip().lower()
    if forced not in ("", "native", "python"):
        raise ModelError(f"embedded server {forced!r}: expected 'native' or 'python'")
    if forced == "python":
        return "python"
    if forced == "native" or native.available():
        return "native"
    global _warned_python
    if not _warned_python:
        _warned_python = True
        print(
            f"whale: {native.missing()}: embedded models decode one request at a time (build "
            "it with `make llama-server`)",
            file=sys.stderr,
            flush=True,
        )
    return "python"


def server_messages(messages: list[Message], kind: str | None) -> list[Message]:
    """`messages` as the embedded servers take them. Each `tool` message without a
    `tool_call_id` gets one (`call_{index}`): llama-cpp-python's server answers HTTP 500 to a
    tool message without it, and harnesses send tool output as a bare `{"role": "tool",
    "content": ...}` (Qwen2.5's template does not render the id). For the python server, tool
    call arguments are parsed into objects (`base.template_messages`): it hands the messages
    to the template as they are, where the native server parses them itself. The caller's
    list is not changed (the response cache keys on it)."""
    out = [
        {**m, "tool_call_id": f"call_{i}"}
        if m.get("role") == "tool" and not m.get("tool_call_id")
        else m
        for i, m in enumerate(messages)
    ]
    return template_messages(out) if kind == "python" else out


def lora_digest(path: Path) -> str:
    """sha256[:12] of a LoRA adapter file's bytes (names the served weights by content)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    except OSError as e:
        raise ModelError(f"LoRA adapter {path} cannot be read: {e}") from None
    return h.hexdigest()[:12]


class EmbeddedLlama:
    def __init__(
        self,
        gguf: str | Path,
        alias: str | None = None,
        n_ctx: int = 4096,
        threads: int | None = None,
        ready_timeout_s: float = 180.0,
        timeout_s: float = 120.0,
        lora: str | Path | None = None,
        slots: int = 4,
        server: str | None = None,
        prefix_cache: str = "sampled",
        lora_pending: bool = False,
        speculative: str = "off",
    ) -> None:
        """`slots`: calls decoded together by the native server (whale's default workers);
        each slot holds `n_ctx` tokens. The python server decodes one at a time. `server`:
        "native" or "python" forces that server (default: `server_kind()`). `prefix_cache`
        (`base.PREFIX_CACHE`): which calls the native server may answer from a processed
        prompt prefix (see "Prompt prefixes" in the module's docstring). `lora_pending`: the
        LoRA file is still being written (the server reads it after loading the model); the
        name waits for `name_by_lora()`, called once it is there. `speculative`
        (`base.SPECULATIVE`): the native server's speculative decoding (the python server has
        none and ignores it)."""
        if slots < 1:
            raise ValueError(f"slots must be >= 1, not {slots}")
        if prefix_cache not in PREFIX_CACHE:
            raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHE)}, "
                             f"not {prefix_cache!r}")  # fmt: skip
        if speculative not in SPECULATIVE:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE)}, "
                             f"not {speculative!r}")  # fmt: skip
        self.prefix_cache: str = prefix_cache
        self.speculative = speculative
        self.gguf = Path(gguf)
        self.alias = alias or self.gguf.stem
        self.lora = Path(lora) if lora is not None else None
        self.name = f"embedded:{self.alias}"
        if self.lora is not None:
            self.name += "+pending" if lora_pending else f"+{lora_digest(self.lora)}"
        self.n_ctx, self.threads = n_ctx, threads or int(os.environ.get("WHALE_THREADS", "2"))
        self.ready_timeout_s, self.timeout_s = ready_timeout_s, timeout_s
        self.slots, self.server = slots, server
        self.kind: str | None = None  # "native" | "python", once started
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: OpenAICompatible | None = None
        self._record: Path | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._turns: threading.Semaphore | None = None  # one per call the server decodes
        self._many = threading.Lock()  # one caller at a time takes several turns (chat_n)
        self.log_path: Path | None = None
        self.ready_s: float | None = None  # spawn to the first answer of /v1/models

    def name_by_lora(self, digest: str | None = None) -> None:
        """Name the model by its LoRA file's digest (`lora_digest` of the file, or `digest`
        where the caller has it): for a model made with `lora_pending`."""
        if self.lora is not None:
            self.name = f"embedded:{self.alias}+{digest or lora_digest(self.lora)}"

    def prompt_char_limit(self) -> int | None:
        """The most characters of message text one call can carry and still fit (the broker
        refuses more before sending): `n_ctx * slots` tokens, the whole KV cache and so the
        most any one request can be given whatever the server's slot policy, times the
        longest token of the vocabulary in bytes (see `vocab`). An upper bound: it never
        refuses a prompt that fits, as long as the chat template keeps each message's text,
        and it is far below the sizes that inflated the server (Qwen2.5 at n_ctx 4096: 4.2M
        characters, against three 7.5 MB messages). None where the vocabulary is unreadable."""
        longest = vocab.longest_token_bytes(self.gguf)
        return None if longest is None else self.n_ctx * self.slots * longest

    @property
    def started(self) -> bool:
        return self._client is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def _refuse(self) -> ModelError:
        return ModelError(f"{self.name} is closed (the run is stopping)")

    def start(self) -> OpenAICompatible:
        with self._lock:
            if self._closed:
                raise self._refuse()
            if self._client is not None:
                return self._client
            if not self.gguf.exists():
                raise ModelError(f"GGUF file {self.gguf} does not exist")
            serverproc.reap_stale()  # servers left by whale processes that were killed
            port = free_port()
            log = Path(os.environ.get("TMPDIR", "/tmp")) / f"whale-llama-{port}.log"
            self.log_path = log
            kind = server_kind(self.server)
            cmd = self._command(kind, port)
            spawned = time.monotonic()
            with open(log, "wb") as f:
                proc = serverproc.spawn(cmd, stdout=f, stderr=subprocess.STDOUT)
            self._proc = proc
            self._record = serverproc.register(proc, cmd)
            _LIVE[id(self)] = self
            atexit.register(self.close)
            base = f"http://127.0.0.1:{port}/v1"
            # Made while the server starts (an OpenAI client takes tens of ms to build).
            client = OpenAICompatible(
                self.alias, base, api_key="none", timeout_s=self.timeout_s,
                request_fields=self._fields if kind == "native" else None,
            )  # fmt: skip
            try:
                self._wait_ready(proc, log, base)
            except BaseException:
                client.close()
                raise
            self.ready_s = time.monotonic() - spawned
            self.kind = kind
            self._turns = threading.Semaphore(self.slots if kind == "native" else 1)
            self._client = client
            return client

    def _wait_ready(self, proc: subprocess.Popen[bytes], log: Path, base: str) -> None:
        """Until `/models` answers 200; a server that exits, a close() and the ready timeout
        end the wait with ModelError. One plain-HTTP client for every poll: `httpx.get` builds
        a TLS context each time (~25 ms of CPU here, taken from the starting server)."""
        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(timeout=1.0, verify=False, trust_env=False) as http:  # 127.0.0.1
            while True:
                if self._closed:
                    self.close()
                    raise self._refuse()
                if proc.poll() is not None:
                    tail = log.read_text(errors="replace")[-2000:]
                    self.close(final=False)
                    raise ModelError(f"llama.cpp server exited ({proc.returncode}):\n{tail}")
                try:
                    if http.get(f"{base}/models").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.close(final=False)
                    raise ModelError(f"llama.cpp server not ready after {self.ready_timeout_s} s")
                time.sleep(_POLL_S)

    def _fields(self, sampling: Sampling) -> dict[str, bool]:
        return prefix_fields(self.prefix_cache, sampling)

    def _command(self, kind: str, port: int) -> list[str]:
        if kind == "native":
            exe = native.binary()
            if exe is None:
                raise ModelError(
                    f"WHALE_EMBEDDED_SERVER=native but {native.missing()} (build it with "
                    "`make llama-server`)"
                )
            return native.command(
                exe, self.gguf, port=port, alias=self.alias, n_ctx=self.n_ctx,
                slots=self.slots, threads=self.threads, lora=self.lora,
                speculative=self.speculative,
            )  # fmt: skip
        cmd = [
            sys.executable, "-m", "whale.models.llama_server", "--model", str(self.gguf),
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(self.n_ctx),
            # Prompt threads too: llama_cpp.server otherwise uses every core for prompts,
            # and on a busy machine the extra threads stall each step (many times slower
            # with a LoRA: docs/measurements.md).
            "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
            "--model_alias", self.alias,
        ]  # fmt: skip
        if self.lora is not None:
            cmd += ["--lora_path", str(self.lora)]
        return cmd

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion:
        # The server decodes `slots` calls at once (the python one: one). Queue the rest here,
        # so that a call's timeout counts its own decoding and not the wait behind other
        # calls; the wait polls for close() so that a stopping run does not sit behind a queue.
        if sampling.tools is not None and (self.kind or server_kind(self.server)) == "python":
            # Checked before any start: a refused call costs no server.
            raise ModelError(
                f"{self.name}: tool calls need the native llama-server (llama-cpp-python's "
                "server renders the tools but returns the call as text): build it with "
                "`make llama-server`, or serve the model behind an OpenAI-compatible server"
            )
        client = self.start()
        messages = server_messages(messages, self.kind)
        return self._in_turns(1, lambda: client.chat(messages, sampling, timeout))

    def shares_prompt(self, sampling: Sampling) -> bool:
        """Whether `chat_n` asks for its samples in one request, the prompt processed once:
        on the native server, for a call whose prefix may be reused (`prefix_cache`), with a
        seed and no tools."""
        return (
            sampling.tools is None
            and sampling.seed is not None
            and reuses_prefix(self.prefix_cache, sampling)
            and (self.kind or server_kind(self.server)) == "native"
        )

    def chat_n(
        self, messages: list[Message], sampling: Sampling, n: int, timeout: float | None = None
    ) -> list[Completion]:
        """`n` completions of one prompt, completion i sampled with seed `sampling.seed + i`.
        Where `shares_prompt(sampling)`, up to `slots` of them in one request (llama-server's
        `n`: the prompt is evaluated once and its KV cache copied to the other slots; the
        server seeds choice i with the request's seed + i, so that completion i is the one a
        call with that seed alone gets, up to batching's low bits); else `n` calls, made
        together. Each completion's `completion_tokens` is counted from its tokens' logprobs
        (llama-server's `usage` counts the first choice only). The first failure raises."""
        if n < 1:
            raise ValueError(f"chat_n: n must be >= 1, not {n}")
        # The server seeds choice i with the sent seed + i: a run of seeds that would cross
        # SEED_SPACE (llama.cpp's "random" value) is asked for one call each.
        if n == 1 or not self.shares_prompt(sampling) or crosses_seed_space(sampling, n):
            return each(self, messages, sampling, n, timeout)
        client = self.start()
        if self.kind != "native":  # not reached: shares_prompt saw the kind a start uses
            return each(self, messages, sampling, n, timeout)
        messages = server_messages(messages, self.kind)
        assert sampling.seed is not None  # shares_prompt
        seed = sampling.seed

        def part(first: int) -> list[Completion]:
            k = min(self.slots, n - first)
            s = replace(sampling, seed=seed + first)
            return self._in_turns(k, lambda: client.chat_choices(messages, s, k, timeout, _COUNTED))

        out: list[Completion] = []
        for first in range(0, n, self.slots):
            try:
                out += part(first)
            except ModelError as e:
                if not out:
                    raise
                raise PartialBatch(f"{e} (after {len(out)} of {n} samples)", out) from e
        return out

    def _in_turns(self, k: int, call: Callable[[], T]) -> T:
        """`call()` holding `k` of the server's turns (one per slot it decodes in), with a
        dead server's log and an overflow told apart from other failures."""
        turns = self._turns
        if turns is None:  # closed between start() and here
            raise self._refuse()
        self._take(turns, k)
        try:
            if self._closed:
                raise self._refuse()
            proc = self._proc
            try:
                return call()
            except ModelError as e:
                if type(e) is ModelError and _NATIVE_OVERFLOW in str(e):
                    raise ContextOverflow(f"{self.alias}: prompt does not fit ({e})") from None
                if proc is not None and proc.poll() is not None and not self._closed:
                    # The server died under the call (OOM, a crash): say so, with its log,
                    # and drop it so that the next call starts a new one (only this server:
                    # another thread may have started its successor already).
                    with self._lock:
                        if self._proc is proc:
                            self.close(final=False)
                    tail = ""
                    if self.log_path is not None:
                        try:
                            tail = self.log_path.read_text(errors="replace")[-1500:]
                        except OSError:
                            pass
                    raise ModelError(f"llama.cpp server exited ({proc.returncode}) during the "
                                     f"call; the next call starts a new one. Log "
                                     f"{self.log_path}:\n{tail}") from None  # fmt: skip
                raise
        finally:
            for _ in range(k):
                turns.release()

    def _take(self, turns: threading.Semaphore, k: int) -> None:
        """Acquire `k` turns, polling for close(). Several turns are taken by one caller at a
        time (`_many`): two callers each holding part of what they need would wait forever."""
        taken = 0
        try:
            if k > 1:
                while not self._many.acquire(timeout=0.05):
                    if self._closed:
                        raise self._refuse()
            try:
                while taken < k:
                    if turns.acquire(timeout=0.05):
                        taken += 1
                    elif self._closed:
                        raise self._refuse()
            finally:
                if k > 1:
                    self._many.release()
        except BaseException:
            for _ in range(taken):
                turns.release()
            raise

    def abort(self) -> None:
        """Refuse every later call and SIGKILL the server now (no wait, no lock)."""
        self._closed = True
        client, proc = self._client, self._proc
        if client is not None:
            client.refuse()
        if proc is not None:
            serverproc.kill_group(proc.pid, signal.SIGKILL)

    def close(self, final: bool = True) -> None:
        """Stop the server: SIGKILL to its process group (it holds no state worth a graceful
        stop, and uvicorn's graceful stop waits for the request in flight). With `final` (the
        default) the instance refuses every later call; `final=False` is a failed start,
        retried by the next call."""
        if final:
            self._closed = True
        proc, self._proc = self._proc, None
        client, self._client = self._client, None
        _LIVE.pop(id(self), None)
        if client is not None:
            client.refuse()
        if proc is not None:
            if proc.poll() is None:
                serverproc.kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
        serverproc.unregister(self._record)
        self._record = None
        if client is not None:
            client.close()
