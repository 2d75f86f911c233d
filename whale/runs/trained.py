"""A train-proposer `evaluate` on a run directory of its own, reading the trained proposers of
another run (`whale.api.train_proposer(..., trained_from=RUN)`): the same proposers on another
question variant, say, without a second training.

The adapters (`sft/adapter`, `grpo/adapter`, each a folder with its LoRA GGUF and
`whale-proposer.json`) are copied into the new directory, so that evaluate serves them as its
own stages and its records (proposals, ledgers, readings) stay inside it; `trained_from.json`
records where they came from, and a resume must name the same run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from whale.models import PROPOSER_MARKER
from whale.records import LOCK_NAME, read_json, write_atomic
from whale.runs.errors import RunDirError

RECORD = "trained_from.json"
OWN = {"trained": ("grpo", "sft"), "sft": ("sft",), "grpo": ("grpo",)}  # name -> stages tried


def check_evaluate_new(run_dir: Path, subject: str, against: list[str],
                       trained_from: Path | None) -> None:  # fmt: skip
    """RunDirError (field `run` or `trained_from`) unless `evaluate` can start in `run_dir`
    (new or empty): every stage it names (trained, sft, grpo) needs `trained_from`, and that
    run must hold the adapter."""
    own = sorted(n for n in {subject, *against} if n in OWN)
    if own and trained_from is None:
        raise RunDirError(f"--run {run_dir}: no config.toml there, so no trained proposer "
                          f"({', '.join(own)}): start with `whale train-proposer sft`, or read "
                          "another run's (trained_from), or name models").at("run")  # fmt: skip
    for name in own:
        assert trained_from is not None
        if not any((trained_from / s / "adapter" / PROPOSER_MARKER).is_file() for s in OWN[name]):
            raise RunDirError(f"trained_from {trained_from}: no {name} adapter there "
                              f"({' or '.join(f'{s}/adapter' for s in OWN[name])})"
                              ).at("trained_from")  # fmt: skip
    if run_dir.exists() and any(p.name != LOCK_NAME for p in run_dir.iterdir()):
        raise RunDirError(
            f"--run {run_dir}: not empty and no config.toml there (choose a new directory)"
        ).at("run")


def copy_adapters(source: Path, run_dir: Path) -> dict[str, Any]:
    """Copy `source`'s adapters into `run_dir` (once; a copy is whole or absent) and record
    where from; on a resume, RunDirError (field `trained_from`) when `source` is another run."""
    record = run_dir / RECORD
    src = str(source.resolve())
    if record.exists():
        prior = read_json(record)
        if not isinstance(prior, dict) or prior.get("run") != src:
            raise RunDirError(f"trained_from {source}: {run_dir} read its proposers from "
                              f"{prior.get('run') if isinstance(prior, dict) else '?'}"
                              ).at("trained_from")  # fmt: skip
        return prior
    if (run_dir / "config.toml").exists():
        raise RunDirError(
            f"trained_from {source}: {run_dir} is a run of its own (it has a "
            "config.toml and read no other run's proposers)"
        ).at("trained_from")
    copied = []
    for stage in ("sft", "grpo"):
        adapter = source / stage / "adapter"
        if not (adapter / PROPOSER_MARKER).is_file():
            continue
        dst = run_dir / stage / "adapter"
        tmp = dst.with_name("adapter.copying")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(adapter, tmp, symlinks=False)
        if dst.exists():
            shutil.rmtree(tmp)
        else:
            tmp.rename(dst)
        copied.append(stage)
    out = {"run": src, "stages": copied}
    write_atomic(record, json.dumps(out, indent=1))
    return out
