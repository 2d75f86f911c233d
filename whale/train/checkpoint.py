"""The solver in trainable form: a transformers checkpoint made once from its served GGUF.

Why: the weight phase trains LoRA adapters with transformers + PEFT, and nothing may come from a
model hub here, so the trainable weights are the GGUF's own, dequantized. Training against the
exact weights llama.cpp serves keeps the adapter's training and serving bases the same model.

`trainable_checkpoint(name_or_gguf)` makes `<models dir>/<name>-hf/` (config, safetensors
weights, tokenizer files with the chat template, generation config) with transformers'
GGUF loader (dequantize, drop the quantization config, `save_pretrained`) and caches it:

- atomic: built in a hidden temp folder beside it, then renamed into place; a half-built folder
  is never seen under the final name, and leftovers of a killed build are removed by the next;
- one builder: an exclusive `flock` on `.<name>-hf.lock`; a second process waits, then finds it
  built;
- rebuilt when the GGUF changes: the marker `whale-checkpoint.json` records the GGUF's sha256,
  size and mtime. The fast check is size + mtime_ns (a stat, so a cached call costs
  milliseconds; hashing 0.5 GB would cost seconds on every call); a new size means new bytes,
  and a
  new mtime alone is settled by the sha256, so a GGUF that was only touched or copied (same
  bytes) keeps its checkpoint. Not covered: bytes changed in place with size and mtime_ns both
  restored.

Weights are stored in fp32 (`WEIGHTS_DTYPE`): the GGUF's dequantized values (fp16 scales times
small integers) are exact in fp32, so the trainable base equals the served one bit for bit,
and training runs in fp32 on CPU anyway. bf16 would halve the size and the load time, but its
logits differ from fp32's (figures for the 0.5B in docs/measurements.md); the build time is
the dequantization either way, disk is cheap here and a build happens once, so exactness wins.

Not covered: GGUF architectures transformers cannot load (it raises, naming the architecture);
tokenizers are taken from the GGUF's own vocabulary as transformers converts it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whale.models.catalog import CATALOG, model_path, sha256_file

MARKER = "whale-checkpoint.json"
MARKER_FORMAT = 1
WEIGHTS_DTYPE = "float32"


def _say(msg: str) -> None:
    print(f"[whale checkpoint] {msg}", file=sys.stderr, flush=True)


def resolve_gguf(name_or_gguf: str | Path) -> tuple[str, Path]:
    """(name, GGUF path) of a catalog model name or a GGUF file path."""
    text = str(name_or_gguf)
    if text in CATALOG:
        path = model_path(text)
        if not path.is_file():
            raise FileNotFoundError(
                f"model {text} is not installed ({path}): run `whale models install {text}`"
            )
        return text, path
    path = Path(text).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"{text!r} is neither a catalog model ({', '.join(sorted(CATALOG))}) nor a GGUF file"
        )
    return path.stem, path.resolve()


def checkpoint_dir(name_or_gguf: str | Path, cache: Path | None = None) -> Path:
    """Where `trainable_checkpoint` puts the checkpoint: `<cache>/<name>-hf`, with `cache`
    defaulting to the GGUF's folder (the models dir for catalog models)."""
    name, gguf = resolve_gguf(name_or_gguf)
    return Path(cache or gguf.parent) / f"{name}-hf"


def trainable_checkpoint(name_or_gguf: str, cache: Path | None = None) -> Path:
    """The transformers checkpoint folder of a catalog model or GGUF file, built on first use
    (about a minute and a few GB of memory for the 0.5B: docs/measurements.md) and cached; see the
    module docstring."""
    _, gguf = resolve_gguf(name_or_gguf)
    dest = checkpoint_dir(name_or_gguf, cache)
    if _fresh(dest, gguf, hash_if_needed=False):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.parent / f".{dest.name}.lock"):
        if _fresh(dest, gguf, hash_if_needed=True):  # built meanwhile, or only touched
            return dest
        _build_into(gguf, dest)
    return dest


