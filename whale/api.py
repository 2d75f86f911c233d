"""whale's public Python API: the CLI's commands as functions.

    import whale

    run = whale.adapt(task="rg:basic_arithmetic", harness="single_call",
                      solver="qwen-coder-0.5b", proposer="qwen-coder-1.5b", rounds=3, g=4)
    print(run.held_out["seed"], "->", run.held_out["final"])
    print(run.harness)                                  # the final harness's source
    whale.adapt(resume=run.run_dir, rounds=5)           # two more rounds of the same run

Each function takes its command's config: `config=` (a config object, or a TOML file as
`--config` reads it), keyword arguments for the common fields, `fields` for any other (dotted
names: `{"agent.max_steps": 4}`), and `overrides` (as `--set` takes them). Precedence is the
CLI's: config object < keyword arguments and `fields` < TOML file < overrides. Each returns a
`Run` (`whale.runs.result`).

Refusals raise a `whale.WhaleError` subclass whose `field` names the config field, before
anything is paid for where they can be known then; nothing here exits the process. Ctrl-C
raises `RunInterrupted` (a KeyboardInterrupt) once what finished is recorded. A run started
here resumes from Python (`resume=DIR`) or from the CLI (`--resume DIR`; train-proposer's
`--run DIR`) on the same directory, under one rule of what a resume may change
(`whale.runs.resume`).

Task, harness and models may be names (a task id; a seed name or a path; a catalog name, a
`.gguf` path or `NAME@URL`), configs (`ModelConfig`) or objects (a `whale.tasks.TaskBase`, a
harness's source text, a chat model: anything with `.chat`): an object is used as given, and
the config records it as `object:NAME` (a task's with a digest of its questions), which no
registry resolves, so its ledger is never reused for a named task or other questions; a run
of objects resumes from Python with the same objects. `cotrain`, `rsft` and `diagnose` serve
and train their models themselves: they take names. Models are closed when the run ends.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

from whale import config as cfgmod
from whale.errors import RunInterrupted, WhaleError
from whale.models import ChatModel, ModelConfig, close_model
from whale.records import RecordError, write_atomic
from whale.runs import (
    RunDirError,
    check_out,
    hold_run_dir,
    load_run_config,
    new_run_dir,
    refuse_changes,
)
from whale.runs.given import (
    Fields,
    Overrides,
    build_config,
    given_fields,
    object_of,
)
from whale.runs.result import Reading, Run
from whale.runs.setup import check_operator, load_harness, load_task, resolve
from whale.runs.trained import check_evaluate_new, copy_adapters
from whale.tasks import Task

__all__ = [
    "Reading", "Run", "RunInterrupted", "WhaleError", "adapt", "cotrain", "diagnose",
    "evaluate", "load_harness", "load_task", "rsft", "search", "train_proposer",
]  # fmt: skip

C = TypeVar("C")
T = TypeVar("T")
Say = Callable[[str], None]
TaskArg = str | Task | None
ModelArg = str | ModelConfig | ChatModel | None
PathArg = str | Path | None


def _quiet(_: str) -> None:
    pass


# --- eval ---------------------------------------------------------------------------------


def evaluate(
    task: TaskArg = None, harness: str | None = None, model: ModelArg = None, *,
    n: int | None = None, workers: int | None = None, seed: int | None = None,
    out: PathArg = None, config: Any = None, fields: Fields = None, overrides: Overrides = (),
    unsafe_no_sandbox: bool = False, on_done: Callable[[Any, Any], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Run:  # fmt: skip
    """Run `harness` with `model` on `n` questions of `task`, grade each outside the
    harness's reach, and record every outcome and trajectory in a new run directory (`out`,
    or runs/eval-...). `on_start(n)` is called once the questions are drawn, `on_done(outcome,
    trajectory)` as each run finishes."""
    from whale.evaluation import EvalConfig, JsonlWriter, outcome_record
    from whale.evaluation import evaluate as evaluate_runs
    from whale.harness import make_runtime

    given, source_text = given_fields(fields, True, task=task, harness=harness, model=model,
                                      n=n, workers=workers, out=out,
                                      **{"task.seed": seed})  # fmt: skip
    cfg = build_config(EvalConfig, config, overrides, given)
    check_out(cfg.out)
    _check_services(cfg)
    task_obj, source, backend = resolve(cfg, unsafe_no_sandbox, object_of(task), source_text,
                                        object_of(model))  # fmt: skip
    questions = task_obj.questions()[: cfg.n]
    run_dir, lock = _new_run(cfg, "eval", backend)
    try:
        with _in_run(run_dir, total=len(questions)):
            if on_start is not None:
                on_start(len(questions))
            cfgmod.save(cfg, run_dir / "config.toml")
            (run_dir / "harness.py").write_text(source)
            outcomes_f = JsonlWriter(run_dir / "outcomes.jsonl")
            traj_f = JsonlWriter(run_dir / "trajectories.jsonl")
            runtime = make_runtime(cfg.runtime, backend, workers=cfg.workers)

            def done(o: Any, t: Any) -> None:
                outcomes_f.write(outcome_record(o))
                traj_f.write(t.to_dict())
                if on_done is not None:
                    on_done(o, t)

            try:
                result = evaluate_runs(runtime, source, task_obj, questions, cfg.workers,
                                       on_done=done)  # fmt: skip
            finally:
                outcomes_f.close()
                traj_f.close()
                runtime.close()
            summary = {**result.summary(), "task": cfg.task.id, "harness": cfg.harness,
                       "model": cfg.model.name, "run_dir": str(run_dir)}  # fmt: skip
            write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    finally:
        close_model(backend)
        lock.release()
    return Run("eval", run_dir, source, {"harness": _reading(result)}, summary, result.outcomes)


# --- adapt and search ---------------------------------------------------------------------


def adapt(
    task: TaskArg = None, harness: str | None = None, solver: ModelArg = None,
    proposer: ModelArg = None, *, rounds: int | None = None, g: int | None = None,
    select: str | None = None, dev: int | None = None, eval: int | None = None,
    feedback: int | None = None, workers: int | None = None, seed: int | None = None,
    out: PathArg = None, resume: PathArg = None, config: Any = None, fields: Fields = None,
    overrides: Overrides = (), unsafe_no_sandbox: bool = False, say: Say = _quiet,
) -> Run:  # fmt: skip
    """Harness Learning's revision loop (`whale adapt`): T rounds of report, G proposals,
    Apply, score on Q_score and Select; then the seed and the final harness are read once on
    the held-out split (`held_out`: seed, final). `resume=DIR` continues DIR."""
    from whale.revise.run import AdaptConfig, adapt_json, run_adapt, split_pools

    given, source_text = given_fields(fields, task=task, harness=harness, solver=solver,
                                      proposer=proposer, rounds=rounds, g=g, select=select,
                                      dev=dev, eval=eval, feedback=feedback, workers=workers,
                                      seed=seed, out=out)  # fmt: skip
    cfg, run_dir, (result, meta) = _harness_operator(
        AdaptConfig, "adapt", resume, config, overrides, given, unsafe_no_sandbox, split_pools,
        run_adapt, (object_of(task), source_text, object_of(solver), object_of(proposer)), say)
    held = {"seed": _reading(result.seed_eval), "final": _reading(result.final_eval)}
    return Run("adapt", run_dir, _saved_harness(run_dir, result.final_hash), held,
               adapt_json(result, meta), result.final_eval.outcomes)  # fmt: skip


def search(
    task: TaskArg = None, harness: str | None = None, solver: ModelArg = None,
    proposer: ModelArg = None, *, iterations: int | None = None, m: int | None = None,
    dev: int | None = None, eval: int | None = None, workers: int | None = None,
    seed: int | None = None, out: PathArg = None, resume: PathArg = None, config: Any = None,
    fields: Fields = None, overrides: Overrides = (), unsafe_no_sandbox: bool = False,
    say: Say = _quiet,
) -> Run:  # fmt: skip
    """Meta-Harness search (`whale search`): a proposer agent browses the archive of every
    scored candidate and writes M new ones per iteration; the archive's best is accepted; the
    seed and the accepted harness are read once on the held-out split (`held_out`: seed,
    final). `resume=DIR` continues DIR."""
    from whale.metaharness.run import SearchConfig, run_search, search_splits

    given, source_text = given_fields(fields, task=task, harness=harness, solver=solver,
                                      proposer=proposer, iterations=iterations, m=m, dev=dev,
                                      eval=eval, workers=workers, seed=seed,
                                      out=out)  # fmt: skip
    cfg, run_dir, (_, meta) = _harness_operator(
        SearchConfig, "search", resume, config, overrides, given, unsafe_no_sandbox,
        search_splits, run_search,
        (object_of(task), source_text, object_of(solver), object_of(proposer)), say)
    held = {"seed": Reading.of(meta["seed_eval"]["accuracy"], cfg.eval),
            "final": Reading.of(meta["final_eval"]["accuracy"], cfg.eval)}  # fmt: skip
    return Run("search", run_dir, _saved_harness(run_dir, meta["final_eval"]["hash"]), held, meta)


def _harness_operator(cls: type[C], kind: str, resume: PathArg, config: Any,
                      overrides: Overrides, given: dict[str, Any], unsafe: bool,
                      splits: Callable[[Task, C], object], run: Callable[..., T],
                      objects: tuple[Any, ...], say: Say) -> tuple[C, Path, T]:  # fmt: skip
    """`adapt` and `search`: the config (new, or resumed and locked), the checks before any
    cost (`splits(task, cfg)` can be drawn; objects: the task, harness source, solver and
    proposer given as objects, or None), then `run(cfg, run_dir, task, source, solver,
    proposer, say)` in the run directory, then the tracker."""
    cfg, run_dir, lock = _open(cls, kind, resume, config, overrides, given)
    try:
        _check_services(cfg)
        task_obj, source, solver_model, proposer_model = check_operator(
            cfg, unsafe, lambda t: splits(t, cfg), *objects)
        if run_dir is None:
            run_dir, lock = _new_run(cfg, kind, solver_model, proposer_model)
        with _in_run(run_dir):
            out = run(cfg, run_dir, task_obj, source, solver_model, proposer_model, say)
    finally:
        if lock is not None:
            lock.release()
    _mirror(cfg, run_dir, say)
    return cfg, run_dir, out


# --- the weight side ----------------------------------------------------------------------


def cotrain(
    task: TaskArg = None, harness: str | None = None, solver: str | ModelConfig | None = None,
    proposer: str | ModelConfig | None = None, *, schedules: Sequence[str] | None = None,
    rollouts: int | None = None, workers: int | None = None, seed: int | None = None,
    out: PathArg = None, resume: PathArg = None, config: Any = None, fields: Fields = None,
    overrides: Overrides = (), unsafe_no_sandbox: bool = False, say: Say = _quiet,
) -> Run:  # fmt: skip
    """WHALE (`whale cotrain`): each schedule (adaptive, fixed, weight-only, harness-only,
    stagewise) alternates weight phases and harness phases on one ledger; the eval split is
    read at every phase boundary (`held_out`: base, and each schedule's final read). The
    solver is trained, so it is named (a config), never an object."""
    given, _ = given_fields(fields, False, task=task, harness=harness, solver=solver,
                            proposer=proposer,
                            schedules=None if schedules is None else list(schedules),
                            rollouts=rollouts, workers=workers, seed=seed, out=out)  # fmt: skip
    return _weights("cotrain", resume, config, overrides, given, unsafe_no_sandbox, task, say)


def rsft(
    task: TaskArg = None, harness: str | None = None, solver: str | ModelConfig | None = None,
    *, epochs: float | None = None, rollouts: int | None = None, workers: int | None = None,
    seed: int | None = None, out: PathArg = None, resume: PathArg = None, config: Any = None,
    fields: Fields = None, overrides: Overrides = (), unsafe_no_sandbox: bool = False,
    say: Say = _quiet,
) -> Run:  # fmt: skip
    """The weight phase alone (`whale rsft`): rejection-sampling SFT of the solver under a
    frozen harness, `epochs` of the prompt pool; the eval split read before and after
    (`held_out`: base, weight-only)."""
    given, _ = given_fields(fields, False, task=task, harness=harness, solver=solver,
                            rollouts=rollouts, workers=workers, seed=seed, out=out,
                            weight_epochs=epochs)  # fmt: skip
    if resume is None:  # what makes cotrain's config the weight phase alone
        given = {"schedules": ["weight-only"], "cycles": 1, "search": 1, **given}
        if "weight_epochs" not in given and config is None:
            given["weight_epochs"] = 1.0
        if "rollouts" not in given and not dataclasses.is_dataclass(config):
            given["rollouts"] = cfgmod.NONE  # no cap: the epochs (or patience) end it
    return _weights("rsft", resume, config, overrides, given, unsafe_no_sandbox, task, say)


def _weights(kind: str, resume: PathArg, config: Any, overrides: Overrides,
             given: dict[str, Any], unsafe: bool, task: TaskArg, say: Say) -> Run:  # fmt: skip
    """`cotrain` and `rsft`: the checks before any cost, then the schedules."""
    from whale.schedule.cotrain import CotrainConfig, check_format, run_cotrain
    from whale.schedule.setup import prepare

    if resume is not None:
        check_format(Path(resume))  # before its config.toml is read with today's defaults
    cfg, run_dir, lock = _open(CotrainConfig, kind, resume, config, overrides, given)
    try:
        if kind == "rsft" and cfg.schedules != ["weight-only"]:
            raise cfgmod.ConfigError("rsft runs the weight phase only (schedules = "
                                     "['weight-only']): use whale cotrain").at("schedules")
        _check_services(cfg)
        task_obj, source, proposer_model, more = prepare(cfg, unsafe, object_of(task))
        if run_dir is None:
            run_dir, lock = _new_run(cfg, kind, proposer_model)
        with _in_run(run_dir):
            meta = run_cotrain(cfg, run_dir, task_obj, source, proposer_model, say, more)
    finally:
        if lock is not None:
            lock.release()
    _mirror(cfg, run_dir, say)
    rows = meta["summary"]
    held = {r["schedule"]: Reading.of(r["final"], cfg.eval) for r in rows if r["final"] is not None}
    if rows and rows[0]["base"] is not None:  # every schedule starts from the same read
        held = {"base": Reading.of(rows[0]["base"], cfg.eval), **held}
    return Run(kind, run_dir, None, held, meta)


def train_proposer(
    stage: Literal["sft", "grpo", "evaluate"], run: PathArg = None, *, config: Any = None,
    fields: Fields = None, overrides: Overrides = (), unsafe_no_sandbox: bool = False,
    say: Say = _quiet, trained_from: PathArg = None,
) -> Run:  # fmt: skip
    """Train the proposer (`whale train-proposer sft | grpo | evaluate`) on one run
    directory and one config: `sft` makes the directory when `run` is None; `grpo` and
    `evaluate` continue it; a stage run again on it resumes. `evaluate` may also start a
    directory of its own (`run` new or empty) with `trained_from=RUN`: RUN's adapters are
    copied in and read as its `sft` / `grpo` (`whale.runs.trained`). Precedence: the saved
    config < `fields` (dotted: `{"grpo.updates": 2}`) < `config` < `overrides`."""
    from whale.train.proposer import run as runmod

    if stage not in ("sft", "grpo", "evaluate"):
        raise cfgmod.ConfigError(f"stage: {stage!r} is not one of 'sft', 'grpo', 'evaluate'"
                                 ).at("stage")  # fmt: skip
    run_dir = None if run is None else Path(run)
    given = dict(fields or {})
    if unsafe_no_sandbox:
        given["runtime.sandbox"] = "unsafe"
    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run {run_dir}: exists and is not a directory").at("run")
    fresh = True  # no config.toml in run_dir: sft (or evaluate, below) starts the run there
    if run_dir is not None and (run_dir / "config.toml").is_file():
        fresh = False
        if dataclasses.is_dataclass(config):
            raise cfgmod.ConfigError(f"config: {run_dir} holds the run's config.toml; give "
                                     "`fields` or `overrides` to change it").at("config")
        base: Any = load_run_config(run_dir, runmod.ProposerTrainConfig)
    elif stage == "grpo" or run_dir is None and stage == "evaluate":
        raise RunDirError(f"--run {run_dir}: no config.toml there (start with `whale "
                          "train-proposer sft`)" if run_dir is not None else
                          f"train-proposer {stage}: --run DIR (the directory `sft` made) is "
                          "required").at("run")  # fmt: skip
    else:
        base = config if dataclasses.is_dataclass(config) else None
    path = config if isinstance(config, str | Path) else None
    cfg = build_config(runmod.ProposerTrainConfig, base if base is not None else path,
                       overrides, given, path if base is not None else None)  # fmt: skip
    if cfg.runtime.sandbox == "unsafe" and not unsafe_no_sandbox:  # as adapt: only when said
        raise cfgmod.ConfigError("runtime.sandbox = 'unsafe' runs model-written code WITHOUT "
                                 "isolation: give --unsafe-no-sandbox to mean it (every "
                                 "command of the run needs it)").at("runtime.sandbox")
    source = None if trained_from is None else Path(trained_from)
    if source is not None and (stage != "evaluate" or run_dir is None):
        raise cfgmod.ConfigError("trained_from: only `evaluate` on a run directory of its own "
                                 "(`run`) reads another run's proposers"
                                 ).at("trained_from")  # fmt: skip
    if stage == "evaluate" and fresh and run_dir is not None:
        check_evaluate_new(run_dir, cfg.evaluate.subject, cfg.evaluate.against, source)
    _check_services(cfg)
    if run_dir is None:
        run_dir, lock = new_run_dir(cfg.out, "train-proposer", f"{len(cfg.families.sft)}-families")
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = hold_run_dir(run_dir)
    stages = {"sft": runmod.run_sft, "grpo": runmod.run_grpo, "evaluate": runmod.run_evaluate}
    try:
        with _in_run(run_dir):
            if source is not None:
                copy_adapters(source, run_dir)
            runmod.open_run(cfg, run_dir)
            result = stages[stage](cfg, run_dir, say)
    finally:
        lock.release()
    _mirror(cfg, run_dir, say)
    return Run(f"train-proposer {stage}", run_dir, None, {}, result)


def diagnose(
    task: TaskArg = None, harness: str | None = None, solver: str | ModelConfig | None = None,
    proposer: str | ModelConfig | None = None, *, rollouts: int | None = None,
    workers: int | None = None, seed: int | None = None, out: PathArg = None,
    resume: PathArg = None, config: Any = None, fields: Fields = None,
    overrides: Overrides = (), unsafe_no_sandbox: bool = False, say: Say = _quiet,
) -> Run:  # fmt: skip
    """Harness bottleneck or model bottleneck (`whale diagnose`): a short harness-only probe
    and a short weight-only probe at one rollout budget, a probe split read before and after
    each; per capability, which lever moved it beyond noise (`records`: diagnosis.json)."""
    from whale.analysis.diagnose import CONFIG_NAME, DiagnoseConfig, prepare, run_diagnose

    given, _ = given_fields(fields, False, task=task, harness=harness, solver=solver,
                            proposer=proposer, rollouts=rollouts, workers=workers, seed=seed,
                            out=out)  # fmt: skip
    cfg, run_dir, lock = _open(DiagnoseConfig, "diagnose", resume, config, overrides, given,
                               CONFIG_NAME)  # fmt: skip
    try:
        _check_services(cfg)
        task_obj, source, proposer_model = prepare(cfg, unsafe_no_sandbox, object_of(task))
        if run_dir is None:
            run_dir, lock = _new_run(cfg, "diagnose", proposer_model)
        with _in_run(run_dir):
            diag = run_diagnose(cfg, run_dir, task_obj, source, proposer_model, say)
    finally:
        if lock is not None:
            lock.release()
    return Run("diagnose", run_dir, None, {}, diag)


# --- shared steps -------------------------------------------------------------------------


def _open(cls: type[C], kind: str, resume: PathArg, config: Any, overrides: Overrides,
          given: Mapping[str, Any],
          name: str = "config.toml") -> tuple[C, Path | None, Any]:  # fmt: skip
    """A new run's config (its directory is made once everything is checked), or a resumed
    run's, locked: its saved config.toml < the fields given < overrides. The run functions
    refuse, by the one resume rule, a change that would alter the experiment."""
    if resume is None:
        cfg = build_config(cls, config, overrides, given)
        check_out(getattr(cfg, "out", None))
        return cfg, None, None
    run_dir = Path(resume)
    if config is not None:
        raise cfgmod.ConfigError(f"--resume {run_dir}: --config cannot be given with --resume "
                                 "(the run's config.toml fixes the experiment)").at("config")
    if not run_dir.is_dir():
        raise RunDirError(f"--resume {run_dir}: not a directory").at("resume")
    lock = hold_run_dir(run_dir)
    try:
        try:
            saved = load_run_config(run_dir, cls, name, command=f"whale {kind}")
        except RecordError as e:
            raise e.at("resume") from None
        cfg = build_config(cls, saved, overrides, given)
        refuse_changes(saved, cfg, run_dir)  # before the new task or models are loaded
    except BaseException:
        lock.release()
        raise
    return cfg, run_dir, lock


def _new_run(cfg: Any, kind: str, *models: Any) -> tuple[Path, Any]:
    """A new run directory for `cfg`, locked; the models built for the run are closed when
    none can be made."""
    try:
        return new_run_dir(cfg.out, kind, f"{cfg.task.id}-{Path(cfg.harness).stem}")
    except WhaleError:
        for m in models:
            close_model(m)
        raise


@contextmanager
def _in_run(run_dir: Path, total: int | None = None) -> Iterator[None]:
    """Errors raised once a run directory exists name it (resume there); Ctrl-C becomes
    RunInterrupted(run_dir) (`total`: the rollouts the run was to make, said where the run
    cannot be resumed)."""
    try:
        yield
    except WhaleError as e:
        if e.run_dir is None:
            e.run_dir = run_dir
        raise
    except KeyboardInterrupt as e:
        if isinstance(e, RunInterrupted):
            raise
        raise RunInterrupted(run_dir, total) from None


def _check_services(cfg: Any) -> None:
    """The tracker and the executor a config names are installed, before anything is paid."""
    if getattr(cfg, "tracking", "none") != "none":
        from whale.analysis.tracking import TrackingUnavailable, require

        try:
            require(cfg.tracking)
        except TrackingUnavailable as e:
            raise e.at("tracking") from None
    executor = getattr(getattr(cfg, "runtime", None), "executor", None)
    if executor is not None and executor.kind == "ray":
        from whale.harness.executor import RAY_MISSING, ray_available

        if not ray_available():
            raise cfgmod.ConfigError(RAY_MISSING).at("runtime.executor.kind")


def _mirror(cfg: Any, run_dir: Path, say: Say) -> None:
    """After a finished run: mirror its records into the configured tracker (`tracking`). The
    run is on disk already, so a tracker that fails is said, not raised."""
    kind = getattr(cfg, "tracking", "none")
    if kind == "none":
        return
    from whale.analysis.tracking import track_run

    try:
        n = track_run(kind, run_dir)
    except Exception as e:  # noqa: BLE001 - a third-party tracker's failure of any kind
        say(f"tracking ({kind}) failed, the run is unaffected: {e}")
        return
    say(f"tracking ({kind}): {n} metric points mirrored from {run_dir}")


def _reading(ev: Any) -> Reading:
    return Reading(sum(1 for o in ev.outcomes if o.correct), len(ev.outcomes))


def _saved_harness(run_dir: Path, h: str) -> str:
    """The harness saved under hash `h` in the run's ledger, checked against the hash."""
    from whale.runs.ledger import saved_harness

    return saved_harness(run_dir, h)
