"""`whale search`: Meta-Harness archive search, over `whale.api.search`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from whale import api
from whale.cli.common import (
    CONFIG,
    JSON,
    PATIENCE,
    RESUME,
    UNSAFE,
    Flags,
    app,
    call,
    out,
    pair,
    refuse_on_resume,
    say,
    set_option,
)


@app.command("search")
def search_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. rg:basic_arithmetic"),
    harness: str = typer.Option(None, "--harness", help="seed harness: name, .py file or folder"),
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
    resume: Path = RESUME,
    config: Path = CONFIG,
    set_: list[str] = set_option("agent.max_steps=6"),
    unsafe: bool = UNSAFE,
    as_json: bool = JSON,
) -> None:
    """Meta-Harness search: a proposer agent reads an archive of every scored candidate and
    writes M new ones per iteration; the archive's best is accepted. Then the seed and the
    accepted harness are scored once on the held-out questions."""
    from whale.metaharness.run import SearchConfig

    flags = Flags.of(("--task", "task.id", task), ("--harness", "harness", harness),
                     ("--solver", "solver.name", solver), ("--proposer", "proposer.name", proposer),
                     ("--iterations", "iterations", iterations), ("--m", "m", m),
                     ("--patience", "patience", pair("--patience", patience, PATIENCE)),
                     ("--dev", "dev", dev), ("--eval", "eval", n_eval),
                     ("--workers", "workers", workers), ("--seed", "seed", seed),
                     ("--out", "out", out_dir))  # fmt: skip
    if resume is not None:
        refuse_on_resume(resume, SearchConfig, flags, config)
    result = call(lambda: api.search(resume=resume, config=config, fields=flags.fields,
                                     overrides=set_, unsafe_no_sandbox=unsafe, say=say),
                  lambda d: f"whale search --resume {d}")  # fmt: skip
    if as_json:
        print(json.dumps(result.records))
    else:
        out.print((result.run_dir / "summary.md").read_text())