def base_tokenizer(checkpoint: Path) -> Any:
    """The checkpoint's tokenizer (with its chat template), loaded from local files only."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


# --- cache bookkeeping --------------------------------------------------------------------


def _stat_key(gguf: Path) -> dict[str, int]:
    st = gguf.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _read_marker(dest: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return None
    if not (dest / "config.json").is_file() or not any(dest.glob("*.safetensors")):
        return None
    return marker


def _write_marker(folder: Path, marker: dict[str, Any]) -> None:
    tmp = folder / f".{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(marker, indent=1))
    os.replace(tmp, folder / MARKER)


def _fresh(dest: Path, gguf: Path, hash_if_needed: bool) -> bool:
    """Whether `dest` holds a checkpoint of `gguf`'s current bytes. Without `hash_if_needed`
    only the stat is compared; with it a stat mismatch is settled by the sha256 (and a match
    refreshes the marker's stat, so the next call is fast again)."""
    marker = _read_marker(dest)
    if marker is None:
        return False
    key = _stat_key(gguf)
    if marker.get("size") == key["size"] and marker.get("mtime_ns") == key["mtime_ns"]:
        return True
    if not hash_if_needed or marker.get("size") != key["size"]:
        return False
    _say(f"{gguf.name} changed on disk (mtime); checking its sha256")
    if sha256_file(gguf) != marker.get("sha256"):
        return False
    marker.update(key)
    _write_marker(dest, marker)
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"another process is building {path.name[1:-5]}; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _Ticker:
    """Prints the elapsed time every `every_s` while a long step runs."""

    def __init__(self, what: str, every_s: float = 15.0) -> None:
        self.what, self.every_s = what, every_s
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            _say(f"{self.what}: {time.monotonic() - self._t0:.0f} s")

    def __enter__(self) -> _Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- the build ----------------------------------------------------------------------------


def _build_into(gguf: Path, dest: Path, dtype: str = WEIGHTS_DTYPE) -> None:
    """Build into a temp folder beside `dest` and rename it into place (the caller holds the
    lock, so leftover temp folders of `dest` belong to dead builds and are removed). The GGUF
    is hashed before the build: if it changes meanwhile, the marker's stat no longer matches
    and the next call rebuilds."""
    for stale in dest.parent.glob(f".{dest.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    t0 = time.monotonic()
    _say(f"building a trainable {dtype} checkpoint of {gguf.name} in {dest} (once; ~1 min)")
    try:
        key = _stat_key(gguf)
        _say(f"hashing {gguf.name} ({key['size'] / 1e6:.0f} MB)")
        digest = sha256_file(gguf)
        info = build_checkpoint(gguf, tmp, dtype)
        total = time.monotonic() - t0
        marker = {"format": MARKER_FORMAT, "gguf": str(gguf), "sha256": digest, **key,
                  "dtype": dtype, "build_s": round(total, 1), **info}  # fmt: skip
        _write_marker(tmp, marker)
        if dest.exists():
            old = dest.parent / f".{dest.name}.tmp-old-{os.getpid()}"
            os.rename(dest, old)
            os.rename(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _say(f"checkpoint ready in {total:.1f} s: {dest}")


def build_checkpoint(gguf: Path, out: Path, dtype: str = WEIGHTS_DTYPE) -> dict[str, Any]:
    """Dequantize `gguf` with transformers and `save_pretrained` model + tokenizer into `out`
    (no locking, no marker, no cache: `trainable_checkpoint` adds those). Returns facts for
    the marker (weights size, transformers version, timings). Nothing is fetched from a hub."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("WHALE_THREADS", "2")))
    try:
        t = time.monotonic()
        _say("loading the tokenizer from the GGUF")
        tok = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
        if not tok.chat_template:
            raise ValueError(f"{gguf} carries no chat template (tokenizer.chat_template)")
        tok.save_pretrained(str(out))
        timings["tokenizer_s"] = time.monotonic() - t

        t = time.monotonic()
        _say("loading and dequantizing the weights (the long step)")
        with _Ticker("dequantizing"):
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent),
                gguf_file=gguf.name,
                quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
                dtype=getattr(torch, dtype),
                local_files_only=True,
            )
        timings["load_s"] = time.monotonic() - t
        _drop_quantization(model)

        t = time.monotonic()
        _say("writing safetensors weights")
        with _Ticker("writing"):
            model.save_pretrained(str(out))
        timings["save_s"] = time.monotonic() - t
    finally:
        torch.set_num_threads(threads)
    return {
        "weights_bytes": sum(p.stat().st_size for p in out.glob("*.safetensors")),
        "transformers": transformers.__version__,
        "timings": {k: round(v, 2) for k, v in timings.items()},
    }


def _drop_quantization(model: Any) -> None:
    """Make a dequantized GGUF model a plain one that `save_pretrained` accepts: every weight
    must be a dense float tensor (no GGUF-packed module left), then the quantizer and the
    `quantization_config` go."""
    import torch

    packed = getattr(getattr(model, "hf_quantizer", None), "packed_modules", None)
    if packed:
        raise RuntimeError(f"{len(packed)} modules stayed GGUF-packed (dequantize was refused)")
    for name, p in model.named_parameters():
        if not torch.is_floating_point(p) or p.is_meta:
            raise RuntimeError(f"parameter {name} is not a dense float tensor after loading")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    elif hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
