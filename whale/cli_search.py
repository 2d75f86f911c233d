"""`whale search`: Meta-Harness archive search (registered on `whale.cli.app`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from whale import config as cfgmod
from whale import interrupts
from whale.cli import (
    app,
    check_out,
    err,
    executor_lost,
    fail,
    hold_run_dir,
    load_config,
    mirror_run,
    new_run_dir,
    out,
    resolve_operator,
)
from whale.evaluate import EvalConfig
from whale.harness.executor import ExecutorUnavailable
from whale.records import RecordError
from whale.search.loop import SearchStopped
from whale.search.run import SearchConfig, run_search, search_splits
from whale.tasks import EvalAlreadyRead


@app.command("search")
def search_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(None, "--harness", help="seed harness name or path"),
    solver: str = typer.Option(None, "--solver", help="solver model (catalog, .gguf, NAME@URL)"),
    proposer: str = typer.Option(
        None, "--proposer", help="proposer agent's model (also a trained adapter folder)"
    ),
    iterations: int = typer.Option(None, "--iterations", help="search iterations I"),
    m: int = typer.Option(None, "--m", help="candidates per iteration M"),
    patience: str = typer.Option(
        None, "--patience", help="J_MIN,P_H: stop when the archive best has not improved for "
        "P_H iterations after J_MIN (WHALE: 6,2)"
    ),  # fmt: skip
    dev: int = typer.Option(None, "--dev", help="search-split questions"),
    n_eval: int = typer.Option(None, "--eval", help="held-out questions, read once at the end"),
    workers: int = typer.Option(None, "--workers"),
    seed: int = typer.Option(None, "--seed"),
    out_dir: str = typer.Option(None, "--out", help="run directory (default runs/search-...)"),
    resume: Path = typer.Option(None, "--resume", help="continue the run in this directory"),
    config: Path = typer.Option(None, "--config", help="TOML config file"),
    set_: list[str] = typer.Option([], "--set", help="dotted override, e.g. agent.max_steps=6"),
    unsafe: bool = typer.Option(
        False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary"),
) -> None:
    """Meta-Harness search: a proposer agent reads an archive of every scored candidate and
    writes M new ones per iteration; the archive's best is accepted. Then the seed and the
    accepted harness are scored once on the held-out questions."""
    pat = None
    if patience is not None:
        try:
            pat = [int(x) for x in patience.split(",")]
        except ValueError:
            fail(f"--patience {patience!r}: want J_MIN,P_H, e.g. 6,2")
    if resume is not None:
        given = {"--task": task, "--harness": harness, "--solver": solver, "--m": m,
                 "--proposer": proposer, "--dev": dev, "--eval": n_eval, "--seed": seed,
                 "--out": out_dir, "--config": config}  # fmt: skip
        named = [k for k, v in given.items() if v is not None]
        if named:
            fail(f"--resume {resume}: {', '.join(named)} cannot be given with --resume")
        if not (resume / "config.toml").is_file():
            fail(f"--resume {resume}: no config.toml there")
        hold_run_dir(resume)
        base = cfgmod.to_dict(load_config(SearchConfig, resume / "config.toml", [], {}))
        for k, v in (("iterations", iterations), ("workers", workers), ("patience", pat)):
            if v is not None:
                base[k] = v
        cfg: SearchConfig = load_config(SearchConfig, None, set_, base)
        run_dir = resume
    else:
        flags = {"task.id": task, "harness": harness, "solver.name": solver,
                 "proposer.name": proposer, "iterations": iterations, "m": m, "patience": pat,
                 "dev": dev, "eval": n_eval, "workers": workers, "seed": seed,
                 "out": out_dir}  # fmt: skip
        cfg = load_config(SearchConfig, config, set_, flags)
        check_out(cfg.out)
        run_dir = None  # type: ignore[assignment]
    ecfg = EvalConfig(task=cfg.task, harness=cfg.harness, model=cfg.solver, runtime=cfg.runtime,
                      n=cfg.dev + cfg.eval)  # fmt: skip
    task_obj, source, solver_model, proposer_model = resolve_operator(
        ecfg, cfg.proposer, unsafe, lambda t: search_splits(t, cfg)
    )
    if run_dir is None:
        run_dir = new_run_dir(cfg.out, "search", f"{cfg.task.id}-{Path(cfg.harness).stem}")
    say = lambda s: err.print(f"[cyan]{s}[/cyan]")  # noqa: E731
    restore_signals = interrupts.install()
    try:
        _, meta = run_search(cfg, run_dir, task_obj, source, solver_model, proposer_model, say)
    except (RecordError, EvalAlreadyRead) as e:
        fail(str(e))
    except ExecutorUnavailable as e:  # what was paid is in the ledger and the archive
        executor_lost(e, f"whale search --resume {run_dir}")
    except SearchStopped as e:  # what was paid is kept
        err.print(f"[red]stopped:[/red] {escape(str(e))}; `whale search --resume {run_dir}` "
                  "continues once it is fixed", soft_wrap=True)  # fmt: skip
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        kept = interrupts.recorded(run_dir / "outcomes.jsonl")
        interrupts.stopped(f"{kept} rollouts recorded; `whale search --resume {run_dir}` "
                           "continues")  # fmt: skip
    finally:
        restore_signals()
    mirror_run(cfg.tracking, run_dir)
    if as_json:
        print(json.dumps(meta))
    else:
        from whale.search.run import summary_markdown

        out.print(summary_markdown(meta))
