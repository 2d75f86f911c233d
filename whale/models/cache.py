"""A response cache in SQLite, keyed by backend + model + messages + sampling params + seed.

Wraps any ChatModel. Only successful completions are stored. Thread-safe (one connection,
one lock); WAL mode so that concurrent processes can share one file.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from whale.models.base import (
    ChatModel,
    Completion,
    Message,
    PartialBatch,
    Sampling,
    chat_n,
    each,
    reuses_prefix,
    shares_prompt,
)


def cache_key(
    model_name: str, messages: list[Message], sampling: Sampling, prefix_cache: str = "sampled"
) -> str:
    """The key of one call. A call whose prefix reuse differs from the default policy's
    ("sampled": sampled calls reuse, greedy calls do not) carries that in its key: reusing a
    processed prefix changes the low bits of the logits and so some replies (docs/models.md),
    and a greedy reply made under "all" is not the reply a default greedy call would get. Under
    the default the key is what it always was, so existing caches stay valid."""
    key = sampling.key()
    reuse = reuses_prefix(prefix_cache, sampling)
    if reuse != reuses_prefix("sampled", sampling):
        key["prefix_reused"] = reuse
    blob = json.dumps([model_name, messages, key], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class CachedModel:
    def __init__(
        self, inner: ChatModel, path: str | Path, prefix_cache: str | None = None
    ) -> None:
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
        # The prefix policy the calls are made under, part of each call's key: `prefix_cache`
        # where given (a ray actor calling the driver's embedded server), else the inner
        # model's (embedded servers; "sampled" for others, whose server side whale does not see).
        self._prefix_cache = prefix_cache or str(getattr(inner, "prefix_cache", "sampled"))

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion:
        key = cache_key(self.inner.name, messages, sampling, self._prefix_cache)
        hit = self._get(key)
        if hit is not None:
            return hit
        self.misses += 1
        c = self.inner.chat(messages, sampling, timeout)
        self._put(key, c)
        return c

    def shares_prompt(self, sampling: Sampling) -> bool:
        return shares_prompt(self.inner, sampling)

    def chat_n(
        self, messages: list[Message], sampling: Sampling, n: int, timeout: float | None = None
    ) -> list[Completion]:
        """`n` completions, completion i with seed `sampling.seed + i` (`base.chat_n`), each
        cached under the key of its own seed: the key a single call with that seed has, so a
        completion asked for in a batch and one asked for alone are one entry. The ones not
        cached are asked of the backend together, in one `chat_n` where they are one run of
        consecutive seeds, else one call each."""
        if sampling.seed is None:  # one key for all: as n single calls would be answered
            return each(self, messages, sampling, n, timeout)
        seeded = [replace(sampling, seed=sampling.seed + i) for i in range(n)]
        keys = [cache_key(self.inner.name, messages, s, self._prefix_cache) for s in seeded]
        out: list[Completion | None] = [self._get(k) for k in keys]
        missing = [i for i, c in enumerate(out) if c is None]
        if not missing:
            return [c for c in out if c is not None]
        self.misses += len(missing)
        if missing == list(range(missing[0], missing[-1] + 1)):
            try:
                fresh = chat_n(self.inner, messages, seeded[missing[0]], len(missing), timeout)
            except PartialBatch as e:  # keep what came back, and say how far it goes
                for i, c in zip(missing, e.done, strict=False):
                    self._put(keys[i], c)
                    out[i] = c
                first = next(i for i, c in enumerate(out) if c is None)
                raise PartialBatch(str(e), [c for c in out[:first] if c is not None]) from e
        else:
            with ThreadPoolExecutor(max_workers=len(missing)) as pool:
                fresh = list(
                    pool.map(lambda i: self.inner.chat(messages, seeded[i], timeout), missing)
                )
        for i, c in zip(missing, fresh, strict=True):
            self._put(keys[i], c)
            out[i] = c
        return [c for c in out if c is not None]

    def _get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM completions WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        self.hits += 1
        return Completion(**{**json.loads(row[0]), "cached": True})

    def _put(self, key: str, c: Completion) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO completions VALUES (?, ?)", (key, json.dumps(asdict(c)))
            )
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()
