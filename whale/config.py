"""Config: one dataclass per command, loaded from a TOML file plus dotted overrides
(`--set runtime.budget.model_calls=4`), saved into the run directory as `config.toml`.

Every config is checked once, here, when it is built: each value against its field's type hint
(int, float (an int is accepted), bool, str, `X | None`, Literal, list/tuple/dict, nested
dataclass), then each dataclass's own `validate()` (ranges: positive counts, budgets). Errors
name the dotted field. A bool is not an int; NaN and infinite floats are refused everywhere.

A choice is a `Literal[...]` field: the type is the one list of its choices, checked on load
and again by `check_choices` (which a `validate()` calls, so a config built in Python is held
to the same choices), in one wording: `select: 'greedy' is not one of 'ratchet', 'best-of-g'`.
"No limit" is None, never a huge number or inf: a cap is `int | None`. TOML has no null, so
where a field's default is not None, a None is saved (and may be given, `--set rollouts=none`)
as the word `none` (`NONE`); where the default is None the key is simply left out.
Not covered: hints other than the ones above (e.g. Callable) are accepted unchecked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import tomli_w

from whale.errors import WhaleError

T = TypeVar("T")
# Where a field's default is not None, None is written (and given) as this word: TOML has no
# null. A field whose type also takes a string reads it as the string.
NONE = "none"
# The `tracking` field every command's config has (whale.analysis.tracking mirrors a finished
# run into the tracker named): defined here, below every command, so each config can use it.
TrackerKind = Literal["none", "mlflow", "wandb"]


class ConfigError(WhaleError, ValueError):
    """A config that cannot be run: a bad key, type or value; `field` names it (dotted)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        if field is not None:
            self.field = field


class FieldError(ValueError):
    """What a config's `validate()` raises for one field's value: the message starts with the
    field's dotted name, and `field` holds it (`build` makes it a ConfigError naming the field
    from the top of the config)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def parse_value(text: str) -> Any:
    """A TOML literal (`4`, `0.5`, `true`, `[1, 2]`, `{a = 1}`) or else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except ValueError:  # TOMLDecodeError, or an integer past Python's 4300-digit limit
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


