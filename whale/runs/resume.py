"""What a resumed run may change: one rule for every command, and the checks that hold it.

A run is resumed by running the command again on its directory; the saved config.toml is the
experiment. A field of a command's config may change on resume iff no recorded result depends
on it, which is true of three kinds of field and no other:

1. Where or how fast rollouts run, never what they produce. Every command has these, and the
   rule finds them by place and type (`resumable`): the top-level `workers` and
   `tracking`; of a `RuntimeConfig`, `warm` and the whole `executor`; of every `ModelConfig`,
   how its backend is reached, cached or paced (`MODEL_REACH`), and `timeout_s` of every model
   but the solver (a teacher edit, evaluate proposal or review that timed out is not kept, it
   is asked for again; an adapt or cotrain round that went on past a timed-out proposal keeps
   it as that round's failed candidate, with the timeout in its error, and the new timeout
   applies to the proposals not yet asked; a solver call that timed out is a recorded outcome,
   and the solver's timeout is part of the outcome fingerprint). A field of this kind that
   only one command has is named by its config class in `where_fields` (adapt:
   `propose.concurrency`).
2. The run's budget: more (or less) of the same experiment. Each command's config class names
   its own in `budget_fields` (adapt: `rounds`; search: `iterations`, `max_rollouts`,
   `patience`; cotrain: `schedules`; train-proposer: `evaluate.only`). Once the eval split was
   read (`eval_read.json`: it is read once, at the end of the budget), the budget is fixed.
3. How recorded results are judged after every rollout has run, named in `judging_fields`
   (diagnose: `z`, which only re-judges the recorded probes).

`out` is not one of them: a resumed run stays in its directory, so another `out` would only
be recorded wrong (refused).

Any other field defines the experiment, and so does a field added to a config later until
it is given one of these kinds. `refuse_changes` holds the rule for every command;
`check_seed` checks the one input that is not in the config, the seed harness's content.
`check_splits` holds what the config alone cannot: that a resume meets the questions the run
started with (a task's data file edited, or whale's split rule changed, between the start and
the resume would otherwise move a question the run was tuned on into its eval split).
Not covered: the content of other files a config names (a `propose.template` file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from whale.harness import RuntimeConfig, harness_hash
from whale.models import ModelConfig
from whale.records import RecordError, iter_jsonl, read_json, write_atomic
from whale.runs.errors import ResumeMismatch

# Fields of every command's config that say where its run is and what mirrors it.
TOP_LEVEL = {
    "workers": "how many rollouts run at once",
    "tracking": "mirrors the finished run into a tracker; never what the run does",
}
# Of a RuntimeConfig: where rollouts run, not what they may do (budget, limits, sandbox).
RUNTIME_WHERE = {
    "warm": "jailed workers started ahead of need",
    "executor": "where rollouts run, not what they produce (the fingerprint leaves it out)",
}
# Of a ModelConfig: how its backend is reached, cached or paced, not which model answers
# (name, base_url, n_ctx define it).
MODEL_REACH = ("threads", "retries", "cache", "cache_path", "api_key_env", "endpoints",
               "max_concurrency", "probe_s", "attempt_timeout_s")  # fmt: skip
SOLVER = "solver"  # the model whose calls are rollouts: its timeout decides outcomes
EVAL_READ = "eval_read.json"  # whale.tasks.SealedSplit's record of the one eval read
SPLITS = "splits.json"  # the questions of each split, as the run first drew them


def resumable(cls: type) -> dict[str, str]:
    """Every dotted field (or whole sub-config, like `runtime.executor`) of config class `cls`
    that a resume may change, with why; see the module docstring for the rule."""
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {k: v for k, v in TOP_LEVEL.items() if k in names}
    for name, sub in _sub_configs(cls, ""):
        if issubclass(sub, RuntimeConfig):
            out.update({f"{name}.{k}": why for k, why in RUNTIME_WHERE.items()})
        elif issubclass(sub, ModelConfig):
            out.update({f"{name}.{k}": "how the backend is reached, cached or paced, not what "
                        "it answers" for k in MODEL_REACH})  # fmt: skip
            if name != SOLVER:
                out[f"{name}.timeout_s"] = ("it applies to the calls not yet made: a kept "
                                            "reply, or a round's failed proposal, stays as "
                                            "it was recorded")  # fmt: skip
    for attr, why in (("where_fields", "where or how fast the run goes, not what it records"),
                      ("budget_fields", "the run's budget (fixed once the eval split was read)"),
                      ("judging_fields", "judges the recorded results; produces none")):
        out.update(dict.fromkeys(getattr(cls, attr, ()), why))
    return out


def may_change(fields: Collection[str], name: str) -> bool:
    """Whether dotted field `name` is one of `fields` or inside a sub-config named there."""
    parts = name.split(".")
    return any(".".join(parts[:i]) in fields for i in range(1, len(parts) + 1))


def changed_fields(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, old value, new value) for every leaf that differs; dicts are walked."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += changed_fields(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [(prefix.rstrip("."), old, new)]


def refuse_changes(saved: Any, requested: Any, run_dir: Path) -> None:
    """ResumeMismatch naming the first field (dotted) of config `requested` that differs from
    `saved` and may not change (`resumable(type(saved))`), or the first budget field that
    changed after the eval split of `run_dir` was read. The one check of every command."""
    cls = type(saved)
    free = resumable(cls)
    changes = changed_fields(asdict(saved), asdict(requested))
    bad = [c for c in changes if not may_change(free, c[0])]
    if bad:
        name, old, new = bad[0]
        more = f" (and {', '.join(c[0] for c in bad[1:])})" if len(bad) > 1 else ""
        raise ResumeMismatch(
            f"--resume {run_dir}: {name} was {old!r} when the run started, now {new!r}{more}: "
            "it defines the experiment, so it cannot change on resume (start a new run); "
            f"these may: {', '.join(sorted(free))}",
            name,
        ).at(name)
    budget: frozenset[str] = getattr(cls, "budget_fields", frozenset())
    grown = [c for c in changes if may_change(budget, c[0])]
    if grown and (run_dir / EVAL_READ).exists():
        name, old, new = grown[0]
        raise ResumeMismatch(
            f"--resume {run_dir}: {name} was {old!r}, now {new!r}, but the eval split was "
            "already read for the final harness of the saved budget; it is read once (start "
            "a new run for a larger budget)",
            name,
        ).at(name)


def check_seed(run_dir: Path, name: str, source: str) -> None:
    """ResumeMismatch when the seed harness `name` is not the one the run started from (its
    hash in `seed.json`, `record_seed`); nothing to check in a run that has none."""
    path = run_dir / "seed.json"
    if not path.exists():
        return
    prior = read_json(path)
    if not isinstance(prior, dict) or not isinstance(prior.get("hash"), str):
        raise RecordError(f"{path}: not a record of the seed harness")
    now = harness_hash(source)
    if now != prior["hash"]:
        raise ResumeMismatch(
            f"--resume {run_dir}: the seed harness {name!r} now hashes to {now}, but the run "
            f"started from {prior['hash']} (saved as harnesses/{prior['hash']}.py): the file "
            "was edited (for a folder, one of its files); restore it, or start a new run",
            "harness",
        ).at("harness")


def record_seed(run_dir: Path, name: str, source: str) -> str:
    """Write `seed.json` (the seed harness's name and hash, what `check_seed` compares a
    resume against); returns the hash."""
    h = harness_hash(source)
    write_atomic(run_dir / "seed.json", json.dumps({"harness": name, "hash": h}))
    return h


def _sub_configs(cls: type, prefix: str) -> list[tuple[str, type]]:
    """(dotted name, class) of every dataclass-typed field below `cls` (`X | None` too)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        for arm in typing.get_args(hint) if union else (hint,):
            if isinstance(arm, type) and dataclasses.is_dataclass(arm):
                out.append((prefix + f.name, arm))
                out += _sub_configs(arm, f"{prefix}{f.name}.")
    return out


