"""The `select` step: task families chosen by a rule written before any result is seen.

    candidates: the families considered, in the config
    for each: `whale eval` of the seed harness with the solver on `n` questions generated with
              `task_seed` (one run directory per family, STEP/<family>/)
    passed:   the families whose accuracy is within `accuracy` = [lo, hi] (inclusive)
    units:    the passed families grouped by generator twins (whale.train.proposer.contexts
              .twin_groups: one generator's families go to one list or none)
    assign:   a seeded shuffle of the units, then each list in turn (lists with a `require`d
              variant first) takes units in shuffled order that fit its remaining places
    short:    a list left unfilled is an error (SelectionShort) naming the rule and the counts;
              the rule is never lowered to fill it

Why `task_seed`: every later step draws its questions from its own task seed (0 unless a config
says otherwise), so the questions read here are other instances of each family. A family with a
small generator space writes some of the same questions under both seeds (rg:coin_flip,
rg:aiw, rg:products did: one of 20 select questions was, word for word, a held-out question of
the proposer step), so the questions read are also drawn clear of the later steps' pools: any
question whose normalized prompt is among the first `exclude_size` questions of task seed
`exclude_seed` is skipped, and the next one of `task_seed` read instead (up to
`_DRAW_FACTOR` x `n` are drawn; a family left with fewer is read on those, and its n says so).
The later pools are prefixes of that one where a family's i-th question depends only on the
seed and i (Reasoning Gym's); a family that draws otherwise (rg:acre: its whole pool
depends on the size) is found by comparing its pools of exclude_size - 1 and exclude_size / 2
questions with the one of exclude_size, and is not read (n = 0, so it fails the rule; so
does a family none of whose drawn questions is clear: rg:emoji_mystery was, while its prompts
all normalized to one text). The format variant
rewords the canonical questions of the same seed, so it is covered by the canonical texts.

Resume: a family whose run directory holds summary.json and a `drawn.json` naming the very
questions drawn now is read back, not run again (one without, from before the exclusion,
is run again); one cut
short is run again from the start (`whale eval` keeps no ledger; the solver's response cache,
`model.cache`, on by default, answers the calls it had made). `selection.json` records every
family's accuracy and n, the rule, the assignment, and why it fell short if it did.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale import config as cfgmod
from whale.errors import WhaleError
from whale.records import read_json, record_dir, write_atomic
from whale.tasks import load_task, refusal
from whale.tasks.base import Question, Task, WrappedTask, normalize_prompt
from whale.tasks.variants import VARIANTS
from whale.train.proposer.contexts import twin_groups

SELECTION = "selection.json"
DRAWN = "drawn.json"  # in a family's run: the questions it read and what they were kept clear of
_LIST = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED = ("dir", "families")  # outputs every select step has
SET_HERE = ("n", "out")  # eval fields select sets itself (task.id and task.seed too)
_DRAW_FACTOR = 10  # questions of task_seed drawn per question read, at most (module docstring)


class SelectionShort(WhaleError):
    """Too few families passed the rule to fill the lists; the message names the rule and the
    counts. The rule is not lowered."""

    field = "lists"


@dataclass
class SelectConfig:
    candidates: list[str] = field(default_factory=list)
    n: int = 20  # questions per family
    task_seed: int = 1000  # a seed no later step's splits use (module docstring)
    exclude_seed: int = 0  # the later steps' task seed: their questions are not read here
    exclude_size: int = 200  # how many of its questions (at least every later step's pool)
    accuracy: list[float] = field(default_factory=lambda: [0.05, 0.6])  # [lo, hi], inclusive
    lists: dict[str, int] = field(default_factory=dict)  # name -> families, in order
    require: dict[str, str] = field(default_factory=dict)  # list -> a variant it must offer
    variants: list[str] = field(default_factory=list)  # outputs LIST_VARIANT: the offering ones
    seed: int = 0  # the shuffle's
    eval: dict[str, Any] = field(default_factory=dict)  # `whale eval` config: harness, model, ..

    def validate(self) -> None:
        if not self.candidates or len(set(self.candidates)) != len(self.candidates) or \
                any(not c.strip() for c in self.candidates):  # fmt: skip
            raise cfgmod.FieldError("candidates", "want distinct, non-empty family ids")
        cfgmod.at_least(self, 1, "n")
        cfgmod.at_least(self, 0, "exclude_size")
        if self.exclude_size and self.exclude_seed == self.task_seed:
            raise cfgmod.FieldError("exclude_seed", "must differ from task_seed: the questions "
                                    "read would all be excluded")  # fmt: skip
        if len(self.accuracy) != 2 or not 0.0 <= self.accuracy[0] <= self.accuracy[1] <= 1.0:
            raise cfgmod.FieldError("accuracy", f"want [lo, hi] with 0 <= lo <= hi <= 1, got "
                                    f"{self.accuracy}")  # fmt: skip
        if not self.lists:
            raise cfgmod.FieldError("lists", "name at least one list and its size")
        for name, size in self.lists.items():
            if not _LIST.fullmatch(name) or name in RESERVED or size < 1:
                raise cfgmod.FieldError(f"lists.{name}", f"want an identifier other than "
                                        f"{', '.join(RESERVED)} and a size >= 1")  # fmt: skip
        for name, variant in self.require.items():
            if name not in self.lists:
                raise cfgmod.FieldError(f"require.{name}", f"no list {name!r}")
            if variant not in VARIANTS:
                raise cfgmod.FieldError(f"require.{name}", f"{variant!r} is not one of {VARIANTS}")
        for variant in self.variants:
            if variant not in VARIANTS:
                raise cfgmod.FieldError("variants", f"{variant!r} is not one of {VARIANTS}")
        task = self.eval.get("task", {})
        given = [k for k in SET_HERE if k in self.eval] + [
            f"task.{k}" for k in ("id", "seed") if isinstance(task, dict) and k in task
        ]
        if given:
            raise cfgmod.FieldError(f"eval.{given[0]}", "select sets it (the candidate, "
                                    "task_seed, n and each family's folder)")  # fmt: skip


@dataclass
class Selection:
    rule: dict[str, Any]
    families: list[dict[str, Any]]  # per candidate: family, correct, n, accuracy, passed, list
    passed: list[str]
    assignment: dict[str, list[str]]
    unassigned: list[str]  # passed, in no list
    short: str | None  # why the lists could not be filled; None when they were


def offers(family: str, variant: str) -> bool:
    return refusal(family, variant) is None


def units(families: Sequence[str]) -> list[tuple[str, ...]]:
    """`families` grouped so that generator twins (taken transitively) are one unit; sorted."""
    groups = twin_groups()
    out: dict[str, set[str]] = {}
    for fam in families:
        group = next((g for g in groups if fam in g), frozenset({fam}))
        out.setdefault(min(group), set()).add(fam)
    return sorted(tuple(sorted(u)) for u in out.values())


def assign(passed: Sequence[str], lists: Mapping[str, int], require: Mapping[str, str],
           seed: int, offer: Callable[[str, str], bool] = offers,
           ) -> tuple[dict[str, list[str]], list[str]]:  # fmt: skip
    """Lists filled from `passed` by a seeded shuffle of twin units (see the module docstring):
    (list -> its families, sorted; the passed families in no list)."""
    pool = units(passed)
    random.Random(f"whale-select:{seed}").shuffle(pool)
    out: dict[str, list[str]] = {name: [] for name in lists}
    taken: set[int] = set()
    for name in sorted(lists, key=lambda n: n not in require):  # required variants first
        variant = require.get(name)
        for i, unit in enumerate(pool):
            room = lists[name] - len(out[name])
            if room == 0:
                break
            if i in taken or len(unit) > room:
                continue
            if variant is not None and not all(offer(f, variant) for f in unit):
                continue
            out[name] += unit
            taken.add(i)
    left = sorted(f for i, u in enumerate(pool) if i not in taken for f in u)
    return {name: sorted(fams) for name, fams in out.items()}, left


def choose(cfg: SelectConfig, readings: Mapping[str, tuple[int, int]],
           offer: Callable[[str, str], bool] = offers) -> Selection:  # fmt: skip
    """The rule applied to `readings` (family -> (correct, n)): which pass, and the lists."""
    lo, hi = cfg.accuracy
    rows: list[dict[str, Any]] = []
    passed: list[str] = []
    for fam in cfg.candidates:
        correct, n = readings[fam]
        acc = correct / n if n else 0.0
        ok = n > 0 and lo <= acc <= hi
        passed += [fam] if ok else []
        rows.append({"family": fam, "correct": correct, "n": n, "accuracy": acc, "passed": ok,
                     "offers": [v for v in VARIANTS if offer(fam, v)]})  # fmt: skip
    lists, left = assign(passed, cfg.lists, cfg.require, cfg.seed, offer)
    where = {f: name for name, fams in lists.items() for f in fams}
    for row in rows:
        row["list"] = where.get(row["family"])
    rule = {"accuracy": list(cfg.accuracy), "n": cfg.n, "task_seed": cfg.task_seed,
            "exclude": {"seed": cfg.exclude_seed, "size": cfg.exclude_size},
            "harness": cfg.eval.get("harness", "single_call"),
            "model": _model_name(cfg.eval), "lists": dict(cfg.lists),
            "require": dict(cfg.require), "seed": cfg.seed,
            "candidates": list(cfg.candidates)}  # fmt: skip
    short = _shortfall(cfg, lists, passed, offer)
    return Selection(rule, rows, passed, lists, left, short)


def _model_name(fields: Mapping[str, Any]) -> str:
    model = fields.get("model", {})
    return str(model.get("name", "(default)")) if isinstance(model, dict) else "(default)"


def _shortfall(cfg: SelectConfig, lists: Mapping[str, list[str]], passed: Sequence[str],
               offer: Callable[[str, str], bool]) -> str | None:  # fmt: skip
    unfilled = [n for n, want in cfg.lists.items() if len(lists[n]) < want]
    if not unfilled:
        return None
    lo, hi = cfg.accuracy
    want = " + ".join(f"{n} {k}" for n, k in cfg.lists.items())
    needs = "".join(f"; {n} must offer the {v!r} variant: {sum(offer(f, v) for f in passed)} of "
                    f"the passed do" for n, v in cfg.require.items())  # fmt: skip
    filled = ", ".join(f"{n} {len(lists[n])}/{k}" for n, k in cfg.lists.items())
    return (
        f"select: {len(passed)} of {len(cfg.candidates)} candidate families passed the rule "
        f"(the seed harness {cfg.eval.get('harness', 'single_call')!r} with "
        f"{_model_name(cfg.eval)}: accuracy in [{lo}, {hi}] on {cfg.n} questions of task "
        f"seed {cfg.task_seed}); the lists want {want} = {sum(cfg.lists.values())}{needs}, "
        f"generator twins kept together; filled: {filled}. The rule is not lowered: add "
        "candidates or change the rule in the config, which is a new experiment"
    )


def folder(family: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", family)


Draw = Callable[[str, "SelectConfig", Mapping[str, Any]], Task]


def family_reading(family: str, cfg: SelectConfig, d: Path, evaluate: Callable[..., Any],
                   draw: Draw | None = None) -> tuple[int, int]:  # fmt: skip
    """(correct, n) of the seed harness on `family`, on the questions `draw` gives (default
    `reading_task`): read back when its run finished on those very questions (DRAWN records
    them), else run (again from the start when cut short: `whale eval` keeps no ledger). A
    family left with no question to read is not run: (0, 0), which fails the rule."""
    task_fields = dict(cfg.eval.get("task", {}))
    task = (draw or reading_task)(family, cfg, task_fields)
    ids = [q.id for q in task.questions()]
    drawn = {"ids": ids, "exclude": {"seed": cfg.exclude_seed, "size": cfg.exclude_size}}
    summary = d / "summary.json"
    if summary.is_file() and (d / DRAWN).is_file() and read_json(d / DRAWN) == drawn:
        s = read_json(summary)
        return round(float(s["accuracy"]) * int(s["n"])), int(s["n"])
    if d.exists():  # cut short, or a reading of other questions (made before DRAWN existed)
        shutil.rmtree(d)
    if not ids:
        return 0, 0
    fields = {**cfg.eval, "task": {**task_fields, "id": family, "seed": cfg.task_seed},
              "n": len(ids)}  # fmt: skip
    run = evaluate(task=task, out=d, fields=fields)
    write_atomic(d / DRAWN, json.dumps(drawn))
    reading = run.held_out["harness"]
    return reading.correct, reading.n


class _Drawn(WrappedTask):
    """A task whose questions are the ones select drew (`reading_task`)."""

    def __init__(self, inner: Task, drawn: list[Question]) -> None:
        super().__init__(inner)
        self.drawn = drawn

    def questions(self) -> list[Question]:
        return list(self.drawn)


def reading_task(family: str, cfg: SelectConfig, task_fields: Mapping[str, Any]) -> Task:
    """`family` with the `n` questions select reads: the first of task seed `task_seed` whose
    text is not among the first `exclude_size` of task seed `exclude_seed` (module docstring)."""
    kw = {"config": task_fields.get("config") or None,
          "variant": task_fields.get("variant", "canonical")}  # fmt: skip
    task = load_task(family, size=cfg.n * _DRAW_FACTOR, seed=cfg.task_seed, **kw)
    later: set[str] = set()
    if cfg.exclude_size:
        canon = load_task(family, size=cfg.exclude_size, seed=cfg.exclude_seed,
                          config=kw["config"])  # fmt: skip
        later = {normalize_prompt(q.prompt) for q in canon.questions()}
        # A family whose pool depends on its size (rg:acre) may hold, at a later step's size,
        # questions its pool at exclude_size lacks: it cannot be read clear of them.
        for size in sorted({cfg.exclude_size - 1, cfg.exclude_size // 2} - {0}):
            smaller = load_task(family, size=size, seed=cfg.exclude_seed, config=kw["config"])
            if any(normalize_prompt(q.prompt) not in later for q in smaller.questions()):
                return _Drawn(task, [])
    kept = [q for q in task.questions() if normalize_prompt(q.prompt) not in later]
    if cfg.exclude_size and kw["variant"] != "canonical":  # the canonical words of each too
        same = load_task(family, size=cfg.n * _DRAW_FACTOR, seed=cfg.task_seed,
                         config=kw["config"]).questions()  # fmt: skip
        clear = {q.id for q in same if normalize_prompt(q.prompt) not in later}
        kept = [q for q in kept if q.id in clear]
    return _Drawn(task, kept[: cfg.n])


def run_select(fields: Mapping[str, Any], step_dir: Path, evaluate: Callable[..., Any],
               say: Callable[[str], None], draw: Draw | None = None) -> dict[str, Any]:  # fmt: skip
    """Read every candidate, apply the rule, write selection.json; the step's outputs (each
    list, `families`: all that passed, LIST_VARIANT for each of `variants`). SelectionShort
    when a list cannot be filled (selection.json says so too)."""
    cfg = cfgmod.build(SelectConfig, dict(fields))
    record_dir(step_dir)
    readings = {}
    for k, fam in enumerate(cfg.candidates, 1):
        readings[fam] = family_reading(fam, cfg, step_dir / folder(fam), evaluate, draw)
        say(f"select: {k}/{len(cfg.candidates)} {fam}: {readings[fam][0]}/{readings[fam][1]}")
    sel = choose(cfg, readings)
    write_atomic(step_dir / SELECTION, json.dumps(asdict(sel), indent=1))
    if sel.short is not None:
        raise SelectionShort(sel.short)
    out: dict[str, Any] = {**sel.assignment, "families": list(sel.passed)}
    for name, fams in sel.assignment.items():
        for v in cfg.variants:
            out[f"{name}_{v}"] = [f for f in fams if offers(f, v)]
    say("select: " + "; ".join(f"{n}: {', '.join(f)}" for n, f in sel.assignment.items()))
    return out
