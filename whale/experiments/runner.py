"""`whale experiment run`: every step of an experiment, in order, resumably.

    spec    = the experiment.toml at the scale asked for; every placeholder checked
    for each step:
        fields  = its config with the earlier steps' outputs and the vars put in
        record  = what an earlier invocation recorded of it (ROOT/<name>/<scale>/_steps/)
        a record whose config hash differs: refused (StepChanged names the step and field)
        a record that read the folder ("{STEP.dir}") of an earlier step since run anew (the
                  path is the same, the files are not): refused (StepChanged names both)
        finished: skipped, its recorded outputs used
        else:     recorded as started, then run (resumed where its operator had begun),
                  then recorded as finished with its outputs

A killed or interrupted runner, run again, skips what finished and resumes the step it was in
through that operator's own resume, so nothing paid is paid twice (whale.experiments.steps says
which kinds restart and why). A step stopped by a model call that got no reply in time or could
not reach its server (`ModelTimeout`, `ModelUnreachable`, anywhere in the error's chain: a
busy or restarting server, not a wrong config) is resumed so in the same invocation, up to
`retries` times, after `RETRY_PAUSE_S`; each such stop is kept in the step's record
(`transient`). Any other error stops the runner. Ctrl-C and SIGTERM stop the step in progress
as they stop the command itself; its record stays `started`. Two runners on one experiment
and scale are refused (the scale folder is locked).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale.experiments.records import (
    StepRecord,
    identity,
    note_invocation,
    now,
    read_step,
    step_path,
    whale_commit,
    write_step,
)
from whale.experiments.spec import (
    BASE_SCALE,
    Spec,
    Step,
    check_references,
    digest,
    load_spec,
    read_folders,
    resolve,
    step_config,
)
from whale.experiments.steps import run_step, started
from whale.models.base import TRANSIENT
from whale.runs import ResumeMismatch, changed_fields, hold_run_dir

DEFAULT_RUNS = "~/whale-runs/experiments"
HEARTBEAT_S = 60.0  # how often a running step's wall time is written to its record
RETRY_PAUSE_S = 30.0  # before a step stopped by a transient model error is resumed
Say = Callable[[str], None]


class StepChanged(ResumeMismatch):
    """A step that was started (or finished) under one config was asked to run under another."""


@dataclass
class Experiment:
    name: str
    scale: str
    root: Path  # ROOT/<name>/<scale>: every step's folder and the runner's records
    config_sha256: str
    steps: list[dict[str, Any]] = field(default_factory=list)  # name, kind, dir, action, ...


def _quiet(_: str) -> None:
    pass


def scale_root(spec: Spec, runs: str | Path | None) -> Path:
    return Path(runs if runs is not None else DEFAULT_RUNS).expanduser().resolve() / \
        spec.name / spec.scale  # fmt: skip


def run_experiment(directory: str | Path, runs: str | Path | None = None,
                   scale: str = BASE_SCALE, say: Say = _quiet,
                   retries: int = 2) -> Experiment:  # fmt: skip
    """Run (or continue) the experiment in `directory` at `scale`; ROOT is `runs` (default
    ~/whale-runs/experiments). A step stopped by a transient model error is resumed up to
    `retries` times (module docstring). Refusals are WhaleErrors; Ctrl-C raises RunInterrupted
    naming the step's run directory."""
    if retries < 0:
        raise ValueError(f"retries must be >= 0, not {retries}")
    spec = load_spec(directory, scale)
    check_references(spec)
    root = scale_root(spec, runs)
    root.mkdir(parents=True, exist_ok=True)
    lock = hold_run_dir(root)
    try:
        note_invocation(root, spec.name, spec.scale, spec.path, spec.sha256)
        result = Experiment(spec.name, spec.scale, root, spec.sha256)
        outputs: dict[str, dict[str, Any]] = {}
        runs_of: dict[str, str] = {}  # step -> identity of the run of it this invocation used
        for i, step in enumerate(spec.steps, 1):
            fields = resolve(step, spec.vars, outputs)
            config = step_config(step, fields, root)
            record = read_step(root, step.name)
            inputs = {s: runs_of[s] for s in read_folders(step)}
            refuse_changed(step, record, config, root, inputs)
            if record is not None and not record.inputs and inputs:  # a record from before
                record.inputs = inputs
                write_step(root, record)
            step_dir = root / step.name
            if record is not None and record.state == "finished":
                runs_of[step.name] = identity(record)
                say(f"step {i}/{len(spec.steps)} {step.name}: finished earlier, skipped")
                outputs[step.name] = {**record.outputs, "dir": str(step_dir)}
                result.steps.append(_row(record, step_dir, "skipped"))
                continue
            action = "resumed" if started(step, step_dir) else "started"
            say(f"step {i}/{len(spec.steps)} {step.name} ({step.kind}): {action} in {step_dir}")
            record = _begin(root, step, config, record, inputs)
            runs_of[step.name] = identity(record)
            outputs[step.name] = _run_retrying(root, record, step, step_dir, fields, say,
                                               retries)  # fmt: skip
            result.steps.append(_row(record, step_dir, action))
    finally:
        lock.release()
    return result


