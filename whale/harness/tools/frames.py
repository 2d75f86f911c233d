"""The pipe protocol between whale and its tools process: 4-byte big-endian length, then JSON.

Both ends are trusted (whale and the user's own tools); what a harness sends was checked by
the broker before it is framed here. Blocking reads and writes on plain pipes: no socket, so
nothing but this process's two pipe ends can reach the tools process.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

HEADER = struct.Struct(">I")


def encode(obj: Any) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes | None:
    """`n` bytes, or None at end of file (the other end closed)."""
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    """One message, or None at end of file."""
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    data = read_exact(fd, size)
    return None if data is None else json.loads(data)
