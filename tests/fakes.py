"""Test doubles (never imported by the package)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from whale.models.base import Completion, ModelTimeout, Sampling


class ScriptedModel:
    """Replies from a script, in order (the last reply repeats); records what it was asked."""

    def __init__(
        self,
        replies: list[str] | Callable[[list[dict], Sampling], str] | None = None,
        delay_s: float = 0.0,
        finish_reason: str = "stop",
    ) -> None:
        self.name = "scripted"
        self.replies = replies if replies is not None else ["Answer: 42"]
        self.delay_s = delay_s
        self.finish_reason = finish_reason
        self.calls: list[tuple[list[dict], Sampling]] = []
        self._lock = threading.Lock()

    def chat(self, messages, sampling, timeout=None):
        with self._lock:
            self.calls.append((messages, sampling))
            i = len(self.calls) - 1
        if self.delay_s:
            if timeout is not None and self.delay_s > timeout:
                time.sleep(timeout)
                raise ModelTimeout(f"no reply within {timeout} s")
            time.sleep(self.delay_s)
        if callable(self.replies):
            text = self.replies(messages, sampling)
        else:
            text = self.replies[min(i, len(self.replies) - 1)]
        n = len(text.split())
        return Completion(
            text,
            self.finish_reason,
            {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n},
        )