def refuse_changed(step: Step, record: StepRecord | None, config: dict[str, Any],
                   root: Path, inputs: dict[str, str] | None = None) -> None:  # fmt: skip
    """StepChanged when `record` was made under another config than `config`, or read the
    folder of an earlier step that has been run anew since (`inputs`: the runs it reads now):
    a started step's runs, and a finished step's results, came from the recorded ones."""
    what = "finished; its results came" if record is not None and record.state == "finished" \
        else "was started; its runs so far came"  # fmt: skip
    if record is not None and record.inputs and inputs is not None:
        anew = sorted(s for s, run in record.inputs.items() if inputs.get(s, run) != run)
        if anew:
            raise StepChanged(
                f"step {step.name!r} reads the folder of step {anew[0]!r}, which was run anew "
                f"since. The step {what} from the files of the earlier run of {anew[0]!r}: "
                f"start the step anew by removing {root / step.name} and "
                f"{step_path(root, step.name)}",
                f"steps.{step.name}",
            ).at(f"steps.{step.name}")
    if record is None or record.hash == digest(config):
        return
    changes = changed_fields(record.config, config)
    name, old, new = changes[0] if changes else ("(config)", "?", "?")
    more = f" (and {', '.join(c[0] for c in changes[1:])})" if len(changes) > 1 else ""
    raise StepChanged(
        f"step {step.name!r}: {name} was {old!r}, now {new!r}{more}. The step {what} from the "
        f"recorded config ({step_path(root, step.name)}), so it cannot change: restore the "
        f"config, or start the step anew by removing {root / step.name} and that record",
        f"steps.{step.name}",
    ).at(f"steps.{step.name}")


def _begin(root: Path, step: Step, config: dict[str, Any], record: StepRecord | None,
           inputs: dict[str, str]) -> StepRecord:  # fmt: skip
    if record is None:
        record = StepRecord(step.name, step.kind, digest(config), config, started_at=now(),
                            run_id=uuid.uuid4().hex, inputs=inputs)  # fmt: skip
    commit = whale_commit()
    if commit not in record.commits:
        record.commits.append(commit)
    write_step(root, record)  # before the step runs: a rerun knows it was started
    return record


def _run_retrying(root: Path, record: StepRecord, step: Step, step_dir: Path,
                  fields: dict[str, Any], say: Say, retries: int) -> dict[str, Any]:  # fmt: skip
    """`_run_timed`, the step resumed after a transient model error, `retries` times. Ctrl-C
    in the pause between is Ctrl-C in the step: RunInterrupted naming its directory."""
    from whale.errors import RunInterrupted

    for attempt in range(retries + 1):
        try:
            return _run_timed(root, record, step, step_dir, fields, say)
        except Exception as e:
            cause = _transient(e)
            if attempt == retries or cause is None:
                raise
            why = _told(cause) if cause is e else f"{_told(e)} (from {_told(cause)})"
            record.transient.append(f"{now()} {why}")
            write_step(root, record)
            say(f"step {step.name}: {why}; resumed in {RETRY_PAUSE_S:g} s "
                f"({attempt + 1} of {retries})")  # fmt: skip
        try:
            time.sleep(RETRY_PAUSE_S)
        except KeyboardInterrupt as e:
            if isinstance(e, RunInterrupted):
                raise
            raise RunInterrupted(step_dir) from None
    raise AssertionError("unreachable")


def _told(e: BaseException, most: int = 300) -> str:
    """`Type: message`, the message cut to `most` characters; one whose str() fails is
    named so (a broken error must not end the run in its place)."""
    try:
        text = str(e)
    except Exception as broken:  # any failure of a foreign __str__
        text = f"<str() failed: {type(broken).__name__}>"
    if len(text) > most:
        text = text[:most] + f"... ({len(text) - most} more characters)"
    return f"{type(e).__name__}: {text}"


def _transient(e: BaseException) -> BaseException | None:
    """The transient model error `e` is, or was raised from or during, else None. The chain
    is walked as Python's traceback shows it: an error raised `from None` hides the one it
    was raised during (its author said it is not about it: an embedded server that died
    under a call is a ModelError so, not the ModelUnreachable the call saw)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, TRANSIENT):
            return cur
        seen.add(id(cur))
        if cur.__cause__ is not None:
            cur = cur.__cause__
        elif cur.__suppress_context__:
            return None
        else:
            cur = cur.__context__
    return None


def _run_timed(root: Path, record: StepRecord, step: Step, step_dir: Path,
               fields: dict[str, Any], say: Say) -> dict[str, Any]:  # fmt: skip
    """The step's outputs; its wall time is added to its record whether it finishes or not,
    and every HEARTBEAT_S while it runs, so that a runner killed outright (SIGKILL, a machine
    or session that ends) loses at most that much of the time it ran."""
    t0, before = time.monotonic(), record.wall_s
    lock, stop = threading.Lock(), threading.Event()

    def tick() -> None:
        while not stop.wait(HEARTBEAT_S):
            with lock:
                if stop.is_set():
                    return
                record.wall_s = round(before + time.monotonic() - t0, 1)
                try:
                    write_step(root, record)
                except OSError:  # a full disk must not end the step; the final write says it
                    pass

    beat = threading.Thread(target=tick, name="step-heartbeat", daemon=True)
    beat.start()
    try:
        outputs = run_step(step, step_dir, fields, say)
    except BaseException:
        with lock:
            stop.set()
        record.wall_s = round(before + time.monotonic() - t0, 1)
        write_step(root, record)
        raise
    with lock:
        stop.set()
    record.wall_s = round(before + time.monotonic() - t0, 1)
    record.state, record.finished_at, record.outputs = "finished", now(), outputs
    write_step(root, record)
    return outputs


def _row(record: StepRecord, step_dir: Path, action: str) -> dict[str, Any]:
    return {"step": record.step, "kind": record.kind, "dir": str(step_dir), "action": action,
            "hash": record.hash, "wall_s": record.wall_s}  # fmt: skip
