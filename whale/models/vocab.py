"""The longest token of a GGUF model's vocabulary, read from the file's header.

The broker refuses, before sending, a prompt that cannot fit the model's context (see
`EmbeddedLlama.prompt_char_limit`). For that bound to never refuse a prompt that would fit, it
needs the most text one token can stand for: n_ctx tokens hold at most n_ctx times that. This
is read from the vocabulary itself, not assumed: measured over the 19 vocabularies llama.cpp
ships for its tests (`python -m benchmarks.vocab_longest`; docs/measurements.md), the longest
token differs many-fold between vocabularies (BERT's a word; GPT-NeoX's, MPT's and
Command-R's a run of spaces), so no fixed characters-per-token factor is safe.

The length counted is that of the token's text as stored (UTF-8 bytes). Decoding never makes
a token longer: GPT-2 style vocabularies store each byte as one character of one or two bytes,
SentencePiece stores a space as "▁" (3 bytes) and a raw byte as "<0xNN>" (6), WordPiece
prefixes "##"; and the UTF-8 bytes of a text are never fewer than its characters.

Only the header is read (the vocabulary precedes the tensors): GGUF versions 2 and 3, little
endian. A file that is not such a GGUF, or that has no `tokenizer.ggml.tokens`, gives None.
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path
from typing import BinaryIO

TOKENS_KEY = "tokenizer.ggml.tokens"
_STRING, _ARRAY = 8, 9
# Sizes of GGUF's fixed-size value types: uint8, int8, uint16, int16, uint32, int32, float32,
# bool, (string), (array), uint64, int64, float64.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class _Malformed(Exception):
    pass


def longest_token_bytes(path: str | Path) -> int | None:
    """The longest token of the GGUF at `path`, in bytes of its stored text, or None where it
    cannot be read. Cached per file (path, size, modification time)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _longest(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _longest(path: str, size: int, mtime_ns: int) -> int | None:
    del mtime_ns  # part of the cache key only: a replaced file is read again
    try:
        with open(path, "rb", buffering=1 << 20) as f:
            return _scan(f, size)
    except (OSError, _Malformed, struct.error):
        return None


def _scan(f: BinaryIO, size: int) -> int | None:
    if _read(f, 4) != b"GGUF":
        raise _Malformed("not a GGUF file")
    version, _tensors, n_kv = struct.unpack("<IQQ", _read(f, 20))
    if version not in (2, 3):
        raise _Malformed(f"GGUF version {version}")
    for _ in range(min(n_kv, size)):
        key = _string(f, size).decode("utf-8", "replace")
        (kind,) = struct.unpack("<I", _read(f, 4))
        if key == TOKENS_KEY:
            return _longest_string(f, kind, size)
        _skip_value(f, kind, size)
    return None


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _Malformed("truncated")
    return data


def _length(f: BinaryIO, size: int) -> int:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > size:  # a count or length past the file's size: not a real one
        raise _Malformed("length past the end of the file")
    return int(n)


def _string(f: BinaryIO, size: int) -> bytes:
    return _read(f, _length(f, size))


def _skip(f: BinaryIO, n: int) -> None:
    f.seek(n, os.SEEK_CUR)


def _skip_value(f: BinaryIO, kind: int, size: int) -> None:
    if kind in _FIXED:
        _skip(f, _FIXED[kind])
    elif kind == _STRING:
        _skip(f, _length(f, size))
    elif kind == _ARRAY:
        (elem,) = struct.unpack("<I", _read(f, 4))
        n = _length(f, size)
        if elem in _FIXED:
            _skip(f, n * _FIXED[elem])
        else:
            for _ in range(n):
                _skip_value(f, elem, size)
    else:
        raise _Malformed(f"value type {kind}")


def _longest_string(f: BinaryIO, kind: int, size: int) -> int | None:
    if kind != _ARRAY:
        raise _Malformed(f"{TOKENS_KEY} is not an array")
    (elem,) = struct.unpack("<I", _read(f, 4))
    if elem != _STRING:
        raise _Malformed(f"{TOKENS_KEY} is not an array of strings")
    longest = 0
    for _ in range(_length(f, size)):
        n = _length(f, size)
        _skip(f, n)
        longest = max(longest, n)
    return longest or None
