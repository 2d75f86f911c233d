"""`whale diagnose`: a short harness-only probe and a short weight-only probe at one rollout
budget, and per capability which lever moved it (registered on `whale.cli.app`; the rule is in
`whale.analysis.diagnose`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.markup import escape

from whale import config as cfgmod
from whale.analysis.diagnose import CONFIG_NAME, DiagnoseConfig, run_diagnose
from whale.cli import (
    app,
    check_out,
    err,
    fail,
    hold_run_dir,
    load_config,
    new_run_dir,
    out,
    resolve,
)
from whale.cli_train import guarded
from whale.evaluate import EvalConfig
from whale.models import ModelError, UnknownModel, build_model


def _run(cfg: DiagnoseConfig, run_dir: Path | None, unsafe: bool, as_json: bool) -> None:
    from whale.analysis.diagnose import Excluding, adapt_held_out
    from whale.cotrain import cotrain_splits
    from whale.harness.contract import run_contract_fault
    from whale.tasks import SplitOverlap

    ecfg = EvalConfig(task=cfg.task, harness=cfg.harness, runtime=cfg.runtime,
                      model=dataclasses.replace(cfg.solver, cache=False),
                      n=cfg.pool_size())  # fmt: skip
    task_obj, source, _ = resolve(ecfg, unsafe)
    fault = run_contract_fault(source)
    if fault is not None:
        fail(f"--harness {cfg.harness}: the seed harness {fault}")
    try:  # the splits can be drawn (before any run dir or model)
        pool = Excluding(task_obj, adapt_held_out(task_obj, cfg.seed)) if cfg.reserve_adapt \
            else task_obj  # fmt: skip
        cotrain_splits(pool, cfg.cotrain())  # type: ignore[arg-type]
    except (SplitOverlap, ValueError) as e:
        fail(f"{e} (diagnose keeps whale adapt's held-out questions out: reserve_adapt)")
    try:
        proposer = build_model(cfg.proposer)
    except (UnknownModel, ModelError) as e:
        fail(f"proposer: {e}")
    if run_dir is None:
        run_dir = new_run_dir(cfg.out, "diagnose", f"{cfg.task.id}-{Path(cfg.harness).stem}")
    say = lambda s: err.print(f"[cyan]{escape(s)}[/cyan]")  # noqa: E731
    diag = guarded(lambda: run_diagnose(cfg, run_dir, task_obj, source, proposer, say), run_dir,
                   "diagnose")  # fmt: skip
    if as_json:
        print(json.dumps({k: v for k, v in diag.items() if k != "table"}, default=str))
    else:
        out.print(diag["table"], markup=False, highlight=False, soft_wrap=True)
        out.print(f"written: {run_dir / 'diagnosis.md'}  {run_dir / 'diagnosis.json'}")


@app.command("diagnose")
def diagnose_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:letter_counting or mhqa"),
    harness: str = typer.Option(None, "--harness", help="seed harness name or path"),
    solver: str = typer.Option(None, "--solver", help="solver model (catalog, .gguf, NAME@URL)"),
    proposer: str = typer.Option(None, "--proposer", help="the harness probe's proposer model"),
    rollouts: int = typer.Option(None, "--rollouts", help="training rollouts of EACH probe"),
    train: int = typer.Option(None, "--train", help="training prompt pool"),
    search: int = typer.Option(None, "--search", help="first N of the pool score harnesses"),
    n_eval: int = typer.Option(None, "--eval", help="probe questions, read before and after"),
    z: float = typer.Option(None, "--z", help="moved = improved by more than z standard errors"),
    serving: str = typer.Option(None, "--serving", help="embedded | hf | vllm"),
    operator: str = typer.Option(None, "--operator", help="search | revise"),
    workers: int = typer.Option(None, "--workers"),
    seed: int = typer.Option(None, "--seed"),
    out_dir: str = typer.Option(None, "--out", help="run directory (default runs/diagnose-...)"),
    resume: Path = typer.Option(None, "--resume", help="continue the run in this directory"),  # noqa: B008
    config: Path = typer.Option(None, "--config", help="TOML config file"),  # noqa: B008
    set_: list[str] = typer.Option([], "--set", help="dotted override, e.g. rsft.g=2"),  # noqa: B008
    unsafe: bool = typer.Option(
        False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the diagnosis as one JSON object"),
) -> None:
    """Harness bottleneck or model bottleneck? Runs a short harness-only probe and a short
    weight-only probe (whale cotrain, one cycle each) at the same rollout budget, reads a probe
    split before and after each, and says per capability (format compliance, truncation,
    retrieval accuracy, answer extraction, accuracy) which lever moved it beyond noise.
    Writes diagnosis.md and diagnosis.json in the run directory."""
    if resume is not None:
        given = {"--task": task, "--harness": harness, "--solver": solver,
                 "--proposer": proposer, "--rollouts": rollouts, "--train": train,
                 "--search": search, "--eval": n_eval, "--serving": serving,
                 "--operator": operator, "--seed": seed, "--out": out_dir,
                 "--config": config}  # fmt: skip
        named = [k for k, v in given.items() if v is not None]
        if named:
            fail(f"--resume {resume}: {', '.join(named)} cannot be given with --resume")
        if not (resume / CONFIG_NAME).is_file():
            fail(f"--resume {resume}: no {CONFIG_NAME} there (not a whale diagnose run)")
        hold_run_dir(resume)
        base = cfgmod.to_dict(load_config(DiagnoseConfig, resume / CONFIG_NAME, [], {}))
        base.update({k: v for k, v in {"workers": workers, "z": z}.items() if v is not None})
        cfg: DiagnoseConfig = load_config(DiagnoseConfig, None, set_, base)
        _run(cfg, resume, unsafe, as_json)
        return
    flags = {"task.id": task, "harness": harness, "solver.name": solver,
             "proposer.name": proposer, "rollouts": rollouts, "train": train, "search": search,
             "eval": n_eval, "z": z, "serving": serving, "operator": operator,
             "workers": workers, "seed": seed, "out": out_dir}  # fmt: skip
    cfg = load_config(DiagnoseConfig, config, set_, flags)
    check_out(cfg.out)
    _run(cfg, None, unsafe, as_json)
