"""An experiment's config (`experiment.toml`): its steps, its scales, and the placeholders that
tie later steps to earlier ones.

    name = "whale"                    # the runs go to ROOT/<name>/<scale>/<step>
    [vars]                            # literals any step may use as "{vars.NAME}"
    solver = "qwen-coder-0.5b"
    [[steps]]
    name = "select"                   # the step's folder; other steps say "{select.task}"
    kind = "select"                   # select | evaluate | adapt | search | rsft | cotrain |
    candidates = ["rg:gcd", ...]      #   diagnose | train_proposer (which also takes `stages`,
                                      #   and `trained_from`: another step's run, see steps.py)
    [[steps]]                         # every other key is a field of the kind's own config, as
    name = "cotrain"                  #   its --config file would hold it
    kind = "cotrain"
    task.id = "{select.task[0]}"
    solver.name = "{vars.solver}"
    [scale.toy]                       # a scale: deep-merged over the above (lists replaced);
    vars.solver = "smollm2-135m"      #   `small` is the file as written, plus [scale.small]
    steps.cotrain.rollouts = 8        #   if there is one; `extends = "toy"` builds on a scale

A placeholder is "{vars.NAME}" or "{STEP.OUTPUT}" (every step has the output `dir`, its run
directory; `select` has its lists; `cotrain` has `stagewise`, the (E*, I*) it ran), with an
optional index, "{select.task[0]}". A string that is one placeholder becomes the value itself
(a list stays a list); inside a longer string the value is written as text. "{{" and "}}"
are literal braces. A reference to an unknown var, step or output, or to a step that runs
later, is a ConfigError naming the step, the field and the reference, found before any step
runs (`check_references`); an index out of range is found when the step's turn comes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale.config import ConfigError

FILE = "experiment.toml"
BASE_SCALE = "small"
KINDS = ("select", "evaluate", "adapt", "search", "rsft", "cotrain", "diagnose",
         "train_proposer")  # fmt: skip
STAGES = ("sft", "grpo", "evaluate")
# What a step's output keys are, beyond `dir` (select's come from its own `lists`).
OUTPUTS = {"cotrain": ("stagewise",)}
# Keys the runner sets, never the config: where each step runs is ROOT/<name>/<scale>/<step>.
RUNNER_SET = ("out", "resume", "run")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_REF = re.compile(r"([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)(?:\[(\d+)\])?")
PORTABLE = "<runs>"  # what the scale's run folder is written as in a step's config hash


@dataclass(frozen=True)
class Step:
    name: str
    kind: str
    stages: tuple[str, ...]  # train_proposer's stages, in order; () for the other kinds
    fields: dict[str, Any]  # the kind's config table, placeholders not yet resolved


@dataclass(frozen=True)
class Spec:
    name: str
    path: Path  # the experiment.toml read
    scale: str
    vars: dict[str, Any]
    steps: tuple[Step, ...]
    sha256: str  # of the scale-resolved config (vars and steps), before any placeholder

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)


@dataclass(frozen=True)
class Ref:
    text: str  # as written, "{select.task[0]}"
    source: str  # "vars" or a step name
    key: str
    index: int | None


def load_spec(directory: str | Path, scale: str = BASE_SCALE) -> Spec:
    """The experiment in `directory` (a folder holding experiment.toml, or the file) at
    `scale`; ConfigError naming the file and field for anything malformed."""
    path = Path(directory)
    path = path / FILE if path.is_dir() else path
    try:
        tree = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"experiment {path}: {e.strerror or e}", "experiment") from None
    except ValueError as e:
        raise ConfigError(f"experiment {path} is not valid TOML: {e}", "experiment") from None
    scales = tree.pop("scale", {})
    if not isinstance(scales, dict) or not all(isinstance(v, dict) for v in scales.values()):
        raise ConfigError(f"{path}: [scale.NAME] must be tables", "scale")
    _steps(tree.get("steps"), path)  # the file's own steps first: errors name them, not a scale
    merged = _scaled(tree, scales, scale, path, ())
    name = merged.pop("name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{path}: name: want a folder name ({_NAME.pattern}), got {name!r}",
                          "name")  # fmt: skip
    merged.pop("description", None)
    variables = merged.pop("vars", {})
    if not isinstance(variables, dict):
        raise ConfigError(f"{path}: [vars] must be a table", "vars")
    steps = _steps(merged.pop("steps", None), path)
    if merged:
        raise ConfigError(f"{path}: unknown key(s) {sorted(merged)}; known: name, description, "
                          "vars, steps, scale", sorted(merged)[0])  # fmt: skip
    canonical = {"name": name, "vars": variables,
                 "steps": [{"name": s.name, "kind": s.kind, "stages": list(s.stages),
                            "fields": s.fields} for s in steps]}  # fmt: skip
    return Spec(name, path, scale, variables, steps, digest(canonical))


def _scaled(tree: dict[str, Any], scales: dict[str, Any], scale: str, path: Path,
            seen: tuple[str, ...]) -> dict[str, Any]:  # fmt: skip
    """`tree` with scale `scale` merged over it (after the scale it extends, if any)."""
    if scale in seen:
        raise ConfigError(f"{path}: scale {scale!r} extends itself ({' -> '.join(seen)})",
                          f"scale.{scale}.extends")  # fmt: skip
    if scale not in scales:
        if scale == BASE_SCALE:
            return copy.deepcopy(tree)
        raise ConfigError(f"{path}: no scale {scale!r}; known: "
                          f"{', '.join(sorted({BASE_SCALE, *scales}))}", "scale")  # fmt: skip
    over = copy.deepcopy(scales[scale])
    parent = over.pop("extends", BASE_SCALE if scale != BASE_SCALE else None)
    base = copy.deepcopy(tree) if parent is None else \
        _scaled(tree, scales, parent, path, (*seen, scale))  # fmt: skip
    step_over = over.pop("steps", {})
    if not isinstance(step_over, dict):
        raise ConfigError(f"{path}: scale.{scale}.steps must be a table of step names",
                          f"scale.{scale}.steps")  # fmt: skip
    known = {s.get("name") for s in base.get("steps", []) if isinstance(s, dict)}
    for name, fields in step_over.items():
        if name not in known:
            raise ConfigError(f"{path}: scale.{scale}.steps.{name}: no step named {name!r}; "
                              f"steps: {', '.join(sorted(map(str, known)))}",
                              f"scale.{scale}.steps.{name}")  # fmt: skip
        target = next(s for s in base["steps"] if s.get("name") == name)
        _merge(target, fields)
    _merge(base, over)
    return base


def _merge(into: dict[str, Any], over: Mapping[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def _steps(rows: Any, path: Path) -> tuple[Step, ...]:
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"{path}: want [[steps]] tables, at least one", "steps")
    out: list[Step] = []
    for row in rows:
        fields = dict(row)
        name, kind = fields.pop("name", None), fields.pop("kind", None)
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "vars":
            raise ConfigError(f"{path}: a step's name must match {_NAME.pattern} (not 'vars'): "
                              f"{name!r}", "steps.name")  # fmt: skip
        where = f"steps.{name}"
        if any(s.name == name for s in out):
            raise ConfigError(f"{path}: two steps are named {name!r}", where)
        if kind not in KINDS:
            raise ConfigError(f"{path}: {where}.kind: {kind!r} is not one of {', '.join(KINDS)}",
                              f"{where}.kind")  # fmt: skip
        stages = fields.pop("stages", None)
        if kind == "train_proposer":
            ok = isinstance(stages, list) and stages and len(set(stages)) == len(stages)
            if not ok or any(s not in STAGES for s in stages):
                raise ConfigError(
                    f"{path}: {where}.stages: want distinct stages of "
                    f"{', '.join(STAGES)}, got {stages!r}",
                    f"{where}.stages",
                )
        elif stages is not None:
            raise ConfigError(f"{path}: {where}.stages: only a train_proposer step has stages",
                              f"{where}.stages")  # fmt: skip
        if "trained_from" in fields and kind != "train_proposer":
            raise ConfigError(f"{path}: {where}.trained_from: only a train_proposer step reads "
                              "another run's proposers", f"{where}.trained_from")  # fmt: skip
        for key in RUNNER_SET:
            if key in fields:
                raise ConfigError(f"{path}: {where}.{key}: the runner sets where a step runs "
                                  "(ROOT/<experiment>/<scale>/<step>); remove it",
                                  f"{where}.{key}")  # fmt: skip
        out.append(Step(name, kind, tuple(stages or ()), fields))
    return tuple(out)


# --- placeholders --------------------------------------------------------------------------


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every string in `value` with its dotted place."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def refs(text: str, where: str) -> list[Ref]:
    """The placeholders in `text`; ConfigError naming `where` for a malformed one."""
    out = []
    for m in _TOKEN.finditer(text):
        if m.group(1) is None:
            continue  # "{{" or "}}"
        ref = _REF.fullmatch(m.group(1))
        if ref is None:
            raise ConfigError(f"{where}: {m.group(0)!r} is not a placeholder (want {{vars.NAME}} "
                              "or {STEP.OUTPUT}, optionally [INDEX]; write {{ for a brace)",
                              where)  # fmt: skip
        index = None if ref.group(3) is None else int(ref.group(3))
        out.append(Ref(m.group(0), ref.group(1), ref.group(2), index))
    return out


def declared_outputs(step: Step) -> set[str]:
    """The outputs a step will have: `dir`, the kind's own, and a select step's lists."""
    out = {"dir", *OUTPUTS.get(step.kind, ())}
    if step.kind == "select":
        lists = step.fields.get("lists", {})
        names = list(lists) if isinstance(lists, dict) else []
        variants = step.fields.get("variants", [])
        out |= {"families", *names}
        out |= {f"{n}_{v}" for n in names for v in (variants if isinstance(variants, list)
                                                     else []) if isinstance(v, str)}  # fmt: skip
    return out


def check_references(spec: Spec) -> None:
    """Every placeholder of every step names a var, or an earlier step and an output it will
    have: checked before any step runs, so a typo in the last step costs nothing."""
    before: dict[str, Step] = {}
    for step in spec.steps:
        for where, text in _strings(step.fields, f"steps.{step.name}"):
            for ref in refs(text, where):
                _check_ref(ref, where, step, spec, before)
        before[step.name] = step


def _check_ref(ref: Ref, where: str, step: Step, spec: Spec, before: dict[str, Step]) -> None:
    if ref.source == "vars":
        if ref.key not in spec.vars:
            raise ConfigError(f"{where}: {ref.text}: no var {ref.key!r}; vars: "
                              f"{', '.join(sorted(spec.vars)) or '(none)'}", where)  # fmt: skip
        return
    if ref.source not in before:
        later = any(s.name == ref.source for s in spec.steps)
        why = (
            f"step {ref.source!r} runs after {step.name!r}"
            if later
            else f"no step {ref.source!r}; steps before it: {', '.join(before) or '(none)'}"
        )
        raise ConfigError(f"{where}: {ref.text}: {why}", where)
    have = declared_outputs(before[ref.source])
    if ref.key not in have:
        raise ConfigError(f"{where}: {ref.text}: step {ref.source!r} has no output {ref.key!r}; "
                          f"it has: {', '.join(sorted(have))}", where)  # fmt: skip


def read_folders(step: Step) -> list[str]:
    """The earlier steps whose folder `step` reads ("{STEP.dir}"), in order, once each."""
    found = [
        ref.source
        for where, text in _strings(step.fields, f"steps.{step.name}")
        for ref in refs(text, where)
        if ref.source != "vars" and ref.key == "dir"
    ]
    return list(dict.fromkeys(found))


def resolve(step: Step, variables: Mapping[str, Any],
            outputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The step's fields with every placeholder replaced (ConfigError naming the field)."""

    def lookup(ref: Ref, where: str) -> Any:
        scope = variables if ref.source == "vars" else outputs.get(ref.source)
        if scope is None or ref.key not in scope:
            raise ConfigError(f"{where}: {ref.text}: {ref.source!r} has no {ref.key!r} "
                              "(did the step finish?)", where)  # fmt: skip
        value = scope[ref.key]
        if ref.index is None:
            return copy.deepcopy(value)
        if not isinstance(value, list) or ref.index >= len(value):
            raise ConfigError(f"{where}: {ref.text}: {ref.source}.{ref.key} is {value!r}, which "
                              f"has no item {ref.index}", where)  # fmt: skip
        return copy.deepcopy(value[ref.index])

    return _walk(step.fields, f"steps.{step.name}", lookup)


