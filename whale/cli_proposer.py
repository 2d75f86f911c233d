"""`whale train-proposer sft | grpo | evaluate`, registered on `whale.cli.app`.

All three work on one run directory (`--run DIR`) with one config; `sft` makes the directory
when it is new. Run a command again on the same directory to resume it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from whale import config as cfgmod
from whale import interrupts
from whale.cli import (
    _nest,
    app,
    err,
    executor_lost,
    fail,
    hold_run_dir,
    load_config,
    mirror_run,
    new_run_dir,
    out,
)
from whale.harness.executor import ExecutorUnavailable
from whale.models import ModelError
from whale.records import RecordError
from whale.tasks import EvalAlreadyRead

proposer_app = typer.Typer(no_args_is_help=True, help="Train the proposer: sft, grpo, evaluate.")
app.add_typer(proposer_app, name="train-proposer")


def _families(text: str | None) -> list[str] | None:
    return None if text is None else [f.strip() for f in text.split(",") if f.strip()]


def _config(run: Path | None, config: Path | None, set_: list[str], flags: dict[str, Any],
            unsafe: bool) -> Any:  # fmt: skip
    """The saved config of `run` (when there is one) < flags < --config < --set."""
    from whale.train.proposer.run import ProposerTrainConfig

    if unsafe:
        flags["runtime.sandbox"] = "unsafe"
    if run is not None and run.exists() and not run.is_dir():
        fail(f"--run {run}: exists and is not a directory")
    tree: dict[str, Any] = {}
    if run is not None and (run / "config.toml").is_file():
        tree = cfgmod.to_dict(load_config(ProposerTrainConfig, run / "config.toml", [], {}))
    cfgmod._merge(tree, _nest(flags))
    cfg = load_config(ProposerTrainConfig, config, set_, tree)
    if cfg.runtime.sandbox == "unsafe" and not unsafe:  # as `whale adapt`: only by the flag
        fail("runtime.sandbox = 'unsafe' runs model-written code WITHOUT isolation: give "
             "--unsafe-no-sandbox to mean it (every command of the run needs it)")
    return cfg


def _go(stage: str, run: Path | None, cfg: Any, as_json: bool) -> None:
    from whale.train.proposer import run as runmod

    if run is None:
        if stage != "sft":
            fail(f"train-proposer {stage}: --run DIR (the directory `sft` made) is required")
        run = new_run_dir(cfg.out, "train-proposer", f"{len(cfg.families.sft)}-families")
    else:
        if stage != "sft" and not (run / "config.toml").is_file():
            fail(f"--run {run}: no config.toml there (start with `whale train-proposer sft`)")
        run.mkdir(parents=True, exist_ok=True)
        hold_run_dir(run)
    say = lambda s: err.print(f"[cyan]{escape(s)}[/cyan]")  # noqa: E731
    fn = {"sft": runmod.run_sft, "grpo": runmod.run_grpo, "evaluate": runmod.run_evaluate}[stage]
    restore = interrupts.install()
    try:
        runmod.open_run(cfg, run)
        result = fn(cfg, run, say)
    except (RecordError, ModelError, ValueError, EvalAlreadyRead, OSError) as e:
        fail(str(e))
    except ExecutorUnavailable as e:
        executor_lost(e, f"whale train-proposer {stage} --run {run}")
    except KeyboardInterrupt:
        interrupts.stopped(f"`whale train-proposer {stage} --run {run}` continues")
    finally:
        restore()
    mirror_run(cfg.tracking, run)
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "table"}, default=str))
    elif "table" in result:
        out.print(result["table"])
    else:
        out.print(json.dumps(result, indent=1, default=str)[:4000])
    err.print(f"run directory: {run}")


_RUN = typer.Option(None, "--run", help="the run directory (sft: made when absent)")
_CONFIG = typer.Option(None, "--config", help="TOML config file")
_SET = typer.Option([], "--set", help="dotted override, e.g. grpo.updates=2")
_UNSAFE = typer.Option(False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation")
_JSON = typer.Option(False, "--json", help="print one JSON summary")


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
    config: Path = _CONFIG, set_: list[str] = _SET, unsafe: bool = _UNSAFE,
    as_json: bool = _JSON,
) -> None:  # fmt: skip
    """Teacher edits on the SFT families' contexts, executed, filtered (>= +0.08 over the seed
    and >= 0.40) and screened, then LoRA SFT of the proposer, epochs by family-disjoint CV."""
    flags = {"families.sft": _families(sft_families), "families.rl": _families(rl_families),
             "families.eval": _families(eval_families), "teacher.name": teacher,
             "proposer": proposer, "solver.name": solver, "contexts.contexts": contexts,
             "filter.g": g, "workers": workers,
             # one template for every prompt of the run: the contexts' and the proposers'
             "contexts.template": template, "propose.template": template}  # fmt: skip
    _go("sft", run, _config(run, config, set_, flags, unsafe), as_json)


@proposer_app.command("grpo")
def grpo_cmd(
    run: Path = _RUN,
    updates: int = typer.Option(None, "--updates", help="GRPO updates (optimizer steps)"),
    contexts_per_update: int = typer.Option(None, "--contexts-per-update"),
    g: int = typer.Option(None, "--g", help="samples per context"),
    phases: int = typer.Option(None, "--phases", help="1: single-step; more: multistep"),
    generation: str = typer.Option(None, "--generation", help="trl | embedded"),
    workers: int = typer.Option(None, "--workers"),
    config: Path = _CONFIG, set_: list[str] = _SET, unsafe: bool = _UNSAFE,
    as_json: bool = _JSON,
) -> None:  # fmt: skip
    """GRPO of the proposer on the RL families: G samples per context, reward r = J + v from
    executing each edit, group-normalized advantages, no KL; from the SFT adapter if any."""
    flags = {"grpo.updates": updates, "grpo.contexts_per_update": contexts_per_update,
             "grpo.g": g, "phases": phases, "grpo.generation": generation,
             "workers": workers}  # fmt: skip
    _go("grpo", run, _config(run, config, set_, flags, unsafe), as_json)


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
    config: Path = _CONFIG, set_: list[str] = _SET, unsafe: bool = _UNSAFE,
    as_json: bool = _JSON,
) -> None:  # fmt: skip
    """On the unseen families, G single-step proposals on each of several contexts and a
    ratchet run, scored on each family's held-out split (read once): applicability, the mean
    and the oracle best of G (an edit that makes no harness read as 0 and as no change), the
    ratchet's score after every round; paired differences. Decoded as `decoding` says."""
    flags = {"evaluate.subject": subject, "evaluate.against": _families(against),
             "evaluate.contexts": contexts, "evaluate.g": g, "evaluate.rounds": rounds,
             "workers": workers}  # fmt: skip
    _go("evaluate", run, _config(run, config, set_, flags, unsafe), as_json)
