"""A response cache in SQLite, keyed by backend + model + messages + sampling params + seed.

Wraps any ChatModel. Only successful completions are stored. Thread-safe (one connection,
one lock); WAL mode so that concurrent processes can share one file.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import asdict
from pathlib import Path

from whale.models.base import ChatModel, Completion, Message, Sampling


def cache_key(model_name: str, messages: list[Message], sampling: Sampling) -> str:
    blob = json.dumps([model_name, messages, sampling.key()], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class CachedModel:
    def __init__(self, inner: ChatModel, path: str | Path) -> None:
        self.inner = inner
        self.name = inner.name
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, value TEXT)"
        )
        self._db.commit()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion:
        key = cache_key(self.inner.name, messages, sampling)
        with self._lock:
            row = self._db.execute("SELECT value FROM completions WHERE key = ?", (key,)).fetchone()
        if row is not None:
            self.hits += 1
            return Completion(**{**json.loads(row[0]), "cached": True})
        self.misses += 1
        c = self.inner.chat(messages, sampling, timeout)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO completions VALUES (?, ?)", (key, json.dumps(asdict(c)))
            )
            self._db.commit()
        return c

    def close(self) -> None:
        with self._lock:
            self._db.close()
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()
