"""`whale search` as a library call: its config, the splits, the run, the final eval.

The search split is the dev pool (`dev` questions); the eval split (`eval` questions) is read
once, at the end, for the seed and the accepted harness, as in `whale adapt`. The archive holds
search-split outcomes only (`Archive` refuses anything else); eval outcomes go to the run's
ledger (`outcomes.jsonl`) with split "eval", never under `archive/`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from whale import config as cfgmod
from whale.config import TrackerKind, at_least, check_choices, part
from whale.harness import make_runtime
from whale.metaharness.agent import AgentConfig, ProposerAgent
from whale.metaharness.archive import Archive
from whale.metaharness.loop import SearchResult, SearchSettings, search
from whale.metaharness.patience import Patience
from whale.metaharness.tools import ArchiveTools
from whale.models import ChatModel, close_model
from whale.records import RecordError, RunLock, write_atomic
from whale.runs import (
    OutcomeStore,
    ResumeMismatch,
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
from whale.tasks import Question, SealedSplit, Task, check_disjoint, split


@dataclass
class SearchConfig(OperatorFields):
    # What a resume may change besides where and how fast rollouts run (whale.runs.resume):
    # the budget, until the eval split was read.
    budget_fields: ClassVar[frozenset[str]] = frozenset({"iterations", "max_rollouts",
                                                         "patience"})  # fmt: skip

    agent: AgentConfig = field(default_factory=AgentConfig)
    iterations: int = 6
    m: int = 2
    # [J_min, P_h]: stop when the archive best has not improved for P_h iterations after at
    # least J_min (WHALE's (6, 2)); empty: run all `iterations`.
    patience: list[int] = field(default_factory=list)
    max_rollouts: int | None = None
    answer_echo_screen: bool = True
    dev: int = 25  # the search split
    eval: int = 75  # held out, read once at the end
    workers: int = 4
    # mirror the finished run into an experiment tracker (whale.analysis.tracking.track_run):
    # "none" (default) | "mlflow" | "wandb", offline, files inside the run directory
    tracking: TrackerKind = "none"
    seed: int = 0
    out: str | None = None

    def validate(self) -> None:
        check_choices(self)
        at_least(self, 1, "iterations", "m", "dev", "eval", "workers", "max_rollouts")
        if self.max_rollouts is not None and self.max_rollouts < self.dev:
            # The cap is hard (whale.metaharness.loop): below one scoring of the search split not
            # even the seed could be scored.
            raise cfgmod.ConfigError(f"max_rollouts ({self.max_rollouts}) must be at least dev "
                                     f"({self.dev}): one scoring of the search split")
        if self.m > 99:  # candidate ids are c<iteration><index:02d>
            raise cfgmod.ConfigError(f"m must be at most 99, got {self.m}")
        if self.patience and (len(self.patience) != 2 or self.patience[0] < 0
                              or self.patience[1] < 1):  # fmt: skip
            raise cfgmod.ConfigError(f"patience must be [J_MIN, P_H] with P_H >= 1, got "
                                     f"{self.patience}")  # fmt: skip
        with part("agent"):
            self.agent.validate()


def search_splits(task_obj: Task, cfg: SearchConfig) -> tuple[list[Question], list[Question]]:
    parts = split(task_obj.questions(), {"dev": cfg.dev, "eval": cfg.eval},
                  random.Random(cfg.seed))  # fmt: skip
    check_disjoint(parts)
    return parts["dev"], parts["eval"]


def run_search(
    cfg: SearchConfig,
    run_dir: Path,
    task_obj: Task,
    source: str,
    solver_model: ChatModel,
    proposer_model: ChatModel,
    say: Callable[[str], None] = lambda s: None,
) -> tuple[SearchResult, dict[str, Any]]:
    """Run (or resume) a whole search in `run_dir`; writes summary.md and summary.json."""
    t0 = time.monotonic()
    store: OutcomeStore | None = None
    runtime = None
    try:
        with RunLock(run_dir):
            if (run_dir / "config.toml").exists():
                refuse_changes(load_run_config(run_dir, SearchConfig, command="whale search"),
                               cfg, run_dir)  # fmt: skip
            check_seed(run_dir, cfg.harness, source)
            save_run_config(run_dir, cfg)
            search_set, held = search_splits(task_obj, cfg)
            check_splits(run_dir, {"dev": search_set, "eval": held})
            store = OutcomeStore(run_dir, outcome_fingerprint(cfg.task, cfg.solver, cfg.runtime))
            store.save_harness(source)
            record_seed(run_dir, cfg.harness, source)
            runtime = make_runtime(cfg.runtime, solver_model, workers=cfg.workers)
            archive = Archive(run_dir / "archive", [q.id for q in search_set])
            tools = ArchiveTools(archive, task_obj.description, cfg.agent.tool_chars)
            settings = SearchSettings(
                iterations=cfg.iterations, m=cfg.m,
                patience=Patience(*cfg.patience) if cfg.patience else None,
                max_rollouts=cfg.max_rollouts, workers=cfg.workers, seed=cfg.seed,
                answer_echo_screen=cfg.answer_echo_screen,
            )  # fmt: skip
            agent = ProposerAgent(proposer_model, tools, cfg.agent,
                                  retrieval=task_obj.retriever is not None,
                                  user_tools=runtime.tool_specs(),
                                  packages=runtime.package_names())  # fmt: skip
            result = search(task_obj, source, search_set, runtime, agent, store, archive,
                            settings, say)  # fmt: skip
            if not result.accepted_id:  # validate() keeps max_rollouts >= dev
                raise RecordError(f"the search scored nothing: {result.stopped}")
            accepted = archive.source(result.accepted_id)
            q_eval = SealedSplit(held, run_dir / "eval_read.json").open(
                "final eval: seed and accepted harness", [result.seed_hash, result.accepted_hash]
            )
            say(f"final eval on {len(q_eval)} held-out questions")
            seed_eval = store.evaluate(runtime, source, task_obj, q_eval, "eval", cfg.workers)
            final_eval = store.evaluate(runtime, accepted, task_obj, q_eval, "eval", cfg.workers)
            meta = {
                "task": cfg.task.id, "seed harness": cfg.harness, "solver": cfg.solver.name,
                "proposer": cfg.proposer.name,
                "agent's submit example": ("hinted (a human prior: a worked edit)"
                                           if cfg.agent.example == "hinted" else "placeholders"),
                "iterations run": len(result.iterations),
                "M": cfg.m, "stopped": result.stopped, "search split": cfg.dev,
                "eval": cfg.eval, "archived": len(archive),
                "rollouts (ledger)": store.rollouts,
                "rollouts paid this invocation": store.new_rollouts,
                "wall s (this invocation)": round(time.monotonic() - t0, 1),
                "run dir": str(run_dir),
                **write_final_folder(run_dir, accepted),
                "seed search accuracy": result.seed_accuracy,
                "accepted search accuracy": result.accepted_accuracy,
                "seed_eval": {"accuracy": seed_eval.accuracy, "score": seed_eval.score,
                              "hash": result.seed_hash},
                "final_eval": {"accuracy": final_eval.accuracy, "score": final_eval.score,
                               "hash": result.accepted_hash, "id": result.accepted_id},
                "per_iteration": [asdict(r) for r in result.iterations],
            }  # fmt: skip
            write_atomic(run_dir / "summary.md", summary_markdown(meta))
            write_atomic(run_dir / "summary.json", json.dumps(meta, indent=2))
    except ResumeMismatch:  # a refused resume keeps its type (and its field)
        raise
    except cfgmod.ConfigError as e:
        raise RecordError(str(e)) from None
    finally:
        if runtime is not None:
            runtime.close()
        if store is not None:
            store.close()
        close_model(solver_model)
        close_model(proposer_model)
    return result, meta


def summary_markdown(meta: dict[str, Any]) -> str:
    s, f = meta["seed_eval"], meta["final_eval"]
    lines = [f"# whale search: {meta['task']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if not isinstance(v, dict | list)]
    lines += ["", "| iteration | candidates | valid | agent tool calls | best | best accuracy | "
              "its mean score | rollouts |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in meta["per_iteration"]:
        lines.append(f"| {r['iteration']} | {len(r['candidates'])} | {r['valid']} | "
                     f"{r['tool_calls']} | {r['best_id']} | {r['best_accuracy']:.3f} | "
                     f"{r['best_score']:.3f} | {r['rollouts']} |")  # fmt: skip
    lines += ["", f"Held-out eval ({meta['eval']} questions, read once):", "",
              "| harness | accuracy | mean score |", "|---|---|---|",
              f"| seed {s['hash']} | {s['accuracy']:.3f} | {s['score']:.3f} |",
              f"| accepted {f['id']} {f['hash']} | {f['accuracy']:.3f} | "
              f"{f['score']:.3f} |"]  # fmt: skip
    return "\n".join(lines) + "\n"
