"""Config: one dataclass per command, loaded from a TOML file plus dotted overrides
(`--set runtime.budget.model_calls=4`), saved into the run directory as `config.toml`."""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def parse_value(text: str) -> Any:
    """A TOML literal (`4`, `0.5`, `true`, `[1, 2]`, `{a = 1}`) or else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(tree: dict[str, Any], dotted: str) -> None:
    key, sep, value = dotted.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {dotted!r} is not of the form key.path=value")
    parts = key.strip().split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {p} is not a table")
    node[parts[-1]] = parse_value(value.strip())


def build(cls: type[T], tree: dict[str, Any], where: str = "") -> T:
    """Make dataclass `cls` from a nested dict, naming any unknown key."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(cls)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in tree.items():
        if key not in fields:
            raise ConfigError(f"unknown config key {where}{key!r}; known: {sorted(fields)}")
        sub = _dataclass_of(hints[key])
        if sub is not None and isinstance(value, dict):
            kwargs[key] = build(sub, value, f"{where}{key}.")
        else:
            kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None


def _dataclass_of(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg) and isinstance(arg, type):
                return arg
    return None


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
         base: dict[str, Any] | None = None) -> T:  # fmt: skip
    """`base` (e.g. from command-line flags) < TOML file < dotted overrides."""
    tree: dict[str, Any] = {}
    _merge(tree, base or {})
    if path is not None:
        with open(path, "rb") as f:
            _merge(tree, tomllib.load(f))
    for o in overrides or []:
        apply_override(tree, o)
    return build(cls, tree)


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def to_dict(obj: Any) -> dict[str, Any]:
    """A TOML-safe dict of a config (None values are dropped; TOML has no null)."""

    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if v is not None}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    return clean(dataclasses.asdict(obj))  # type: ignore[no-any-return]


def save(obj: Any, path: str | Path) -> None:
    Path(path).write_text(tomli_w.dumps(to_dict(obj)))