def build(cls: type[T], tree: dict[str, Any], where: str = "", base: Any = None) -> T:
    """Make dataclass `cls` from a nested dict, type-checking every value and naming any
    unknown key. A sub-table for a field with a default (or default_factory) is applied over
    that default, so `proposer.name = X` keeps the proposer's own timeout. `base`: an instance
    of `cls` whose values are the starting point (else the field defaults)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(cls)
    if not isinstance(tree, dict):
        raise ConfigError(f"{where.rstrip('.') or 'config'}: expected a table, got {_show(tree)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    if base is not None:
        kwargs = {name: getattr(base, name) for name in fields}
    for key, value in tree.items():
        if key not in fields:
            raise ConfigError(f"unknown config key {where}{key!r}; known: {sorted(fields)}",
                              f"{where}{key}")  # fmt: skip
        hint = hints[key]
        sub = _dataclass_of(hint)
        if sub is not None and isinstance(value, dict):
            start = kwargs[key] if key in kwargs else _default_of(fields[key])
            start = start if isinstance(start, sub) else None
            kwargs[key] = build(sub, value, f"{where}{key}.", start)
        else:
            kwargs[key] = check_type(hint, value, f"{where}{key}")
    try:
        obj = cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as e:
            field = f"{where}{e.field}" if isinstance(e, FieldError) else where.rstrip(".") or None
            raise ConfigError(f"{where}{e}", field) from None
    return obj


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _dataclass_of(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if _is_union(hint):
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg) and isinstance(arg, type):
                return arg
    return None


def _is_union(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union


def check_type(hint: Any, value: Any, name: str) -> Any:
    """`value` if it fits `hint` (an int given for a float becomes a float; a list given for a
    tuple, a tuple), else ConfigError naming `name`, the expected type and the value."""
    ok, converted = _fits(hint, value)
    if ok:
        return converted
    if value == NONE and _accepts(hint, type(None)):
        return None
    if typing.get_origin(hint) is typing.Literal:
        raise ConfigError(_not_one_of(name, value, typing.get_args(hint)), name)
    if isinstance(value, float) and not math.isfinite(value) and _accepts_float(hint):
        raise ConfigError(f"{name}: expected a finite number, got {value!r}", name)
    message = f"{name}: expected {_describe(hint)}, got {_show(value)}"
    if _accepts(hint, str) and not isinstance(value, str | dict | list):
        message += f" (to pass it as a string, quote it: {name}='...')"
    raise ConfigError(message, name)


def _fits(hint: Any, value: Any) -> tuple[bool, Any]:
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True, value
    if hint is None or hint is type(None):
        return value is None, value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in args), value
    if _is_union(hint):
        for arm in args:
            ok, converted = _fits(arm, value)
            if ok:
                return True, converted
        return False, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                as_float = float(value)
            except OverflowError:  # an int past the float range
                return False, value
            return math.isfinite(as_float), as_float
        return False, value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return isinstance(value, hint), value  # a dict is built by `build`, not here
    container = origin or hint
    if container in (list, tuple, set, frozenset) and isinstance(value, list | tuple):
        if container is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        elif container is not tuple:
            args = (args[0],) * len(value) if args else ()
        if args and len(args) != len(value):
            return False, value
        items = []
        for i, item in enumerate(value):
            if args:
                ok, item = _fits(args[i], item)
                if not ok:
                    return False, value
            items.append(item)
        return True, container(items)
    if container is dict and isinstance(value, dict):
        if args:
            for k, v in value.items():
                if not (_fits(args[0], k)[0] and _fits(args[1], v)[0]):
                    return False, value
        return True, value
    if isinstance(container, type) and container not in (list, tuple, set, frozenset, dict):
        return isinstance(value, container), value
    if isinstance(container, type):
        return False, value
    return True, value  # a hint this checker does not know (see the module docstring)


def _accepts(hint: Any, t: type) -> bool:
    if hint is t:
        return True
    return _is_union(hint) and any(_accepts(a, t) for a in typing.get_args(hint))


def _has_literal(hint: Any) -> bool:
    """Whether `hint` is a Literal or holds one (`Literal[...] | None`, `list[Literal[...]]`)."""
    if typing.get_origin(hint) is typing.Literal:
        return True
    return any(_has_literal(a) for a in typing.get_args(hint))


def _not_one_of(name: str, value: Any, choices: typing.Iterable[Any]) -> str:
    return f"{name}: {value!r} is not one of {', '.join(map(repr, choices))}"


def _accepts_float(hint: Any) -> bool:
    return _accepts(hint, float)


def _describe(hint: Any) -> str:
    if hint is type(None) or hint is None:
        return "nothing (omit the key)"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if _is_union(hint):
        return " or ".join(_describe(a) for a in args if a is not type(None))
    named = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in named:
        return named[hint]
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return f"a table ({hint.__name__})"
    container = origin or hint
    if container in (list, tuple, set, frozenset):
        return "a list" + (f" of {_describe(args[0])}" if args else "")
    if container is dict:
        return "a table"
    return getattr(hint, "__name__", str(hint))


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int too long to print
        text = "<a very long number>"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


# --- range checks, for the `validate()` methods of config dataclasses ----------------------


def at_least(obj: Any, minimum: float, *names: str) -> None:
    """ValueError naming the first of `names` whose value (if not None) is below `minimum`."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < minimum:
            raise FieldError(name, f"must be at least {minimum} (got {value!r})")


def at_most(obj: Any, maximum: float, *names: str) -> None:
    """ValueError naming the first of `names` whose value (if not None) is above `maximum`."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and value > maximum:
            raise FieldError(name, f"must be at most {maximum} (got {value!r})")


def above(obj: Any, minimum: float, *names: str) -> None:
    """ValueError naming the first of `names` whose value (if not None) is not > `minimum`."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not value > minimum:
            raise FieldError(name, f"must be greater than {minimum} (got {value!r})")


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """Prefix a ValueError raised inside with `name.`: checks of a nested config's fields."""
    try:
        yield
    except FieldError as e:
        raise FieldError(f"{name}.{e.field}", e.reason) from None
    except ValueError as e:
        raise ValueError(f"{name}.{e}") from None


