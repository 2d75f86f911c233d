"""A minimal GGUF writer for tests: a header with metadata and no tensors."""

import struct
from pathlib import Path


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _value(kind: int, value) -> bytes:
    if kind == 4:  # uint32
        return struct.pack("<I", value)
    if kind == 6:  # float32
        return struct.pack("<f", value)
    if kind == 8:  # string
        return _string(value.encode())
    elem, items = value  # array
    body = struct.pack("<IQ", elem, len(items))
    return body + b"".join(_value(elem, x) for x in items)


def write_gguf(path: Path, kv: list[tuple[str, int, object]], version: int = 3) -> Path:
    """`kv`: (key, GGUF value type, value); an array's value is (element type, items)."""
    out = b"GGUF" + struct.pack("<IQQ", version, 0, len(kv))
    for key, kind, value in kv:
        out += _string(key.encode()) + struct.pack("<I", kind) + _value(kind, value)
    path.write_bytes(out)
    return path


def vocab_gguf(path: Path, tokens: list[str]) -> Path:
    """A GGUF whose vocabulary is `tokens`, after metadata of other types (as real files have)."""
    return write_gguf(path, [
        ("general.architecture", 8, "qwen2"),
        ("qwen2.context_length", 4, 32768),
        ("qwen2.rope.freq_base", 6, 1e6),
        ("tokenizer.ggml.token_type", 9, (4, [1] * len(tokens))),
        ("tokenizer.ggml.tokens", 9, (8, tokens)),
        ("tokenizer.ggml.merges", 9, (8, ["a b"])),
    ])  # fmt: skip