def _walk(value: Any, where: str, lookup: Callable[[Ref, str], Any]) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, f"{where}.{k}", lookup) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, f"{where}[{i}]", lookup) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    found = refs(value, where)
    if len(found) == 1 and found[0].text == value:
        return lookup(found[0], where)  # the whole string: the value, of its own type

    def text(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return m.group(0)[0]
        got = lookup(refs(m.group(0), where)[0], where)
        if isinstance(got, list | dict):
            raise ConfigError(f"{where}: {m.group(0)} is a {type(got).__name__}, which cannot be "
                              "written inside a longer string", where)  # fmt: skip
        return str(got)

    return _TOKEN.sub(text, value)


# --- the hash of a step's config -----------------------------------------------------------


def portable(value: Any, runs: Path) -> Any:
    """`value` with the scale's run folder written as PORTABLE: a config hash that does not
    change when the runs are moved with their records."""
    if isinstance(value, dict):
        return {k: portable(v, runs) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v, runs) for v in value]
    if isinstance(value, str):
        return value.replace(str(runs), PORTABLE)
    return value


def digest(value: Any) -> str:
    """sha256 (16 hex digits) of `value` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def step_config(step: Step, resolved: Mapping[str, Any], runs: Path) -> dict[str, Any]:
    """What a step's hash covers: kind, stages and its resolved fields (portable)."""
    return {"kind": step.kind, "stages": list(step.stages), "fields": portable(dict(resolved),
                                                                               runs)}  # fmt: skip
