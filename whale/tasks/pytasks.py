"""User Python named by text: `py:` task ids (`py:mypkg.tasks:factory`, `py:tasks.py`,
`py:tasks.py:factory`) and `py:` graders (`py:mypkg.graders:score`).

A target is `WHERE[:NAME]`: WHERE is a dotted module name or the path of a `.py` file
(relative paths are read from the current directory), NAME an attribute of it. A module that
does not import as installed is looked for in the current directory (as `python -m` would):
the directory is then appended to `sys.path` for the rest of the process. A `.py` file is
imported once per process under a private module name (`whale_user_<stem>_<hash>`), so a file
called `json.py` does not shadow the standard library.

The user's code is trusted: importing it runs it, in this process. What it meets that is not
trusted (harness answers) is the grader's business (`whale.tasks.graders`).

A `py:` task resolves NAME (default `task`) to one of:
- a `TaskBase` instance: used as it is (the request's size and seed are not passed on);
- a class or a function, the factory: called with the `TaskRequest` (`id`, `arg`, `size`,
  `seed`, `config`) when it takes one parameter, with nothing when it takes none; it must
  return a `TaskBase` instance.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

from whale.config import ConfigError
from whale.tasks.base import Task, TaskBase

DEFAULT_TASK_NAME = "task"
_IMPORT_LOCK = threading.Lock()


class TaskRequest(Protocol):
    """What a loader reads of `whale.tasks.registry.TaskRequest` (the registry imports this
    module, so it is named by its shape here)."""

    @property
    def id(self) -> str: ...

    @property
    def arg(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def config(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Target:
    """`WHERE[:NAME]` parsed: exactly one of `module` (dotted) and `path` (absolute .py)."""

    text: str
    module: str | None
    path: Path | None
    name: str | None

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else str(self.module)


def parse_target(text: str, field: str) -> Target:
    """The target `text` names; ConfigError (naming `field`) for one that is not a dotted
    module or a `.py` path, or a NAME that is not an identifier."""
    head, sep, tail = text.rpartition(":")
    where, name = (head, tail) if sep and not tail.endswith(".py") else (text, None)
    if name is not None and not name.isidentifier():
        raise ConfigError(f"{field}: {text!r}: {name!r} is not a Python name", field)
    if not where:
        raise ConfigError(f"{field}: {text!r}: no module or file before the name", field)
    if where.endswith(".py"):
        path = Path(where).expanduser()
        path = (path if path.is_absolute() else Path.cwd() / path).resolve()
        if not path.is_file():
            raise ConfigError(f"{field}: {text!r}: no such file {path}", field)
        return Target(text, None, path, name)
    if not all(part.isidentifier() for part in where.split(".")):
        raise ConfigError(
            f"{field}: {text!r}: expected a dotted module name or a .py file "
            "(py:mypkg.mod:NAME, py:file.py, py:file.py:NAME)",
            field,
        )
    return Target(text, where, None, name)


def import_target(target: Target, field: str) -> ModuleType:
    """The module of `target`, imported (once). ConfigError naming `field` when it does not
    import: the message carries the exception the user's code raised."""
    try:
        with _IMPORT_LOCK:
            if target.path is not None:
                return _import_file(target.path)
            return _import_module(str(target.module))
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything on import
        raise ConfigError(
            f"{field}: cannot import {target.where}: {type(e).__name__}: {e}", field
        ) from e


def _import_file(path: Path) -> ModuleType:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    name = f"whale_user_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: a dataclass in it looks itself up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(dotted: str) -> ModuleType:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as e:
        top = dotted.split(".")[0]
        here = Path.cwd()
        local = (here / f"{top}.py").is_file() or (here / top).is_dir()
        if e.name != top or not local or str(here) in sys.path:
            raise
    sys.path.append(str(here))  # appended: the standard library and installs still win
    importlib.invalidate_caches()
    return importlib.import_module(dotted)


def load_attribute(target: Target, default: str | None, field: str) -> Any:
    """The object `target` names (its NAME, else `default`); ConfigError naming `field` when
    the module does not import or lacks it."""
    name = target.name or default
    if name is None:
        raise ConfigError(f"{field}: {target.text!r}: say which function (WHERE:NAME)", field)
    module = import_target(target, field)
    try:
        return getattr(module, name)
    except AttributeError:
        raise ConfigError(f"{field}: {target.where} has no {name!r}", field) from None


def module_file(module: ModuleType) -> Path | None:
    """Where `module` was read from: its file, or the folder of a namespace package."""
    file = getattr(module, "__file__", None)
    if file:
        return Path(file).resolve()
    paths = list(getattr(module, "__path__", []))
    return Path(paths[0]).resolve() if paths else None


def takes_request(fn: Any) -> bool:
    """Whether a factory wants the `TaskRequest` (one required parameter) or nothing (none).
    A signature that cannot be read is given the request."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    required = [
        p
        for p in sig.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise ConfigError(
            f"task.id: {getattr(fn, '__qualname__', fn)!r} takes {len(required)} arguments; "
            "a task factory takes the TaskRequest or nothing",
            "task.id",
        )
    return len(required) == 1


def py_task(req: TaskRequest) -> Task:
    """The task `py:TARGET` names (module docstring)."""
    target = parse_target(req.arg, "task.id")
    obj = load_attribute(target, DEFAULT_TASK_NAME, "task.id")
    if isinstance(obj, TaskBase):
        return _named(obj, target)
    if not callable(obj):
        raise ConfigError(
            f"task.id: {target.text!r} is a {type(obj).__name__}: expected a TaskBase instance, "
            "a TaskBase subclass or a factory function",
            "task.id",
        )
    try:
        task = obj(req) if takes_request(obj) else obj()
    except ConfigError:
        raise
    except ValueError as e:  # the factory's refusal of its request, as loaders raise it
        raise ValueError(f"{target.text}: {e}") from None
    if not isinstance(task, TaskBase):
        raise ConfigError(
            f"task.id: {target.text!r} returned a {type(task).__name__}, not a task: subclass "
            "whale.tasks.TaskBase (name, description, questions(), grade())",
            "task.id",
        )
    return _named(task, target)


def _named(task: TaskBase, target: Target) -> Task:
    """`task`, once it has the two attributes TaskBase cannot require of a subclass."""
    for attr in ("name", "description"):
        if not isinstance(getattr(task, attr, None), str):
            raise ConfigError(
                f"task.id: {target.text!r}: the task has no text {attr!r} (a TaskBase subclass "
                "gives name and description)",
                "task.id",
            )
    return cast(Task, task)
