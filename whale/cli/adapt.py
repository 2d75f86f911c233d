"""`whale adapt`: Harness Learning's revision loop, over `whale.api.adapt`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from whale import api
from whale.cli.common import (
    CONFIG,
    JSON,
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


@app.command("adapt")
def adapt_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:maze"),
    harness: str = typer.Option(None, "--harness", help="seed harness: name, .py file or folder"),
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
    resume: Path = RESUME,
    config: Path = CONFIG,
    set_: list[str] = set_option("report.char_budget=4000"),
    unsafe: bool = UNSAFE,
    as_json: bool = JSON,
) -> None:
    """Improve a harness from its own execution: report, propose, apply, score, select; T rounds;
    then score the seed and the final harness once on the held-out questions."""
    from whale.revise.run import AdaptConfig

    flags = Flags.of(("--task", "task.id", task), ("--harness", "harness", harness),
                     ("--solver", "solver.name", solver), ("--proposer", "proposer.name", proposer),
                     ("--rounds", "rounds", rounds), ("--g", "g", g),
                     ("--select", "select", select_rule), ("--noise-k", "noise_k", noise_k),
                     ("--dev", "dev", dev), ("--eval", "eval", n_eval),
                     ("--feedback", "feedback", feedback), ("--workers", "workers", workers),
                     ("--seed", "seed", seed), ("--out", "out", out_dir))  # fmt: skip
    if resume is not None:
        refuse_on_resume(resume, AdaptConfig, flags, config)
    result = call(lambda: api.adapt(resume=resume, config=config, fields=flags.fields,
                                    overrides=set_, unsafe_no_sandbox=unsafe, say=say),
                  lambda d: f"whale adapt --resume {d}")  # fmt: skip
    if as_json:
        print(json.dumps(result.records))
    else:
        out.print((result.run_dir / "summary.md").read_text())
