"""The task registry: every task id whale accepts, the line `whale tasks` prints for it, and the
loader that builds it. `load_task` dispatches through it and `task_ids()` lists it, so the two
cannot disagree; `register_task` adds a task of one's own.

An id pattern is `KIND` (the id is exactly that word: `mhqa`) or `KIND:ARG` (the id is the kind,
a colon and a non-empty argument: `rg:FAMILY`, `hotpotqa:PATH`); what follows the colon is
passed to the loader as `TaskRequest.arg`. A kind may be registered once with an argument and
once without; a second registration of the same form is refused.

Every entry says where it came from (`TaskEntry.source`): "built-in", "registered in Python"
(`register_task`), or "entry point DIST VERSION": a pip-installed package adds task ids through
the entry-point group `whale.tasks` (`ENTRY_POINT_GROUP`), e.g. in its pyproject.toml

    [project.entry-points."whale.tasks"]
    mybench = "mybench.whale:load"       # a loader: TaskRequest -> Task, for the id `mybench`
    mybench2 = "mybench.whale:ENTRIES"   # a TaskEntry, or a list of them (`mybench2:SPLIT`)

The entry point's name is the kind; a plain loader serves the bare id and its docstring's
first line is what `whale tasks` prints; a `TaskEntry` (or a list) gives its own patterns,
each of that kind, and descriptions. Entry points are read once, on the first id no other
entry knows (or the first listing), never for a built-in id; one that does not load or clashes
with a registered pattern is listed with its error and refused when named, and the others work.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from whale.config import ConfigError
from whale.errors import WhaleError
from whale.tasks.base import Task, UnknownTask
from whale.tasks.variants import VariantRefused, refusal, with_variant


@dataclass(frozen=True)
class TaskRequest:
    """What a loader is asked for: the id, what follows its colon, the pool size and seed, and
    the task's own config (`task.config`, a copy the loader may keep)."""

    id: str
    arg: str
    size: int
    seed: int
    config: dict[str, Any] = field(default_factory=dict)


Loader = Callable[[TaskRequest], Task]


@dataclass(frozen=True)
class TaskEntry:
    pattern: str  # KIND or KIND:ARG
    description: str  # one line, printed by `whale tasks`
    load: Loader
    source: str = "registered in Python"  # "built-in", or "entry point DIST VERSION"
    error: str | None = None  # an entry point that did not load: why (then `load` refuses)

    @property
    def kind(self) -> str:
        return self.pattern.partition(":")[0]

    @property
    def takes_arg(self) -> bool:
        return ":" in self.pattern


class DuplicateTask(WhaleError, ValueError):
    """A pattern registered twice (same kind, both with or both without an argument)."""


_PATTERN = re.compile(r"[A-Za-z0-9_.-]+(:\S+)?")
RESERVED = "object"  # whale.runs.given records a task object as `object:NAME@DIGEST`
ENTRY_POINT_GROUP = "whale.tasks"


