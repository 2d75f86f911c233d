"""`whale adapt` as a library call: its config, the split of the question pool, and the run.

The CLI only parses arguments and prints; everything a script needs is here.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from whale.config import TrackerKind, at_least, check_choices, part
from whale.evaluation import EvalResult
from whale.harness import make_runtime
from whale.models import ChatModel, close_model
from whale.records import RecordError, RunLock, write_atomic
from whale.revise.loop import AdaptResult, LoopSettings, adapt, summary_markdown
from whale.revise.proposer import Proposer, ProposerConfig
from whale.revise.report import ReportConfig
from whale.revise.select import SelectRule, ValidityWeights
from whale.runs import (
    OutcomeStore,
    check_seed,
    check_splits,
    load_run_config,
    outcome_fingerprint,
    record_seed,
    refuse_changes,
    save_run_config,
)
from whale.runs.fields import OperatorFields
from whale.runs.ledger import write_final_folder
from whale.tasks import Question, SealedSplit, Task, TaskConfig, check_disjoint, split


@dataclass
class AdaptConfig(OperatorFields):
    # What a resume may change besides where and how fast rollouts run (whale.runs.resume):
    # more rounds (refused once the eval split was read), proposals asked for at once.
    budget_fields: ClassVar[frozenset[str]] = frozenset({"rounds"})
    where_fields: ClassVar[frozenset[str]] = frozenset({"propose.concurrency"})

    task: TaskConfig = field(default_factory=lambda: TaskConfig(id="rg:maze"))
    propose: ProposerConfig = field(default_factory=ProposerConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    reward: ValidityWeights = field(default_factory=ValidityWeights)
    rounds: int = 3
    g: int = 1
    select: SelectRule = "ratchet"
    # Noise-aware Select: keep a candidate only if its accuracy beats the parent's by more than
    # t·SE over k fresh rescorings of both (whale.revise.select); 0 is off, else k >= 2.
    noise_k: int = 0
    dev: int = 25
    eval: int = 75
    feedback: int = 8
    # Q_fb and Q_score both come from the dev pool (the Reasoning Gym protocol). When false,
    # the dev pool is cut in two: `score` questions for Q_score, the rest for Q_fb.
    share_dev: bool = True
    score: int | None = None
    workers: int = 4
    # mirror the finished run into an experiment tracker (whale.analysis.tracking.track_run):
    # "none" (default) | "mlflow" | "wandb", offline, files inside the run directory
    tracking: TrackerKind = "none"
    seed: int = 0
    out: str | None = None

    def validate(self) -> None:
        """Ranges, checked by `whale.config.build` on load (types are checked there too)."""
        check_choices(self)
        at_least(self, 1, "rounds", "g", "dev", "eval", "feedback", "workers", "score")
        if self.noise_k != 0 and self.noise_k < 2:
            raise ValueError(f"noise_k: {self.noise_k} (0 is off; otherwise k >= 2 rescorings)")
        with part("propose"):
            self.propose.validate()
        with part("report"):
            at_least(self.report, 1, "char_budget")
            at_least(self.report, 0, "max_failures", "max_correct")


def split_pools(
    task_obj: Task, cfg: AdaptConfig
) -> tuple[list[Question], list[Question], list[Question]]:
    """(feedback pool, scoring set, eval set), disjoint by id and normalized text."""
    pool = task_obj.questions()
    parts = split(pool, {"dev": cfg.dev, "eval": cfg.eval}, random.Random(cfg.seed))
    dev, held = parts["dev"], parts["eval"]
    if cfg.share_dev:
        fb_pool, score_set = dev, dev
    else:
        n_score = cfg.score or len(dev) // 2
        if not 0 < n_score < len(dev):
            raise ValueError(f"score = {n_score} must be between 1 and dev - 1 = {len(dev) - 1}")
        score_set, fb_pool = dev[:n_score], dev[n_score:]
        check_disjoint({"feedback": fb_pool, "score": score_set})
    check_disjoint({"dev": dev, "eval": held})
    return fb_pool, score_set, held


def run_adapt(
    cfg: AdaptConfig,
    run_dir: Path,
    task_obj: Task,
    source: str,
    solver_model: ChatModel,
    proposer_model: ChatModel,
    say: Callable[[str], None] = lambda s: None,
) -> tuple[AdaptResult, dict[str, Any]]:
    """Run (or resume, in the same `run_dir`) a whole adapt; writes summary.md and .json.
    Closes both models at the end.

    Holds the run directory's lock throughout (RunDirInUse if another process has it). A
    directory with a config.toml is a resume: `open_run` refuses what would change the
    experiment (ResumeMismatch), and the store refuses records it cannot
    trust (RecordError); both before any rollout. Then `cfg` is saved as config.toml."""
    t0 = time.monotonic()
    store: OutcomeStore | None = None
    runtime = None
    try:
        with RunLock(run_dir):
            seed_hash = open_run(cfg, run_dir, source)
            fb_pool, score_set, held = split_pools(task_obj, cfg)
            check_splits(run_dir, {"feedback": fb_pool, "score": score_set, "eval": held})
            store = OutcomeStore(run_dir, outcome_fingerprint(cfg.task, cfg.solver, cfg.runtime))
            store.save_harness(source)  # a cut copy of the seed is written again, whole
            runtime = make_runtime(cfg.runtime, solver_model, workers=cfg.workers)
            settings = LoopSettings(
                rounds=cfg.rounds,
                g=cfg.g,
                select=cfg.select,  # type: ignore[arg-type]
                feedback=cfg.feedback,
                seed=cfg.seed,
                workers=cfg.workers,
                report=cfg.report,
                weights=cfg.reward,
                noise_k=cfg.noise_k,
            )
            result = adapt(
                task_obj,
                store.harness(seed_hash),  # the saved seed, checked against its hash
                fb_pool,
                score_set,
                SealedSplit(held, run_dir / "eval_read.json"),
                runtime,
                Proposer(proposer_model, cfg.propose),
                store,
                settings,
                say=say,
            )
            meta = {
                "task": cfg.task.id,
                "seed harness": cfg.harness,
                "solver": cfg.solver.name,
                "proposer": cfg.proposer.name,
                "proposer prompt": template_label(cfg.propose.template),
                "rounds": cfg.rounds,
                "G": cfg.g,
                "select": cfg.select,
                "dev": cfg.dev,
                "eval": cfg.eval,
                "feedback per round": cfg.feedback,
                "rollouts (ledger)": store.rollouts,
                "rollouts paid this invocation": store.new_rollouts,
                "wall s (this invocation)": round(time.monotonic() - t0, 1),
                "run dir": str(run_dir),
                **write_final_folder(run_dir, store.harness(result.final_hash)),
            }
            write_atomic(run_dir / "summary.md", summary_markdown(result, meta))
            write_atomic(run_dir / "summary.json", json.dumps(adapt_json(result, meta), indent=2))
    finally:
        if runtime is not None:
            runtime.close()
        if store is not None:
            store.close()
        close_model(solver_model)
        close_model(proposer_model)
    return result, meta


def adapt_json(result: AdaptResult, meta: dict[str, Any]) -> dict[str, Any]:
    """summary.json. `accuracy` (the task's binary verifier) is what Select and the reward
    decided on; `mean_score` (partial credit, F1) is an extra column that decided nothing."""

    def evaluation(ev: EvalResult, h: str) -> dict[str, Any]:
        return {"accuracy": ev.accuracy, "mean_score": ev.score, "rho_run": ev.rho_run, "hash": h}

    return {
        **{k.replace(" ", "_").replace("(", "").replace(")", ""): v for k, v in meta.items()},
        "format_compliance": result.format_compliance,
        "proposals": result.proposals,
        "applicable": result.applicable,
        "seed_eval": evaluation(result.seed_eval, result.seed_hash),
        "final_eval": evaluation(result.final_eval, result.final_hash),
        "rounds_detail": [
            {
                "round": r.round,
                "parent_accuracy": r.parent_accuracy,
                "parent_mean_score": r.parent_mean_score,
                "decision": r.decision.why,
                "kept": r.decision.kept_hash,
                "candidates": [
                    {
                        "valid": c.valid,
                        "reason": c.reason,
                        "accuracy": c.accuracy,
                        "mean_score": c.mean_score,
                        "reward": c.reward,
                        "mode": c.mode,
                    }
                    for c in r.candidates
                ],
            }
            for r in result.rounds
        ],
    }


# --- resume -------------------------------------------------------------------------------


def open_run(cfg: AdaptConfig, run_dir: Path, source: str) -> str:
    """Check a resume, then save config.toml, seed.json and the seed harness; returns the
    seed's hash. Nothing is written when a check fails.

    A resume may change only what `whale.runs.resume` allows every command (where and how
    fast rollouts run) and adapt's `rounds` (until the eval split was read) and
    `propose.concurrency`; everything else defines the experiment: `task`, `harness` (its
    content is checked by `check_seed`), `dev`, `eval`, `share_dev`, `score`, `seed` (the
    splits: a change would move eval questions into the feedback pool, where the report and
    the proposer see them), `feedback`, the solver's identity and timeout, the rest of `runtime`
    (what a rollout may do), the proposer's identity, `propose`, `report`, `reward`, `select`,
    `noise_k`, `g` (ResumeMismatch naming the field)."""
    if (run_dir / "config.toml").exists():
        refuse_changes(load_run_config(run_dir, AdaptConfig, command="whale adapt"), cfg,
                       run_dir)  # fmt: skip
    elif (run_dir / "outcomes.jsonl").exists():
        raise RecordError(f"{run_dir}: a ledger (outcomes.jsonl) but no config.toml")
    check_seed(run_dir, cfg.harness, source)
    h = record_seed(run_dir, cfg.harness, source)
    save_run_config(run_dir, cfg)
    return h


def template_label(name: str) -> str:
    """How a run's summary names its proposer prompt: the hinted one says it is a prior."""
    if name == "default":
        return "default (the paper's x_t: task, harness, report; no hint)"
    if name == "hinted":
        return "hinted (a human prior: a hint and a worked fix, not the paper's x_t)"
    return f"{name} (a template of your own)"
