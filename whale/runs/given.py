"""What a caller of the API gave, made into one checked config: a config object or TOML file,
keyword arguments and `fields` (dotted names), `overrides` as `--set` takes them, and task,
harness and model arguments that are names, configs or objects (`whale.api`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from whale import config as cfgmod
from whale.models import ModelConfig

C = TypeVar("C")
Overrides = Mapping[str, Any] | Sequence[str]
Fields = Mapping[str, Any] | None


def build_config(cls: type[C], config: Any, overrides: Overrides, given: Mapping[str, Any],
                 toml: str | Path | None = None) -> C:  # fmt: skip
    """`cls` from a config object or TOML path (`config`), the fields `given` (dotted names;
    None: not given) and `overrides`, checked: ConfigError naming the field. `toml`: a TOML
    file read over an object `config` (train-proposer's saved config < --config)."""
    tree: dict[str, Any] = {}
    path = toml
    if dataclasses.is_dataclass(config) and isinstance(config, cls):
        tree = cfgmod.to_dict(config)
    elif isinstance(config, str | Path):
        path = config
    elif config is not None:
        raise cfgmod.ConfigError(f"config: want a {cls.__name__} or a TOML path, not "
                                 f"{type(config).__name__}").at("config")  # fmt: skip
    cfgmod.merge(tree, cfgmod.nest(given))
    return cfgmod.load(cls, path, override_list(overrides), base=tree)


def override_list(overrides: Overrides | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, str):  # one "a.b=c", not a sequence of characters
        return [overrides]
    if isinstance(overrides, Mapping):
        return [cfgmod.override_text(k, v) for k, v in overrides.items()]
    return list(overrides)


# The config field each keyword argument sets (the others are top-level fields by their name).
FIELD = {"task": "task.id", "model": "model.name", "solver": "solver.name",
          "proposer": "proposer.name"}  # fmt: skip


def given_fields(fields: Fields, objects: bool = True,
                 **kwargs: Any) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """The dotted config fields the keyword arguments set, then `fields` over them (None: not
    given), and a harness given as source text. A name (or a path) sets its field; a
    ModelConfig sets its whole section; an object (a TaskBase, a chat model) is used as given
    and its config field says so (`object_name`). `objects`: whether the command takes
    model objects and harness source (cotrain, rsft and diagnose serve and train named
    models)."""
    out: dict[str, Any] = {}
    source = None
    for key, value in kwargs.items():
        name = FIELD.get(key, key)
        if value is None:
            continue
        if key == "harness" and isinstance(value, str) and "\n" in value:
            if not objects:
                raise cfgmod.ConfigError("harness: this command takes a harness's name or path, "
                                         "not its source").at("harness")  # fmt: skip
            source, value = value, "<source>"
        if isinstance(value, ModelConfig):
            out[name.rsplit(".", 1)[0]] = cfgmod.to_dict(value)
        elif key in FIELD and not isinstance(value, str | os.PathLike):
            if not objects and key != "task":
                raise cfgmod.ConfigError(f"{key}: this command takes a name or a ModelConfig, "
                                         f"not a {type(value).__name__}").at(name)  # fmt: skip
            out[name] = object_name(value, key, name)
        else:
            out[name] = os.fspath(value) if isinstance(value, os.PathLike) else value
    out.update({k: v for k, v in (fields or {}).items() if v is not None})
    return out, source


def object_name(value: Any, key: str, field: str) -> str:
    """What the config records for a task or model object: `object:NAME`, which no registry
    or catalog resolves, so a run of objects is never resumed, or its ledger reused, with
    the named task or model of the same name. A task's name carries a digest of its questions
    (ids and prompts): a resume with other questions is a changed `task.id`. Anything else
    is refused, naming the field."""
    from whale.tasks import TaskBase

    if key == "task":
        if not isinstance(value, TaskBase):
            raise cfgmod.ConfigError(f"task: want a task id or a whale.tasks.TaskBase (it gives "
                                     f"the optional capabilities their defaults), not a "
                                     f"{type(value).__name__}").at(field)  # fmt: skip
        import hashlib

        from whale.runs.setup import TaskUnavailable

        digest = hashlib.sha256()
        try:
            questions = value.questions()
        except Exception as e:  # noqa: BLE001 - whatever the task raises, before any cost
            raise TaskUnavailable(f"task {getattr(value, 'name', '?')}: {type(e).__name__}: "
                                  f"{e}").at("task.config") from e  # fmt: skip
        for q in questions:
            digest.update(f"{q.id}\0{q.prompt}\0".encode("utf-8", "surrogatepass"))
        return f"object:{getattr(value, 'name', type(value).__name__)}@{digest.hexdigest()[:16]}"
    if not callable(getattr(value, "chat", None)):
        raise cfgmod.ConfigError(f"{key}: want a model name, a ModelConfig or a chat model "
                                 f"(an object with .chat), not a {type(value).__name__}"
                                 ).at(field)  # fmt: skip
    own = getattr(value, "name", None)
    return f"object:{own if isinstance(own, str) and own else type(value).__name__}"


def object_of(value: Any) -> Any:
    """The object given for a task or model; None for a name, a path or a config."""
    return None if value is None or isinstance(value, str | os.PathLike | ModelConfig) else value