def one_of(obj: Any, name: str, choices: typing.Iterable[Any]) -> None:
    """ValueError unless `obj.name` is one of `choices` (for choices known only at run time;
    a fixed set of choices is a Literal field, checked by `check_choices`)."""
    value, allowed = getattr(obj, name), tuple(choices)
    if value not in allowed:
        raise FieldError(name, _not_one_of(name, value, allowed).split(": ", 1)[1])


def check_choices(obj: Any) -> None:
    """ValueError naming the first field of dataclass `obj` whose type holds a Literal and whose
    value does not fit it: what `build` checks on load, for a `validate()` to check a config
    built in Python too (nested configs are their own `validate()`'s business)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if _has_literal(hints[f.name]):
            value = getattr(obj, f.name)
            if not _fits(hints[f.name], value)[0]:
                check_type(hints[f.name], value, f.name)  # raises, in build's words


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
         base: dict[str, Any] | None = None) -> T:  # fmt: skip
    """`base` (e.g. from command-line flags) < TOML file < dotted overrides. ConfigError names
    a file that cannot be read or parsed, and every bad key or value."""
    tree: dict[str, Any] = {}
    _merge(tree, base or {})
    if path is not None:
        try:
            with open(path, "rb") as f:
                _merge(tree, tomllib.load(f))
        except OSError as e:
            raise ConfigError(f"config file {path}: {e.strerror or e}") from None
        except ValueError as e:  # TOMLDecodeError, bad UTF-8, an integer too long
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    for o in overrides or []:
        apply_override(tree, o)
    return build(cls, tree)


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"a.b": 1, "c": 2} as {"a": {"b": 1}, "c": 2}: dotted fields (as flags and keyword
    arguments give them) as the nested tree `load` takes; None values are left out."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        if value is None:
            continue
        node = tree
        *head, last = key.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = value
    return tree


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def override_text(key: str, value: Any) -> str:
    """The `--set` text of one field: `key=<TOML literal of value>` (None: NONE). A key that
    is not a dotted name (`a.b_c`) is refused: it could carry a second assignment."""
    if not isinstance(key, str) or not _DOTTED.fullmatch(key):
        raise ConfigError(f"override key {key!r}: not a dotted field name", "overrides")
    return f"{key}={_inline(value)}"


def _inline(value: Any) -> str:
    """`value` as one line of TOML (JSON's string escapes are TOML's basic-string escapes)."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):  # characters as they are: JSON's \ud83d pairs are not TOML
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_inline(v)}"
                               for k, v in value.items()) + "}"  # fmt: skip
    raise ConfigError(f"{value!r}: not a value a config holds ({type(value).__name__})")


def merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Merge tree `other` into `into`, sub-tables key by key (`other` wins)."""
    _merge(into, other)


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def to_dict(obj: Any) -> dict[str, Any]:
    """A TOML-safe dict of config `obj` that `build` reads back to an equal config. TOML has no
    null: a None is left out where the field's default is None too (loading restores it), and
    is written as `NONE` where the default is something else (a cap of None, "no cap", must
    not come back as the default's cap)."""
    out: dict[str, Any] = {}
    hints: dict[str, Any] | None = None
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is not None:
            out[f.name] = _plain(value)
            continue
        if _default_of(f) is None:
            continue
        hints = hints if hints is not None else typing.get_type_hints(type(obj))
        if _fits(hints[f.name], NONE)[0]:  # the word would read back as a string, not None
            raise ConfigError(f"{f.name}: None cannot be saved (its default is not None and "
                              f"{NONE!r} would read back as a string)")  # fmt: skip
        out[f.name] = NONE
    return out


def _plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_dict(x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if v is not None}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


def save(obj: Any, path: str | Path) -> None:
    Path(path).write_text(tomli_w.dumps(to_dict(obj)))
