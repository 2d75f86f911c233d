"""`whale adapt` as a library call: its config, the split of the question pool, and the run.

The CLI only parses arguments and prints; everything a script needs is here.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from whale import config as cfgmod
from whale.config import at_least, one_of, part
from whale.evaluate import EvalResult
from whale.harness import RuntimeConfig, harness_hash, make_runtime
from whale.harness.executor import EXECUTOR_RESUMABLE
from whale.models import ChatModel, ModelConfig, close_model
from whale.records import RecordError, RunLock, read_json, write_atomic
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
    tracking: str = "none"
    seed: int = 0
    out: str | None = None

    def validate(self) -> None:
        """Ranges, checked by `whale.config.build` on load (types are checked there too)."""
        cfgmod.one_of(self, "tracking", ("none", "mlflow", "wandb"))
        at_least(self, 1, "rounds", "g", "dev", "eval", "feedback", "workers", "score")
        one_of(self, "select", ("ratchet", "best-of-g"))
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
    directory with a config.toml is a resume: `check_resume` and `check_seed` refuse what
    would change the experiment (ResumeMismatch), and the store refuses records it cannot
    trust (RecordError); both before any rollout. Then `cfg` is saved as config.toml."""
    t0 = time.monotonic()
    store: OutcomeStore | None = None
    runtime = None
    try:
        with RunLock(run_dir):
            seed_hash = open_run(cfg, run_dir, source)
            fb_pool, score_set, held = split_pools(task_obj, cfg)
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


# --- resume: what may change, and what produced an outcome --------------------------------


class ResumeMismatch(ValueError):
    """A resumed run was asked to change what defines its experiment."""


# What a resumed run may change, and why no recorded outcome or proposal depends on it. Any
# other field of AdaptConfig defines the experiment (see `check_resume`); a field added to the
# config later defines it too, until it is listed here.
RESUMABLE: dict[str, str] = {
    "rounds": "extends the run (refused once the eval split was read)",
    "workers": "how many rollouts run at once",
    "tracking": "mirrors the finished run into a tracker; never what the run does",
    "out": "where the run directory is",
    "runtime.warm": "jailed workers started ahead of need",
    "propose.concurrency": "proposals asked for at once",
    "proposer.timeout_s": "only finished proposals are kept: it decides whether a missing one "
    "is made, never what a kept one says",
    **{
        f"{m}.{k}": "how the backend is reached or cached, not what it answers"
        for m in ("solver", "proposer")
        for k in ("threads", "retries", "cache", "cache_path", "api_key_env", "endpoints",
                  "max_concurrency", "probe_s")
    },
    **{k: "where rollouts run, not what they produce" for k in EXECUTOR_RESUMABLE},
}


def changed_fields(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, old value, new value) for every leaf that differs; dicts are walked."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += changed_fields(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [(prefix.rstrip("."), old, new)]


def check_resume(saved: AdaptConfig, requested: AdaptConfig, run_dir: Path) -> None:
    """ResumeMismatch naming the first field that `requested` changes and may not.

    These define the experiment and are fixed at the start: `task` (id, size, seed, config:
    the question pool), `harness` (the seed; its content is checked by `check_seed`), `dev`,
    `eval`, `share_dev`, `score`, `seed` (the splits: a change would move eval questions into
    the feedback pool, where the report and the proposer see them), `feedback`, `solver`
    (name, base_url, n_ctx, timeout_s: which model answers, and when a call fails),
    `runtime` (sandbox, budget, limits, python, temperature, seed: what a rollout may do),
    `proposer` (name, base_url, n_ctx), `propose` (temperature, max_tokens, template,
    grammar, grammar_blocks), `report`, `reward`, `select`, `noise_k`, `g`. Only the fields of
    RESUMABLE may change. `rounds` may not change once the eval split was read (more rounds
    would need a second read). Not covered: the content of a `propose.template` file."""
    refuse_changes(saved, requested, run_dir, RESUMABLE)
    if saved.rounds != requested.rounds and (run_dir / "eval_read.json").exists():
        raise ResumeMismatch(
            f"--resume {run_dir}: rounds was {saved.rounds}, now {requested.rounds}, but the "
            "eval split was already read for the final harness of the saved rounds; it is read "
            "once (start a new run for more rounds)"
        )


