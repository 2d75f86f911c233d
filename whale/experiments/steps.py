"""One step of an experiment: its kind's API call, new or resumed, and its outputs.

Each kind is the public API's operator (`whale.api`) on the step's run directory: a new step
is the call with `out=DIR`, a started one the same call with `resume=DIR` (train-proposer's
stages take `run=DIR` either way: each stage resumes itself), so the operators' own resume does
the heavy part and nothing paid is paid again. The kinds that cannot resume:
- `evaluate` (`whale eval` keeps no ledger): a finished one (summary.json) is read back, one
  cut short is run again from the start, its model calls answered by the response cache when
  `model.cache` is on (the default);
- `select` resumes family by family (whale.experiments.select).
A train_proposer step may read another step's trained proposers (`trained_from = "{STEP.dir}"`:
its `evaluate` stage in a run directory of its own, `whale.runs.trained`), to evaluate the
same proposers on another question variant without training them twice.

A step is started once the operator's config file is in its directory (before that nothing
was paid), which is how a killed runner, rerun, knows to resume rather than start anew.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, cast

from whale import api
from whale.experiments.select import run_select
from whale.experiments.spec import Step
from whale.records import read_json

Say = Callable[[str], None]
Stage = Literal["sft", "grpo", "evaluate"]  # spec.STAGES, checked when the file is read
# The operators that take out= / resume=, and the config file that says a run was started.
OPERATORS: dict[str, tuple[Callable[..., api.Run], str]] = {
    "adapt": (api.adapt, "config.toml"),
    "search": (api.search, "config.toml"),
    "rsft": (api.rsft, "config.toml"),
    "cotrain": (api.cotrain, "config.toml"),
    "diagnose": (api.diagnose, "diagnose.toml"),
}


def started(step: Step, step_dir: Path) -> bool:
    """Whether the step's operator has begun in `step_dir` (what a rerun resumes)."""
    if step.kind in OPERATORS:
        return (step_dir / OPERATORS[step.kind][1]).is_file()
    if step.kind == "train_proposer":
        return (step_dir / "config.toml").is_file()
    return step_dir.exists()


def run_step(step: Step, step_dir: Path, fields: Mapping[str, Any], say: Say) -> dict[str, Any]:
    """Run (or resume) `step` in `step_dir` with its resolved `fields`; its outputs."""
    outputs: dict[str, Any] = {}
    if step.kind == "select":
        outputs = run_select(fields, step_dir, api.evaluate, say)
    elif step.kind == "evaluate":
        _evaluate(step_dir, fields)
    elif step.kind == "train_proposer":
        mine = dict(fields)
        source = mine.pop("trained_from", None)  # evaluate another step's trained proposers
        for stage in step.stages:
            say(f"{step.name}: train-proposer {stage}")
            api.train_proposer(cast(Stage, stage), step_dir, fields=mine, say=say,
                               trained_from=source)  # fmt: skip
    else:
        fn, _ = OPERATORS[step.kind]
        where = {"resume": step_dir} if started(step, step_dir) else {"out": step_dir}
        run = fn(**where, fields=dict(fields), say=say)
        if step.kind == "cotrain" and "stagewise" in run.records:
            point = run.records["stagewise"]
            outputs["stagewise"] = [point["e_star"], point["i_star"]]
    return {"dir": str(step_dir), **outputs}


def _evaluate(step_dir: Path, fields: Mapping[str, Any]) -> None:
    if (step_dir / "summary.json").is_file():
        read_json(step_dir / "summary.json")  # finished: a record that reads
        return
    if step_dir.exists():
        shutil.rmtree(step_dir)  # cut short: whale eval does not resume (module docstring)
    api.evaluate(out=step_dir, fields=dict(fields))
