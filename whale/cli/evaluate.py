"""`whale eval`: a harness with a model on a task; per-question outcomes and a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from whale import api
from whale.cli.common import CONFIG, UNSAFE, Flags, app, call, out, progress, set_option
from whale.harness import seed_names


@app.command("eval")
def eval_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(
        None, "--harness", help=f"seed name ({', '.join(seed_names())}), a .py file or a folder"
    ),
    model: str = typer.Option(None, "--model", help="catalog name, .gguf path, or NAME@BASE_URL"),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible server for --model"),
    n: int = typer.Option(None, "-n", help="number of questions"),
    workers: int = typer.Option(None, "--workers", help="concurrent runs"),
    seed: int = typer.Option(None, "--seed", help="task seed"),
    out_dir: str = typer.Option(None, "--out", help="run directory (default runs/eval-...)"),
    config: Path = CONFIG,
    set_: list[str] = set_option("runtime.budget.model_calls=4"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not use the response cache"),
    unsafe: bool = UNSAFE,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Evaluate a harness with a model on a task; print per-question outcomes and a summary."""
    flags = Flags.of(("--task", "task.id", task), ("--harness", "harness", harness),
                     ("--model", "model.name", model), ("--base-url", "model.base_url", base_url),
                     ("-n", "n", n), ("--workers", "workers", workers),
                     ("--seed", "task.seed", seed), ("--out", "out", out_dir),
                     ("--no-cache", "model.cache", False if no_cache else None))  # fmt: skip
    bar = progress()  # shown once the questions are drawn: a refusal before prints alone
    tid: list[Any] = []

    def start(total: int) -> None:
        bar.start()
        tid.append(bar.add_task(f"eval {flags.fields.get('task.id', '')}".strip(), total=total))

    def run() -> api.Run:
        return api.evaluate(config=config, fields=flags.fields, overrides=set_,
                            unsafe_no_sandbox=unsafe, on_start=start,
                            on_done=lambda o, t: bar.advance(tid[0]))  # fmt: skip

    try:
        result = call(run, lambda d: f"whale eval (a new run; {d} keeps what finished)")
    finally:
        bar.stop()
    summary = result.records
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
