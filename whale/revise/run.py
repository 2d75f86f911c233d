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
from typing import Any

from whale.harness import RuntimeConfig, make_runtime
from whale.models import ChatModel, ModelConfig, close_model
from whale.revise.loop import AdaptResult, LoopSettings, adapt, summary_markdown
from whale.revise.proposer import Proposer, ProposerConfig
from whale.revise.report import ReportConfig
from whale.revise.select import ValidityWeights
from whale.revise.store import OutcomeStore
from whale.tasks import Question, SealedSplit, Task, TaskConfig, check_disjoint, split


@dataclass
class AdaptConfig:
    task: TaskConfig = field(default_factory=lambda: TaskConfig(id="rg:maze"))
    harness: str = "single_call"
    solver: ModelConfig = field(default_factory=ModelConfig)
    # A proposal is long (up to propose.max_tokens): its timeout is longer than a solver call's.
    proposer: ModelConfig = field(
        default_factory=lambda: ModelConfig(name="qwen-coder-1.5b", timeout_s=600.0)
    )
    propose: ProposerConfig = field(default_factory=ProposerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    reward: ValidityWeights = field(default_factory=ValidityWeights)
    rounds: int = 3
    g: int = 1
    select: str = "ratchet"
    dev: int = 25
    eval: int = 75
    feedback: int = 8
    # Q_fb and Q_score both come from the dev pool (the Reasoning Gym protocol). When false,
    # the dev pool is cut in two: `score` questions for Q_score, the rest for Q_fb.
    share_dev: bool = True
    score: int | None = None
    workers: int = 4
    seed: int = 0
    out: str | None = None


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
    Closes both models at the end."""
    fb_pool, score_set, held = split_pools(task_obj, cfg)
    store = OutcomeStore(run_dir)
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
    )
    t0 = time.monotonic()
    try:
        result = adapt(
            task_obj,
            source,
            fb_pool,
            score_set,
            SealedSplit(held, run_dir / "eval_read.json"),
            runtime,
            Proposer(proposer_model, cfg.propose),
            store,
            settings,
            say=say,
        )
    finally:
        runtime.close()
        store.close()
        close_model(solver_model)
        close_model(proposer_model)
    meta = {
        "task": cfg.task.id,
        "seed harness": cfg.harness,
        "solver": cfg.solver.name,
        "proposer": cfg.proposer.name,
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
    }
    (run_dir / "summary.md").write_text(summary_markdown(result, meta))
    (run_dir / "summary.json").write_text(json.dumps(adapt_json(result, meta), indent=2))
    return result, meta


def adapt_json(result: AdaptResult, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **{k.replace(" ", "_").replace("(", "").replace(")", ""): v for k, v in meta.items()},
        "format_compliance": result.format_compliance,
        "proposals": result.proposals,
        "applicable": result.applicable,
        "seed_eval": {
            "accuracy": result.seed_eval.accuracy,
            "score": result.seed_eval.score,
            "rho_run": result.seed_eval.rho_run,
            "hash": result.seed_hash,
        },
        "final_eval": {
            "accuracy": result.final_eval.accuracy,
            "score": result.final_eval.score,
            "rho_run": result.final_eval.rho_run,
            "hash": result.final_hash,
        },
        "rounds_detail": [
            {
                "round": r.round,
                "parent_score": r.parent_score,
                "decision": r.decision.why,
                "kept": r.decision.kept_hash,
                "candidates": [
                    {
                        "valid": c.valid,
                        "reason": c.reason,
                        "score": c.score,
                        "reward": c.reward,
                        "mode": c.mode,
                    }
                    for c in r.candidates
                ],
            }
            for r in result.rounds
        ],
    }