def refuse_changes(saved: Any, requested: Any, run_dir: Path, resumable: Collection[str],
                   error: type[Exception] = ResumeMismatch) -> None:  # fmt: skip
    """`error` naming the first field (dotted) of config `requested` that differs from `saved`
    and is not in `resumable`: what `adapt`, `search` and `cotrain` refuse on resume."""
    bad = [c for c in changed_fields(asdict(saved), asdict(requested)) if c[0] not in resumable]
    if bad:
        name, old, new = bad[0]
        more = f" (and {', '.join(c[0] for c in bad[1:])})" if len(bad) > 1 else ""
        raise error(
            f"--resume {run_dir}: {name} was {old!r} when the run started, now {new!r}{more}: "
            "it defines the experiment, so it cannot change on resume (start a new run); "
            f"these may: {', '.join(sorted(resumable))}"
        )


def load_run_config(run_dir: Path) -> AdaptConfig:
    """The config.toml a run directory was started (or last resumed) with."""
    path = run_dir / "config.toml"
    if not path.exists():
        raise RecordError(f"{path}: missing (is {run_dir} a run directory of whale adapt?)")
    try:
        cfg: AdaptConfig = cfgmod.load(AdaptConfig, path)
    except cfgmod.ConfigError as e:
        raise RecordError(f"{path}: {e}") from None
    return cfg


def check_seed(run_dir: Path, name: str, source: str) -> None:
    """ResumeMismatch when the seed harness `name` is not the one the run started from."""
    path = run_dir / "seed.json"
    if not path.exists():
        return
    prior = read_json(path)
    if not isinstance(prior, dict) or not isinstance(prior.get("hash"), str):
        raise RecordError(f"{path}: not a record of the seed harness")
    now = harness_hash(source)
    if now != prior["hash"]:
        raise ResumeMismatch(
            f"--resume {run_dir}: the seed harness {name!r} now hashes to {now}, but the run "
            f"started from {prior['hash']} (saved as harnesses/{prior['hash']}.py): the file "
            "was edited; restore it, or start a new run"
        )


def open_run(cfg: AdaptConfig, run_dir: Path, source: str) -> str:
    """Check a resume (see `check_resume`, `check_seed`), then save config.toml, seed.json and
    the seed harness; returns the seed's hash. Nothing is written when a check fails."""
    if (run_dir / "config.toml").exists():
        check_resume(load_run_config(run_dir), cfg, run_dir)
    elif (run_dir / "outcomes.jsonl").exists():
        raise RecordError(f"{run_dir}: a ledger (outcomes.jsonl) but no config.toml")
    check_seed(run_dir, cfg.harness, source)
    h = harness_hash(source)
    write_atomic(run_dir / "seed.json", json.dumps({"harness": cfg.harness, "hash": h}))
    write_atomic(run_dir / "config.toml", tomli_w.dumps(cfgmod.to_dict(cfg)))
    return h


def template_label(name: str) -> str:
    """How a run's summary names its proposer prompt: the hinted one says it is a prior."""
    if name == "default":
        return "default (the paper's x_t: task, harness, report; no hint)"
    if name == "hinted":
        return "hinted (a human prior: a hint and a worked fix, not the paper's x_t)"
    return f"{name} (a template of your own)"


def outcome_fingerprint(task: TaskConfig, solver: ModelConfig, runtime: RuntimeConfig) -> str:
    """What, besides the harness and the question id, produced an outcome: the task (id,
    size, seed, config), the solver's identity (name, base_url, n_ctx, timeout_s) and the
    runtime (sandbox, budget, limits, python tool, temperature, seed; not `warm`). Numbers
    are compared as floats (600 and 600.0 are one value). Not covered: a server that swaps
    the weights behind one model name."""
    rt = asdict(runtime)
    rt.pop("warm", None)
    rt.pop("executor", None)  # where rollouts run does not change what they produce
    s = solver
    t = asdict(task)
    if t.get("variant") == "canonical":
        del t["variant"]  # the questions as the family makes them: ledgers from before it match
    what = {
        "task": t,
        "solver": {"name": s.name, "base_url": s.base_url, "n_ctx": s.n_ctx,
                   "timeout_s": s.timeout_s},
        "runtime": rt,
    }  # fmt: skip
    text = json.dumps(_numbers_as_floats(what), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _numbers_as_floats(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _numbers_as_floats(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_numbers_as_floats(v) for v in x]
    if isinstance(x, int) and not isinstance(x, bool):
        return float(x)
    return x
