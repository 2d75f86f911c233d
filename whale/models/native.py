"""The native llama.cpp `llama-server`: where its binary is, and its command line.

`make install` (target `llama-server`) builds it from the llama.cpp that llama-cpp-python
`VERSION` vendors, as one static file kept at `~/.cache/whale/bin/llama-server-VERSION`
(also looked for under `$WHALE_CACHE/bin`). `WHALE_LLAMA_SERVER=PATH` names another binary
(and only that one is then tried). Unlike llama-cpp-python's server, which decodes one request
at a time, it decodes up to `-np` requests together (continuous batching) and applies a LoRA
adapter given at start (`--lora`): it reads LoRA files at start only (its `/lora-adapters`
endpoint and a request's `lora` field scale adapters loaded then; docs/models.md), so a new
adapter is a new server.

Not covered: the binary's version is not checked beyond its file name (a binary named by
`WHALE_LLAMA_SERVER` is trusted to accept the flags below), and a binary built with
`GGML_NATIVE` on another CPU may die with SIGILL at start (the start reports the log tail).
"""

from __future__ import annotations

import os
from pathlib import Path

from whale.models.llama_server import extra_bufts_off

VERSION = "0.3.36"  # llama-cpp-python whose vendored llama.cpp the binary is built from
BINARY_NAME = f"llama-server-{VERSION}"


def candidates() -> list[Path]:
    """The paths tried, in order."""
    forced = os.environ.get("WHALE_LLAMA_SERVER")
    if forced:
        return [Path(forced).expanduser().absolute()]
    roots = []
    if os.environ.get("WHALE_CACHE"):
        roots.append(Path(os.environ["WHALE_CACHE"]))
    roots.append(Path.home() / ".cache" / "whale")
    out: list[Path] = []
    for root in roots:
        p = (root / "bin" / BINARY_NAME).absolute()
        if p not in out:
            out.append(p)
    return out


def binary() -> Path | None:
    """The first executable candidate, or None."""
    for p in candidates():
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def missing() -> str:
    """Why no binary is found, for messages: the first candidate and what is wrong with it."""
    p = candidates()[0]
    if p.is_file():
        return f"{p} is not executable"
    return f"no llama-server at {p}"


def available() -> bool:
    return binary() is not None


def is_native_cmd(cmd: list[str]) -> bool:
    """True for a command line that runs a llama-server binary (`llama-server` or
    `llama-server-VERSION`, by the file name of `cmd[0]`, or the binary `binary()` finds now,
    whatever its name) on a model."""
    if not cmd or "--model" not in cmd:
        return False
    name = os.path.basename(cmd[0])
    if name == "llama-server" or name.startswith("llama-server-"):
        return True
    exe = binary()  # a binary of another name, given by WHALE_LLAMA_SERVER
    return exe is not None and cmd[0] == str(exe)


def command(
    exe: Path,
    gguf: Path,
    *,
    port: int,
    alias: str,
    n_ctx: int,
    slots: int,
    threads: int,
    lora: Path | None = None,
    speculative: str = "off",
) -> list[str]:
    """llama-server's argv: `slots` parallel slots of `n_ctx` tokens each (the KV cache is
    `n_ctx * slots`, split evenly), continuous batching, `threads` for decoding and for
    prompts, on 127.0.0.1. Weight repacking (llama.cpp's "extra buffer types", the AMX path)
    is off where `llama_server.extra_bufts_off()` says so: it segfaults on AMX CPUs.

    Threads sleep while they wait for work (`--poll 0`; llama-server's default busy-waits
    half the time): on a machine whose other cores are busy, the polling threads take the
    cores from the ones with work (decoding several-fold slower: docs/measurements.md).

    Prompt caching is off (`--no-cache-prompt`, and no host-memory prompt cache): with it, a
    prompt seen before is answered from its cached KV plus a one-token re-evaluation, whose
    logits differ in the low bits from a full evaluation, so the same greedy (or seeded)
    request gave another reply the second time (docs/measurements.md); whale's response cache
    assumes a request's reply is stable. The cost: a conversation's earlier turns are
    evaluated again at each call. A request turns it on for itself (`cache_prompt: true`, see
    `embedded.EmbeddedLlama`'s `prefix_cache`): sampled calls do by default.

    Start-up (a new server per trained adapter, so it counts): `--fit off` skips a dry-run
    load that projects memory use to shrink what is left unset (nothing here: the context is
    set) and `--no-warmup` an empty decode; the server still decodes two tokens at start (its
    check of the KV cache), and the first request pays the rest (what each saves:
    `benchmarks/serve_adapter.py`, docs/measurements.md)."""
    cmd = [
        str(exe), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--alias", alias, "--parallel", str(slots), "--ctx-size", str(n_ctx * slots),
        "--cont-batching", "--threads", str(threads), "--threads-batch", str(threads),
        "--poll", "0", "--threads-http", str(max(4, slots + 2)), "--no-cache-prompt",
        "--cache-ram", "0", "--jinja", "--no-webui", "--fit", "off", "--no-warmup",
    ]  # fmt: skip
    if extra_bufts_off():
        cmd.append("--no-repack")
    if lora is not None:
        cmd += ["--lora", str(lora)]
    if speculative == "ngram":  # drafts from the context's own n-grams (base.Speculative)
        cmd += ["--spec-type", "ngram-simple"]
    return cmd
