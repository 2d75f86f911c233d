"""`whale cotrain` (WHALE's schedules) and `whale rsft` (a weight phase alone), registered on
`whale.cli.app`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    resolve,
    task_config,
)
from whale.cotrain import (
    STAGEWISE_RULE,
    CotrainConfig,
    check_format,
    cotrain_splits,
    needs_proposer,
    pool_size,
    run_cotrain,
    validation_source,
)
from whale.evaluate import EvalConfig
from whale.harness.executor import ExecutorUnavailable
from whale.models import ModelError, UnknownModel, build_model
from whale.records import RecordError
from whale.search.loop import SearchStopped
from whale.train.launch import LaunchError


def guarded(call: Callable[[], dict[str, Any]], run_dir: Path, kind: str) -> dict[str, Any]:
    """Run a schedule-driving command (`whale cotrain | rsft | diagnose`) with Ctrl-C handling:
    a bad record or model is exit 2; a stopped search (what was paid is kept) exit 1 naming
    the resume command; Ctrl-C says how many rollouts the ledgers hold and exits 130."""
    restore = interrupts.install()
    try:
        return call()
    except (RecordError, ModelError, LaunchError) as e:
        fail(str(e))
        raise  # fail() exits; for the type checker
    except ExecutorUnavailable as e:
        executor_lost(e, f"whale {kind} --resume {run_dir}")
        raise  # executor_lost() exits; for the type checker
    except SearchStopped as e:
        err.print(f"[red]stopped:[/red] {escape(str(e))}; `whale {kind} --resume {run_dir}` "
                  "continues once it is fixed", soft_wrap=True)  # fmt: skip
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        kept = sum(interrupts.recorded(p) for p in run_dir.glob("*/outcomes.jsonl"))
        interrupts.stopped(f"{kept} rollouts recorded; `whale {kind} --resume {run_dir}` "
                           "continues")  # fmt: skip
    finally:
        restore()


def _run(cfg: CotrainConfig, run_dir: Path | None, unsafe: bool, kind: str,
         as_json: bool) -> None:  # fmt: skip
    from whale.harness.contract import run_contract_fault
    from whale.tasks import SplitOverlap, load_task

    # resolve() only checks that the solver exists (cotrain serves it itself), uncached. The
    # task is loaded at the size a run without validation loads: the same train and eval.
    ecfg = EvalConfig(task=cfg.task, harness=cfg.harness, runtime=cfg.runtime,
                      model=dataclasses.replace(cfg.solver, cache=False),
                      n=pool_size(cfg))  # fmt: skip
    task_obj, source, _ = resolve(ecfg, unsafe)
    fault = run_contract_fault(source)
    if fault is not None:
        fail(f"--harness {cfg.harness}: the seed harness {fault}")

    def larger(size: int) -> Any:  # the same task with more questions, for validation
        return load_task(cfg.task.id, size=size, seed=cfg.task.seed, config=task_config(ecfg),
                         variant=cfg.task.variant)  # fmt: skip

    try:
        more = validation_source(task_obj, cfg, larger)
        cotrain_splits(task_obj, cfg, more)
    except (SplitOverlap, ValueError) as e:
        fail(str(e))
    proposer = None
    if needs_proposer(cfg):
        try:
            proposer = build_model(cfg.proposer)
        except (UnknownModel, ModelError) as e:
            fail(f"proposer: {e}")
    if run_dir is None:
        run_dir = new_run_dir(cfg.out, kind, f"{cfg.task.id}-{Path(cfg.harness).stem}")
    if cfg.sweep.enabled:
        grid = len(cfg.sweep.grid())
        err.print(f"[cyan]sweep: {grid} stagewise runs of up to {cfg.rollouts} training "
                  "rollouts each, before the schedules[/cyan]")  # fmt: skip
    say = lambda s: err.print(f"[cyan]{escape(s)}[/cyan]")  # noqa: E731
    meta = guarded(lambda: run_cotrain(cfg, run_dir, task_obj, source, proposer, say, more),
                   run_dir, kind)  # fmt: skip
    mirror_run(cfg.tracking, run_dir)
    if as_json:
        print(json.dumps({k: v for k, v in meta.items() if k != "table"}, default=str))
    else:
        out.print(meta["table"])
        out.print(f"curves: {meta['curves']}  plot: {meta['plot']}")


def _resume_config(resume: Path, given: dict[str, Any], changes: dict[str, Any],
                   set_: list[str]) -> CotrainConfig:  # fmt: skip
    named = [k for k, v in given.items() if v is not None]
    if named:
        fail(f"--resume {resume}: {', '.join(named)} cannot be given with --resume")
    if not (resume / "config.toml").is_file():
        fail(f"--resume {resume}: no config.toml there")
    try:  # before its config.toml is read with today's defaults
        check_format(resume)
    except RecordError as e:
        fail(str(e))
    hold_run_dir(resume)
    base = cfgmod.to_dict(load_config(CotrainConfig, resume / "config.toml", [], {}))
    base.update({k: v for k, v in changes.items() if v is not None})
    cfg: CotrainConfig = load_config(CotrainConfig, None, set_, base)
    return cfg


_SCHEDULE_HELP = "comma-separated: adaptive, fixed, weight-only, harness-only, stagewise"


def _stagewise_flag(text: str) -> list[int | float]:
    """--stagewise E_STAR,I_STAR as numbers (their ranges are the config's check), or exit 2
    saying what is wanted."""
    values: list[int | float] = []
    for part in text.split(","):
        value = cfgmod.parse_value(part.strip())
        if isinstance(value, bool) or not isinstance(value, int | float):
            break
        values.append(value)
    else:
        if len(values) == 2:
            return values
    fail(f"--stagewise {text!r}: want {STAGEWISE_RULE}, e.g. 0.75,3")
    raise AssertionError  # fail() exits; for the type checker


@app.command("cotrain")
def cotrain_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(None, "--harness", help="seed harness name or path"),
    solver: str = typer.Option(None, "--solver", help="solver model (catalog, .gguf, NAME@URL)"),
    proposer: str = typer.Option(None, "--proposer", help="harness phase's proposer model"),
    schedule: str = typer.Option(None, "--schedule", help=_SCHEDULE_HELP),
    rollouts: int = typer.Option(None, "--rollouts", help="training rollouts per schedule"),
    weight_epochs: float = typer.Option(None, "--weight-epochs", help="E (fixed, weight-only)"),
    harness_iters: int = typer.Option(None, "--harness-iters", help="I (fixed, harness-only)"),
    stagewise: str = typer.Option(None, "--stagewise", help="E_STAR,I_STAR: stagewise's "
                                  "one weight stage (epochs > 0) and one harness stage "
                                  "(iterations, an integer >= 1); default 0.75,3"),
    sweep: bool = typer.Option(False, "--sweep", help="first choose stagewise's (E*, I*) from "
                               "the grid sweep.epochs x sweep.iters by validation accuracy "
                               "(needs stagewise among the schedules, and no --stagewise)"),
    cycles: int = typer.Option(None, "--cycles", help="N: most cycles of any schedule"),
    g: int = typer.Option(None, "--g", help="weight phase: trajectories per prompt"),
    m: int = typer.Option(None, "--m", help="harness phase: candidates per iteration"),
    patience: str = typer.Option(None, "--patience", help="J_MIN,P_H of adaptive harness phases"),
    train: int = typer.Option(None, "--train", help="training prompt pool"),
    search: int = typer.Option(None, "--search", help="first N of the pool score harnesses"),
    n_eval: int = typer.Option(None, "--eval", help="held-out questions, read at boundaries"),
    validation: int = typer.Option(None, "--validation", help="validation questions (0: none): "
                                   "the reported best point and the sweep's choice only"),
    serving: str = typer.Option(None, "--serving", help="embedded | hf | vllm"),
    operator: str = typer.Option(None, "--operator", help="search | revise"),
    workers: int = typer.Option(None, "--workers"),
    seed: int = typer.Option(None, "--seed"),
    out_dir: str = typer.Option(None, "--out", help="run directory (default runs/cotrain-...)"),
    resume: Path = typer.Option(None, "--resume", help="continue the run in this directory"),
    config: Path = typer.Option(None, "--config", help="TOML config file"),
    set_: list[str] = typer.Option([], "--set", help="dotted override, e.g. rsft.sft.lr=5e-5"),
    unsafe: bool = typer.Option(
        False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary"),
) -> None:
    """WHALE: alternate weight phases (rejection-sampling SFT of the solver) and harness
    phases (Meta-Harness search), switched by fixed budgets or patience rules, against
    weight-only, harness-only and stagewise baselines at the same rollout budget; the eval
    split is read at every phase boundary (curves only), the validation split too (each
    schedule's reported best point). --sweep first picks stagewise's (E*, I*) by validation
    accuracy (sweep.json). Writes curves.csv, curves.png and summary.md."""
    pat = None
    if patience is not None:
        try:
            pat = [int(x) for x in patience.split(",")]
        except ValueError:
            fail(f"--patience {patience!r}: want J_MIN,P_H, e.g. 6,2")
    star = None if stagewise is None else _stagewise_flag(stagewise)
    scheds = [s.strip() for s in schedule.split(",")] if schedule is not None else None
    if resume is not None:
        given = {"--task": task, "--harness": harness, "--solver": solver, "--g": g, "--m": m,
                 "--proposer": proposer, "--train": train, "--search": search,
                 "--eval": n_eval, "--seed": seed, "--out": out_dir, "--config": config,
                 "--rollouts": rollouts, "--weight-epochs": weight_epochs,
                 "--harness-iters": harness_iters, "--cycles": cycles, "--patience": pat,
                 "--serving": serving, "--operator": operator, "--stagewise": star,
                 "--validation": validation, "--sweep": True if sweep else None}  # fmt: skip
        cfg = _resume_config(resume, given, {"workers": workers, "schedules": scheds}, set_)
        _run(cfg, resume, unsafe, "cotrain", as_json)
        return
    flags = {"task.id": task, "harness": harness, "solver.name": solver,
             "proposer.name": proposer, "schedules": scheds, "rollouts": rollouts,
             "weight_epochs": weight_epochs, "harness_iters": harness_iters, "cycles": cycles,
             "rsft.g": g, "m": m, "patience": pat, "train": train, "search": search,
             "eval": n_eval, "serving": serving, "operator": operator, "workers": workers,
             "seed": seed, "out": out_dir, "stagewise": star, "validation": validation,
             "sweep.enabled": True if sweep else None}  # fmt: skip
    cfg = load_config(CotrainConfig, config, set_, flags)
    check_out(cfg.out)
    _run(cfg, None, unsafe, "cotrain", as_json)


@app.command("rsft")
def rsft_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(None, "--harness", help="the frozen harness (name or path)"),
    solver: str = typer.Option(None, "--solver", help="solver model (catalog, .gguf, NAME@URL)"),
    epochs: float = typer.Option(None, "--epochs", help="epochs of the prompt pool"),
    patience: bool = typer.Option(
        False, "--patience", help="end by the weight patience rule (W = T_min = P_w, "
        "rsft.window / t_min / p_w) instead of after --epochs"
    ),  # fmt: skip
    rollouts: int = typer.Option(None, "--rollouts", help="most weight-phase samples"),
    g: int = typer.Option(None, "--g", help="trajectories per prompt"),
    train: int = typer.Option(None, "--train", help="training prompt pool"),
    n_eval: int = typer.Option(None, "--eval", help="held-out questions, read before and after"),
    serving: str = typer.Option(None, "--serving", help="embedded | hf | vllm"),
    workers: int = typer.Option(None, "--workers"),
    seed: int = typer.Option(None, "--seed"),
    out_dir: str = typer.Option(None, "--out", help="run directory (default runs/rsft-...)"),
    resume: Path = typer.Option(None, "--resume", help="continue the run in this directory"),
    config: Path = typer.Option(None, "--config", help="TOML config file"),
    set_: list[str] = typer.Option([], "--set", help="dotted override, e.g. rsft.lora.r=16"),
    unsafe: bool = typer.Option(
        False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary"),
) -> None:
    """The weight phase alone: rejection-sampling SFT of the solver under a frozen harness
    (G samples per prompt, verifier-accepted ones trained on, LoRA, steps of rsft.step_epochs,
    0.05 epoch by default), the eval and validation splits read before and after. (`whale
    cotrain --schedule weight-only`, one cycle.)"""
    if resume is not None:
        given = {"--task": task, "--harness": harness, "--solver": solver, "--g": g,
                 "--train": train, "--eval": n_eval, "--seed": seed, "--out": out_dir,
                 "--config": config, "--epochs": epochs, "--rollouts": rollouts,
                 "--serving": serving}  # fmt: skip
        cfg = _resume_config(resume, given, {"workers": workers}, set_)
        _run(cfg, resume, unsafe, "rsft", as_json)
        return
    flags = {"task.id": task, "harness": harness, "solver.name": solver,
             "schedules": ["weight-only"], "cycles": 1,
             "weight_patience": True if patience else None,
             "weight_epochs": epochs if epochs is not None or config else 1.0,
             "rollouts": rollouts if rollouts is not None else cfgmod.NONE, "rsft.g": g,
             "train": train, "search": 1, "eval": n_eval, "serving": serving,
             "workers": workers, "seed": seed, "out": out_dir}  # fmt: skip
    cfg = load_config(CotrainConfig, config, set_, flags)
    if cfg.schedules != ["weight-only"]:
        fail("rsft runs the weight phase only (schedules = ['weight-only']): use whale cotrain")
    check_out(cfg.out)
    _run(cfg, None, unsafe, "rsft", as_json)
