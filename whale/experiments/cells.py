"""The cells of the experiment tables: numbers as the tables print them, the binomial standard
error of an accuracy, and a resolved step field by its dotted name."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def binomial_se(p: float | None, n: int | None) -> float | None:
    """sqrt(p(1-p)/n): the standard error of an accuracy read on n questions."""
    if p is None or not n:
        return None
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)


def field(fields: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """A resolved step field by its dotted name (None-safe)."""
    node: Any = fields
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node
