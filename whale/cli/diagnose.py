"""`whale diagnose`: a short harness-only probe and a short weight-only probe at one rollout
budget, and per capability which lever moved it, over `whale.api.diagnose` (the rule is in
`whale.analysis.diagnose`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from whale import api
from whale.cli.common import (
    CONFIG,
    RESUME,
    UNSAFE,
    Flags,
    app,
    call,
    out,
    refuse_on_resume,
    say,
    set_option,
)


@app.command("diagnose")
def diagnose_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:letter_counting or mhqa"),
    harness: str = typer.Option(None, "--harness", help="seed harness: name, .py file or folder"),
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
    resume: Path = RESUME,
    config: Path = CONFIG,
    set_: list[str] = set_option("rsft.g=2"),
    unsafe: bool = UNSAFE,
    as_json: bool = typer.Option(False, "--json", help="print the diagnosis as one JSON object"),
) -> None:
    """Harness bottleneck or model bottleneck? Runs a short harness-only probe and a short
    weight-only probe (whale cotrain, one cycle each) at the same rollout budget, reads a probe
    split before and after each, and says per capability (format compliance, truncation,
    retrieval accuracy, answer extraction, accuracy) which lever moved it beyond noise.
    Writes diagnosis.md and diagnosis.json in the run directory."""
    from whale.analysis.diagnose import DiagnoseConfig

    flags = Flags.of(("--task", "task.id", task), ("--harness", "harness", harness),
                     ("--solver", "solver.name", solver), ("--proposer", "proposer.name", proposer),
                     ("--rollouts", "rollouts", rollouts), ("--train", "train", train),
                     ("--search", "search", search), ("--eval", "eval", n_eval), ("--z", "z", z),
                     ("--serving", "serving", serving), ("--operator", "operator", operator),
                     ("--workers", "workers", workers), ("--seed", "seed", seed),
                     ("--out", "out", out_dir))  # fmt: skip
    if resume is not None:
        refuse_on_resume(resume, DiagnoseConfig, flags, config)
    result = call(lambda: api.diagnose(resume=resume, config=config, fields=flags.fields,
                                       overrides=set_, unsafe_no_sandbox=unsafe, say=say),
                  lambda d: f"whale diagnose --resume {d}")  # fmt: skip
    if as_json:
        print(json.dumps({k: v for k, v in result.records.items() if k != "table"}, default=str))
    else:
        out.print(result.records["table"], markup=False, highlight=False, soft_wrap=True)
        out.print(f"written: {result.run_dir / 'diagnosis.md'}  "
                  f"{result.run_dir / 'diagnosis.json'}")  # fmt: skip