class TaskRegistry:
    """Task entries by id pattern; with `group`, also the entry points of that group, read
    the first time an id is not found otherwise or the entries are listed."""

    def __init__(self, entries: list[TaskEntry] | None = None, group: str | None = None) -> None:
        self._entries: list[TaskEntry] = []
        self._broken: dict[str, TaskEntry] = {}  # kind -> an entry point that did not load
        self._group, self._discovered = group, group is None
        self._lock = threading.RLock()  # a package's import may look up a task id itself
        for e in entries or []:
            if e.error is not None:
                self._broken.setdefault(e.kind, e)
            else:
                self.register(e.pattern, e.load, e.description, e.source)

    def register(self, pattern: str, load: Loader, description: str,
                 source: str = "registered in Python") -> TaskEntry:  # fmt: skip
        """Add `pattern`; ValueError for a malformed pattern or an empty description,
        DuplicateTask for a pattern of a kind and form already registered."""
        if not _PATTERN.fullmatch(pattern):
            raise ValueError(
                f"task pattern {pattern!r}: expected KIND or KIND:ARG (KIND of letters, digits, "
                "'_', '.', '-'; ARG a placeholder without spaces, e.g. 'mytask:PATH')"
            )
        if not description.strip() or "\n" in description.strip():
            raise ValueError(f"task pattern {pattern!r}: the description must be one line")
        new = TaskEntry(pattern, description.strip(), load, source)
        if new.kind == RESERVED:
            raise ValueError(
                f"task pattern {pattern!r}: the kind {RESERVED!r} names task "
                "objects given to the API (`object:NAME@DIGEST`); choose another"
            )
        for e in self._entries:
            if e.kind == new.kind and e.takes_arg == new.takes_arg:
                raise DuplicateTask(
                    f"task {pattern!r} is already registered as {e.pattern!r} "
                    f"({e.description}); pick another kind"
                )
        self._entries.append(new)
        return new

    def entries(self) -> list[TaskEntry]:
        """Every entry, entry points included (read now if not yet), the broken ones last."""
        self.discover()
        return [*self._entries, *self._broken.values()]

    def find(self, task_id: str) -> TaskEntry | None:
        kind, _, rest = task_id.partition(":")
        for attempt in range(2):
            for e in self._entries:
                if e.kind == kind and e.takes_arg == bool(rest):
                    return e
            if attempt == 0 and not self.discover():
                break
        return self._broken.get(kind)

    def discover(self) -> bool:
        """Read the group's entry points, once; whether this call read them."""
        with self._lock:
            if self._discovered:
                return False
            self._discovered = True
            assert self._group is not None
            for ep in metadata.entry_points(group=self._group):
                self._add_entry_point(ep)
            return True

    def _add_entry_point(self, ep: metadata.EntryPoint) -> None:
        dist = getattr(ep, "dist", None)
        source = f"entry point {dist.name} {dist.version}" if dist is not None else "entry point"
        try:
            for e in _entry_point_entries(ep):
                self.register(e.pattern, e.load, e.description, source)
        except Exception as e:  # noqa: BLE001 - a package's bug must not break the others
            why = f"{type(e).__name__}: {e}".splitlines()[0][:300]

            def refuse(req: TaskRequest, why: str = why) -> Task:
                raise UnknownTask(f"task {req.id}: the entry point {ep.name} = {ep.value!r} "
                                  f"({source}) does not load: {why}")  # fmt: skip

            self._broken.setdefault(ep.name, TaskEntry(ep.name, f"BROKEN: {why}", refuse,
                                                       source, why))  # fmt: skip

    def load(self, task_id: str, size: int, seed: int, config: dict[str, Any] | None) -> Task:
        """The task of `task_id`, its questions as the dataset writes them. UnknownTask names
        a bad id, a bad size, or (prefixed by the id) whatever ValueError the loader raised: a
        dataset file that does not load names the file, the record and the field."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise UnknownTask(f"task {task_id}: size must be a positive integer (got {size!r})")
        entry = self.find(task_id)
        if entry is None:
            known = ", ".join(e.pattern for e in self._entries)
            raise UnknownTask(f"unknown task {task_id!r}; known: {known}")
        req = TaskRequest(task_id, task_id.partition(":")[2], size, seed, dict(config or {}))
        try:
            return entry.load(req)
        except (UnknownTask, ConfigError):  # a ConfigError names its own field
            raise
        except ValueError as e:  # DatasetError and friends name the file, record and field
            raise UnknownTask(f"task {task_id}: {e}") from None


# --- the built-in tasks (datasets are imported when their task is loaded, not before) -------


def _rg(req: TaskRequest) -> Task:
    from whale.tasks.rg import ReasoningGymTask

    return ReasoningGymTask(req.arg, size=req.size, seed=req.seed, config=req.config)


def _mhqa(req: TaskRequest) -> Task:
    from whale.tasks.mhqa import generated_task

    unknown = sorted(set(req.config) - {"passages"})
    if unknown:
        raise UnknownTask(f"mhqa: unknown config field(s) {unknown}; known: ['passages']")
    return generated_task(seed=req.seed, size=req.size, passages=req.config.get("passages"))


def _hotpotqa(req: TaskRequest) -> Task:
    from whale.tasks.qa_files import hotpotqa

    return hotpotqa(req.arg, req.config.get("abstracts"))


def _musique(req: TaskRequest) -> Task:
    from whale.tasks.qa_files import musique

    return musique(req.arg)


def _twowiki(req: TaskRequest) -> Task:
    from whale.tasks.qa_files import twowiki

    return twowiki(req.arg)


def _searchqa(req: TaskRequest) -> Task:
    from whale.tasks.judged import searchqa

    return searchqa(req.arg, judge=req.config.get("judge"))


def _math(req: TaskRequest) -> Task:
    from whale.tasks.math import math_file

    return math_file(req.arg)


def _champ(req: TaskRequest) -> Task:
    from whale.tasks.math import champ

    return champ()


def _file(fmt: str) -> Loader:
    def load(req: TaskRequest) -> Task:
        from whale.tasks.files import file_task

        return file_task(req, fmt)

    return load


def _py(req: TaskRequest) -> Task:
    from whale.tasks.pytasks import py_task

    return py_task(req)


def _verifiers(req: TaskRequest) -> Task:
    from whale.tasks.verifiers_env import load_verifiers

    return load_verifiers(req)


def _first_line(doc: str | None) -> str:
    lines = [ln.strip() for ln in (doc or "").strip().splitlines()]
    return lines[0] if lines and lines[0] else ""


def _entry_point_entries(ep: metadata.EntryPoint) -> list[TaskEntry]:
    """What an entry point of `whale.tasks` offers (module docstring): its object loaded."""
    obj = ep.load()
    if isinstance(obj, TaskEntry):
        items = [obj]
    elif isinstance(obj, list | tuple) and obj and all(isinstance(o, TaskEntry) for o in obj):
        items = list(obj)
    elif callable(obj):
        line = _first_line(getattr(obj, "__doc__", None))
        items = [TaskEntry(ep.name, line or f"(no description: {ep.value})", obj)]
    else:
        raise TypeError(f"{ep.value} is a {type(obj).__name__}: expected a loader "
                        "(TaskRequest -> Task), a TaskEntry or a list of TaskEntry")  # fmt: skip
    for e in items:
        if e.kind != ep.name:
            raise ValueError(f"pattern {e.pattern!r} is not of the entry point's kind {ep.name!r}")
    return items


REGISTRY = TaskRegistry(group=ENTRY_POINT_GROUP)
for _pattern, _load, _line in [
    ("rg:FAMILY", _rg, "a Reasoning Gym family, 106 of them (`whale tasks --families`)"),
    ("mhqa", _mhqa, "whale's GENERATED offline multi-hop QA benchmark (50k+ passages, BM25)"),
    ("hotpotqa:PATH", _hotpotqa,
     "HotpotQA distractor/fullwiki JSON (fullwiki: task.config.abstracts=PATH)"),
    ("musique:PATH", _musique, "MuSiQue JSONL with its paragraphs"),
    ("2wiki:PATH", _twowiki, "2WikiMultihopQA JSON"),
    ("searchqa:PATH", _searchqa, "SearchQA-style JSON/JSONL, graded by the WHALE rubric"),
    ("math:PATH", _math, "GSM8K- or MATH-format JSONL"),
    ("champ", _champ, "the 270 competition math problems of champ-dataset"),
    ("jsonl:PATH", _file("jsonl"),
     "your JSONL file: task.config question_field, reference_field, grader (whale.tasks.files)"),
    ("json:PATH", _file("json"), "your JSON array of records (the same settings as jsonl)"),
    ("csv:PATH", _file("csv"), "your CSV file with a header row (the same settings as jsonl)"),
    ("parquet:PATH", _file("parquet"), "your Parquet file (pyarrow; the same settings as jsonl)"),
    ("py:TARGET", _py, "your Task from Python: py:module:factory, py:file.py[:NAME]"),
    ("verifiers:ENV", _verifiers,
     "a verifiers environment (installed package, verifiers 0.4.0): its tasks, its rewards"),
]:  # fmt: skip
    REGISTRY.register(_pattern, _load, _line, "built-in")


def register_task(pattern: str, load: Loader, description: str) -> TaskEntry:
    """Make `load_task` (and every command's `--task`) accept ids of `pattern`, built by `load`
    from a `TaskRequest`; `whale tasks` lists it with `description` (one line). DuplicateTask
    when the pattern's kind and form are taken. A loader's ValueError reaches the caller as
    UnknownTask naming the id; return a `TaskBase` subclass (see `whale.tasks.base`)."""
    return REGISTRY.register(pattern, load, description)


def task_ids() -> list[tuple[str, str]]:
    """(id pattern, one line) for `whale tasks`: the registry, in registration order."""
    return [(e.pattern, e.description) for e in REGISTRY.entries()]


def task_entries() -> list[TaskEntry]:
    """Every entry of the registry with its source (`whale tasks`), entry points included."""
    return REGISTRY.entries()


def load_task(
    task_id: str,
    size: int = 100,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    variant: str = "canonical",
) -> Task:
    """A task from its id (see `task_ids()`), its questions worded as `variant` says (see
    `whale.tasks.variants`). Raises UnknownTask naming the bad id (VariantRefused, also a
    ConfigError, for a variant the task does not offer); a dataset file that does not load
    raises UnknownTask naming the file, the record and the field."""
    why = refusal(task_id, variant)
    if why is not None:  # before any dataset is read
        raise VariantRefused(why)
    task = REGISTRY.load(task_id, size, seed, config)
    return with_variant(task, task_id, variant, seed)
