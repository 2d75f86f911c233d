"""`whale cotrain` (WHALE's schedules) and `whale rsft` (a weight phase alone), over
`whale.api.cotrain` and `whale.api.rsft`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from whale import api
from whale import config as cfgmod
from whale.cli.common import (
    CONFIG,
    JSON,
    PATIENCE,
    RESUME,
    UNSAFE,
    Flags,
    app,
    call,
    fail,
    out,
    pair,
    refuse_on_resume,
    say,
    set_option,
)

_SCHEDULE_HELP = "comma-separated: adaptive, fixed, weight-only, harness-only, stagewise"


def _stagewise_flag(text: str | None) -> list[int | float] | None:
    """--stagewise E_STAR,I_STAR as numbers (their ranges are the config's check), or exit 2
    saying what is wanted."""
    from whale.schedule.cotrain import STAGEWISE_RULE

    if text is None:
        return None
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


def _show(result: api.Run, as_json: bool) -> None:
    if as_json:
        print(json.dumps({k: v for k, v in result.records.items() if k != "table"}, default=str))
    else:
        out.print(result.records["table"])
        out.print(f"curves: {result.records['curves']}  plot: {result.records['plot']}")


def _go(kind: str, resume: Path | None, flags: Flags, config: Path | None, set_: list[str],
        unsafe: bool) -> api.Run:  # fmt: skip
    from whale.schedule.cotrain import CotrainConfig

    fn: Any = api.cotrain if kind == "cotrain" else api.rsft
    if resume is not None:
        refuse_on_resume(resume, CotrainConfig, flags, config)
    return call(lambda: fn(resume=resume, config=config, fields=flags.fields, overrides=set_,
                           unsafe_no_sandbox=unsafe, say=say),
                lambda d: f"whale {kind} --resume {d}")  # fmt: skip


@app.command("cotrain")
def cotrain_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(None, "--harness", help="seed harness: name, .py file or folder"),
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
    resume: Path = RESUME,
    config: Path = CONFIG,
    set_: list[str] = set_option("rsft.sft.lr=5e-5"),
    unsafe: bool = UNSAFE,
    as_json: bool = JSON,
) -> None:
    """WHALE: alternate weight phases (rejection-sampling SFT of the solver) and harness
    phases (Meta-Harness search), switched by fixed budgets or patience rules, against
    weight-only, harness-only and stagewise baselines at the same rollout budget; the eval
    split is read at every phase boundary (curves only), the validation split too (each
    schedule's reported best point). --sweep first picks stagewise's (E*, I*) by validation
    accuracy (sweep.json). Writes curves.csv, curves.png and summary.md."""
    scheds = [s.strip() for s in schedule.split(",")] if schedule is not None else None
    flags = Flags.of(("--task", "task.id", task), ("--harness", "harness", harness),
                     ("--solver", "solver.name", solver), ("--proposer", "proposer.name", proposer),
                     ("--schedule", "schedules", scheds), ("--rollouts", "rollouts", rollouts),
                     ("--weight-epochs", "weight_epochs", weight_epochs),
                     ("--harness-iters", "harness_iters", harness_iters),
                     ("--stagewise", "stagewise", _stagewise_flag(stagewise)),
                     ("--sweep", "sweep.enabled", True if sweep else None),
                     ("--cycles", "cycles", cycles), ("--g", "rsft.g", g), ("--m", "m", m),
                     ("--patience", "patience", pair("--patience", patience, PATIENCE)),
                     ("--train", "train", train), ("--search", "search", search),
                     ("--eval", "eval", n_eval), ("--validation", "validation", validation),
                     ("--serving", "serving", serving), ("--operator", "operator", operator),
                     ("--workers", "workers", workers), ("--seed", "seed", seed),
                     ("--out", "out", out_dir))  # fmt: skip
    _show(_go("cotrain", resume, flags, config, set_, unsafe), as_json)


@app.command("rsft")
def rsft_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(None, "--harness", help="frozen harness: name, file or folder"),
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
    resume: Path = RESUME,
    config: Path = CONFIG,
    set_: list[str] = set_option("rsft.lora.r=16"),
    unsafe: bool = UNSAFE,
    as_json: bool = JSON,
) -> None:
    """The weight phase alone: rejection-sampling SFT of the solver under a frozen harness
    (G samples per prompt, verifier-accepted ones trained on, LoRA, steps of rsft.step_epochs,
    0.05 epoch by default), the eval and validation splits read before and after. (`whale
    cotrain --schedule weight-only`, one cycle.)"""
    flags = Flags.of(("--task", "task.id", task), ("--harness", "harness", harness),
                     ("--solver", "solver.name", solver), ("--epochs", "weight_epochs", epochs),
                     ("--patience", "weight_patience", True if patience else None),
                     ("--rollouts", "rollouts", rollouts), ("--g", "rsft.g", g),
                     ("--train", "train", train), ("--eval", "eval", n_eval),
                     ("--serving", "serving", serving), ("--workers", "workers", workers),
                     ("--seed", "seed", seed), ("--out", "out", out_dir))  # fmt: skip
    _show(_go("rsft", resume, flags, config, set_, unsafe), as_json)
