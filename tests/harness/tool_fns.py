"""Tools the user-tool tests declare (imported by the tools process as tests.harness.tool_fns)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Literal


def lookup(customer: str, limit: int = 3) -> dict:
    """Look up a customer's orders.

    The second paragraph is not shown to proposers."""
    return {"customer": customer, "orders": [f"o{i}" for i in range(limit)]}


def add(a: int, b: float = 0.5) -> float:
    """Add two numbers."""
    return a + b


def fail(reason: str) -> str:
    """Always raises."""
    raise ValueError(f"no such thing: {reason}")


def sleep(seconds: float) -> str:
    """Sleeps, then says so."""
    time.sleep(seconds)
    return "woke"


async def asleep(seconds: float) -> str:
    """Sleeps on the event loop."""
    await asyncio.sleep(seconds)
    return "woke"


def big(n: int) -> str:
    """Returns n characters."""
    return "x" * n


def not_json() -> object:
    """Returns a set."""
    return {1, 2}


def color(c: Literal["red", "green"], note: str | None = None) -> str:
    """Names a color."""
    return c if note is None else f"{c} ({note})"


def anything(**kwargs: object) -> dict:
    """Takes any arguments."""
    return dict(kwargs)


def pid() -> int:
    """The tools process's pid."""
    return os.getpid()


def die() -> str:
    """Kills the tools process."""
    os._exit(3)


def count_args(*args: int) -> int:
    """Only *args: nothing a keyword call can fill."""
    return len(args)


NOT_CALLABLE = 3


def deep(n: int) -> list:
    """Returns a list nested n deep."""
    x: list = []
    for _ in range(n):
        x = [x]
    return x


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b