def check_splits(run_dir: Path, splits: Mapping[str, Sequence[Any]]) -> None:
    """Write `splits.json` (each split's question ids in order, and a hash of their ids and
    prompts) the first time a run draws its splits; on a resume, ResumeMismatch when any split
    differs. `splits` maps a split's name to its questions (anything with `id` and `prompt`).
    A run made before this record existed gets it on its next resume, checked against its
    ledgers (`_check_ledgers`): refused where a question it rolled out moved across the eval
    split."""
    now = {name: {"ids": [q.id for q in qs], "hash": _questions_hash(qs)}
           for name, qs in splits.items()}  # fmt: skip
    path = run_dir / SPLITS
    if not path.exists():
        _check_ledgers(run_dir, {q.id for q in splits.get("eval", ())})
        write_atomic(path, json.dumps(now, indent=1))
        return
    prior = read_json(path)
    if not isinstance(prior, dict) or not all(
        isinstance(r, dict) and isinstance(r.get("ids"), list) and isinstance(r.get("hash"), str)
        for r in prior.values()
    ):
        raise RecordError(f"{path}: not a record of the run's splits")
    for name, rec in now.items():
        old = prior.get(name)
        if old == rec:
            continue
        what = ("its questions' text changed" if isinstance(old, dict)
                and old.get("ids") == rec["ids"] else "it holds other questions")  # fmt: skip
        raise ResumeMismatch(
            f"--resume {run_dir}: the {name} split is not the one the run started with ({what}; "
            f"{SPLITS}): the task's questions or whale's split rule changed since; resume with "
            "the task data and whale version the run started with, or start a new run",
            "task",
        ).at("task")


# Where a run's ledgers are (whale.runs.ledger): the run's own, a cotrain schedule's, a
# cotrain sweep point's.
_LEDGERS = ("outcomes.jsonl", "*/outcomes.jsonl", "sweep/*/*/outcomes.jsonl")


def _check_ledgers(run_dir: Path, eval_ids: set[str]) -> None:
    """For a run without `splits.json` (a new one, or one made before the record): ResumeMismatch
    when a ledger row puts a question on the wrong side of the eval split now drawn (a question
    rolled out for tuning now in the eval split, or an eval row's question out of it): the
    split rule or the task's data changed since the run started (whale's question identity,
    `normalize_prompt`, did when the record came in, and with it the split of some tasks)."""
    for pattern in _LEDGERS:
        for ledger in sorted(run_dir.glob(pattern)):
            for n, row in iter_jsonl(ledger):
                qid, tag = row.get("question_id"), row.get("split")
                if not isinstance(qid, str) or not isinstance(tag, str):
                    continue
                if (qid in eval_ids) != (tag == "eval"):
                    raise ResumeMismatch(
                        f"--resume {run_dir}: {ledger}:{n} has a {tag!r} rollout of question "
                        f"{qid}, which is {'now' if qid in eval_ids else 'no longer'} in the "
                        "eval split: the task's questions or whale's split rule changed since "
                        "the run started; resume with the task data and whale version the run "
                        "started with, or start a new run",
                        "task",
                    ).at("task")


def _questions_hash(qs: Sequence[Any]) -> str:
    blob = json.dumps([[q.id, q.prompt] for q in qs], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()
