"""`whale train-proposer sft | grpo | evaluate`, over `whale.api.train_proposer`.

All three work on one run directory (`--run DIR`) with one config; `sft` makes the directory
when it is new. Run a command again on the same directory to resume it.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from whale import api
from whale.cli.common import CONFIG, JSON, UNSAFE, Flags, app, call, err, out, say, set_option

proposer_app = typer.Typer(no_args_is_help=True, help="Train the proposer: sft, grpo, evaluate.")
app.add_typer(proposer_app, name="train-proposer")

_RUN = typer.Option(None, "--run", help="the run directory (sft: made when absent)")
_SET = set_option("grpo.updates=2")


def _families(text: str | None) -> list[str] | None:
    return None if text is None else [f.strip() for f in text.split(",") if f.strip()]


def _go(stage: str, run: Path | None, flags: Flags, config: Path | None, set_: list[str],
        unsafe: bool, as_json: bool) -> None:  # fmt: skip
    from whale.models import ModelError
    from whale.records import RecordError

    result = call(lambda: api.train_proposer(stage, run, config=config, fields=flags.fields,  # type: ignore[arg-type]
                                             overrides=set_, unsafe_no_sandbox=unsafe,
                                             say=say),
                  lambda d: f"whale train-proposer {stage} --run {d}",
                  also=(RecordError, ModelError, ValueError, OSError))  # fmt: skip
    records = result.records
    if as_json:
        print(json.dumps({k: v for k, v in records.items() if k != "table"}, default=str))
    elif "table" in records:
        out.print(records["table"])
    else:
        out.print(json.dumps(records, indent=1, default=str)[:4000])
    err.print(f"run directory: {result.run_dir}")


@proposer_app.command("sft")
def sft_cmd(
    run: Path = _RUN,
    sft_families: str = typer.Option(None, "--sft-families", help="comma-separated task ids"),
    rl_families: str = typer.Option(None, "--rl-families", help="comma-separated task ids"),
    eval_families: str = typer.Option(None, "--eval-families", help="comma-separated, unseen"),
    teacher: str = typer.Option(None, "--teacher", help="teacher model (any backend)"),
    proposer: str = typer.Option(None, "--proposer", help="the proposer trained (catalog/.gguf)"),
    solver: str = typer.Option(None, "--solver", help="the frozen solver"),
    contexts: int = typer.Option(None, "--contexts", help="contexts per family and seed"),
    g: int = typer.Option(None, "--g", help="teacher proposals per context"),
    template: str = typer.Option(None, "--template",
                                 help="the run's x_t template: default | hinted | PATH"),
    workers: int = typer.Option(None, "--workers"),
    config: Path = CONFIG, set_: list[str] = _SET, unsafe: bool = UNSAFE,
    as_json: bool = JSON,
) -> None:  # fmt: skip
    """Teacher edits on the SFT families' contexts, executed, filtered (>= +0.08 over the seed
    and >= 0.40) and screened, then LoRA SFT of the proposer, epochs by family-disjoint CV."""
    flags = Flags.of(("--sft-families", "families.sft", _families(sft_families)),
                     ("--rl-families", "families.rl", _families(rl_families)),
                     ("--eval-families", "families.eval", _families(eval_families)),
                     ("--teacher", "teacher.name", teacher), ("--proposer", "proposer", proposer),
                     ("--solver", "solver.name", solver),
                     ("--contexts", "contexts.contexts", contexts), ("--g", "filter.g", g),
                     ("--workers", "workers", workers),
                     # one template for every prompt of the run: the contexts' and the proposers'
                     ("--template", "contexts.template", template),
                     ("--template", "propose.template", template))  # fmt: skip
    _go("sft", run, flags, config, set_, unsafe, as_json)


@proposer_app.command("grpo")
def grpo_cmd(
    run: Path = _RUN,
    updates: int = typer.Option(None, "--updates", help="GRPO updates (optimizer steps)"),
    contexts_per_update: int = typer.Option(None, "--contexts-per-update"),
    g: int = typer.Option(None, "--g", help="samples per context"),
    phases: int = typer.Option(None, "--phases", help="1: single-step; more: multistep"),
    generation: str = typer.Option(None, "--generation", help="trl | embedded"),
    workers: int = typer.Option(None, "--workers"),
    config: Path = CONFIG, set_: list[str] = _SET, unsafe: bool = UNSAFE,
    as_json: bool = JSON,
) -> None:  # fmt: skip
    """GRPO of the proposer on the RL families: G samples per context, reward r = J + v from
    executing each edit, group-normalized advantages, no KL; from the SFT adapter if any."""
    flags = Flags.of(("--updates", "grpo.updates", updates),
                     ("--contexts-per-update", "grpo.contexts_per_update", contexts_per_update),
                     ("--g", "grpo.g", g), ("--phases", "phases", phases),
                     ("--generation", "grpo.generation", generation),
                     ("--workers", "workers", workers))  # fmt: skip
    _go("grpo", run, flags, config, set_, unsafe, as_json)


@proposer_app.command("evaluate")
def evaluate_cmd(
    run: Path = _RUN,
    subject: str = typer.Option(None, "--subject", help="trained | sft | grpo | base | MODEL"),
    against: str = typer.Option(None, "--against", help="comma-separated: base, teacher, ..."),
    contexts: int = typer.Option(None, "--contexts",
                                 help="contexts per family, each on its own Q_fb draw"),
    g: int = typer.Option(None, "--g", help="single-step proposals per context"),
    rounds: int = typer.Option(None, "--rounds", help="ratchet rounds"),
    workers: int = typer.Option(None, "--workers"),
    config: Path = CONFIG, set_: list[str] = _SET, unsafe: bool = UNSAFE,
    as_json: bool = JSON,
) -> None:  # fmt: skip
    """On the unseen families, G single-step proposals on each of several contexts and a
    ratchet run, scored on each family's held-out split (read once): applicability, the mean
    and the oracle best of G (an edit that makes no harness read as 0 and as no change), the
    ratchet's score after every round; paired differences. Decoded as `decoding` says."""
    flags = Flags.of(("--subject", "evaluate.subject", subject),
                     ("--against", "evaluate.against", _families(against)),
                     ("--contexts", "evaluate.contexts", contexts), ("--g", "evaluate.g", g),
                     ("--rounds", "evaluate.rounds", rounds),
                     ("--workers", "workers", workers))  # fmt: skip
    _go("evaluate", run, flags, config, set_, unsafe, as_json)
