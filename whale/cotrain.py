"""`whale cotrain` and `whale rsft` as library calls: config, splits, one run per schedule.

Splits: a training prompt pool (`train`), a held-out eval split (`eval`) and a validation split
(`validation`), disjoint by id and normalized text. The weight phase samples the whole pool;
the harness phase scores candidates on its first `search` questions (training data too:
WHALE's harness phase climbs the archive's best *training* score). The eval split is read at
every phase boundary, for the curves only. The validation split is read at the same
boundaries, outside the loop's reach (`whale.schedule.Reads`), and chooses two things only: the
reported best point of each schedule (`whale.analysis.curves`) and, with `sweep.enabled`
(`whale cotrain --sweep`), stagewise's (E*, I*). No switching rule reads it.

Layout of the run directory: `config.toml`, then one folder per schedule (`adaptive/`,
`harness-only/`, ...), each with its ledger (`outcomes.jsonl` + `trajectories/` +
`harnesses/`), `reads.jsonl`, `phases.jsonl`, `weight/` (steps.jsonl and adapters/step_NNNN/),
`harness/` (the harness operator's archives) and `summary.json`; at the top `curves.csv`,
`phases.csv`, `curves.png` and `summary.md`. All schedules share the splits and the rollout
budget, so they are compared at the same cost. A sweep adds `sweep/E<e>-I<i>/stagewise/` (one
stagewise run per grid point, the same layout without reads) and `sweep.json` (every point's
validation accuracy at its end, and the point chosen).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import tomli_w

from whale import config as cfgmod
from whale.config import above, at_least, one_of, part
from whale.harness import RuntimeConfig
from whale.harness.executor import EXECUTOR_RESUMABLE
from whale.models import ChatModel, ModelConfig, close_model
from whale.records import RecordError, RunLock, record_dir, write_atomic
from whale.revise.run import check_seed, outcome_fingerprint, refuse_changes
from whale.revise.store import OutcomeStore
from whale.schedule import SCHEDULES, Cotrain, Reads, ScheduleSettings, no_read, score_split
from whale.search.agent import AgentConfig
from whale.tasks import Question, Task, TaskConfig, check_disjoint, split
from whale.train.rsft import RsftSettings, Solver, WeightPhase, trainer_factory

SERVING = ("embedded", "hf", "vllm")


@dataclass
class SweepSettings:
    """`whale cotrain --sweep`: stagewise's (E*, I*) chosen from a grid by validation accuracy.
    Each grid point is one stagewise run at the same rollout budget; the point whose final
    (θ, h) scores best on the validation split is chosen (ties: the smaller E*, then I*)."""

    enabled: bool = False
    epochs: list[float] = field(default_factory=lambda: [0.5, 0.75, 1.0])  # E* grid
    iters: list[int] = field(default_factory=lambda: [2, 3, 4])  # I* grid

    def validate(self) -> None:
        if not self.epochs or not self.iters:
            raise cfgmod.ConfigError("epochs and iters need at least one value each")
        if any(e <= 0 for e in self.epochs) or any(i < 1 for i in self.iters):
            raise cfgmod.ConfigError(f"want epochs > 0 and iters >= 1, got {self.epochs}, "
                                     f"{self.iters}")  # fmt: skip
        if len(set(self.epochs)) != len(self.epochs) or len(set(self.iters)) != len(self.iters):
            raise cfgmod.ConfigError(f"grid values repeat: {self.epochs}, {self.iters}")

    def grid(self) -> list[tuple[float, int]]:
        """The points in the order run and tie-broken: cheaper first."""
        return [(e, i) for e in sorted(self.epochs) for i in sorted(self.iters)]


@dataclass
class CotrainConfig:
    task: TaskConfig = field(default_factory=lambda: TaskConfig(id="rg:basic_arithmetic"))
    harness: str = "single_call"
    solver: ModelConfig = field(default_factory=ModelConfig)
    proposer: ModelConfig = field(
        default_factory=lambda: ModelConfig(name="qwen-coder-1.5b", timeout_s=600.0)
    )
    agent: AgentConfig = field(default_factory=AgentConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    rsft: RsftSettings = field(default_factory=RsftSettings)
    # How trained weights are served: "embedded" (llama.cpp on the GGUF + the adapter as a
    # LoRA GGUF), "hf" (transformers + PEFT in process), "vllm" (solver NAME@URL; adapters
    # loaded at run time, the adapter folders must be readable by the server).
    serving: str = "embedded"
    # The transformers checkpoint trained (default: made once from the solver's GGUF; with
    # serving "hf", the solver name may be the checkpoint folder itself).
    checkpoint: str | None = None
    # The harness operator: "search" (Meta-Harness, the paper's) or "revise" (Harness
    # Learning's revision loop: rounds = harness_iters, G = m, feedback from the pool).
    operator: str = "search"
    schedules: list[str] = field(default_factory=lambda: ["adaptive"])
    rollouts: int = 300  # training rollouts per schedule
    weight_epochs: float = 0.2  # E (fixed, weight-only)
    harness_iters: int = 6  # I (fixed, harness-only)
    # (E*, I*): stagewise's one weight stage and one harness stage. At the defaults (train 50,
    # G 4, search 20, m 2) they cost about the rollout budget: 0.75 epoch = 150 weight samples,
    # the start harness's scoring + 3 iterations = 20 + 120.
    stagewise: tuple[float, int] = (0.75, 3)
    # N: cycles of fixed (None: 3); given, it caps every schedule. Without it adaptive,
    # weight-only and harness-only run until `rollouts` are spent; stagewise is one cycle.
    cycles: int | None = None
    weight_patience: bool = False  # weight-only phases end by weight patience, not E epochs
    patience: list[int] = field(default_factory=lambda: [6, 2])  # J_min, P_h (adaptive)
    max_weight_epochs: float = 2.0
    max_harness_iters: int = 20
    m: int = 2  # candidates per search iteration
    train: int = 50
    search: int = 20
    eval: int = 50
    # Validation questions (0: none), disjoint from the pool and eval; read at every boundary.
    # They choose the reported best point of each schedule and the sweep's (E*, I*), nothing
    # else: without them a schedule reports no best point and the sweep cannot run.
    validation: int = 20
    sweep: SweepSettings = field(default_factory=SweepSettings)
    workers: int = 2
    # mirror the finished run into an experiment tracker (whale.analysis.tracking.track_run):
    # "none" (default) | "mlflow" | "wandb", offline, files inside the run directory
    tracking: str = "none"
    seed: int = 0
    out: str | None = None

    def validate(self) -> None:
        cfgmod.one_of(self, "tracking", ("none", "mlflow", "wandb"))
        at_least(self, 1, "rollouts", "harness_iters", "cycles", "max_harness_iters", "m",
                 "train", "search", "eval", "workers")  # fmt: skip
        above(self, 0.0, "weight_epochs", "max_weight_epochs")
        at_least(self, 0, "validation")
        if len(self.stagewise) != 2 or self.stagewise[0] <= 0 or self.stagewise[1] < 1:
            raise cfgmod.ConfigError(f"stagewise must be [E_STAR > 0, I_STAR >= 1], "
                                     f"got {list(self.stagewise)}")  # fmt: skip
        if self.sweep.enabled and self.validation < 1:
            raise cfgmod.ConfigError("sweep.enabled: the sweep chooses (E*, I*) on the "
                                     "validation split; set validation >= 1")  # fmt: skip
        one_of(self, "serving", SERVING)
        one_of(self, "operator", ("search", "revise"))
        bad = [s for s in self.schedules if s not in SCHEDULES]
        if bad or not self.schedules or len(set(self.schedules)) != len(self.schedules):
            raise cfgmod.ConfigError(f"schedules: want distinct names of {', '.join(SCHEDULES)}; "
                                     f"got {self.schedules}")  # fmt: skip
        if self.search > self.train:
            raise cfgmod.ConfigError(f"search ({self.search}) must be at most train "
                                     f"({self.train}): it is the pool's first questions")
        if len(self.patience) != 2 or self.patience[0] < 0 or self.patience[1] < 1:
            raise cfgmod.ConfigError(f"patience must be [J_MIN, P_H], got {self.patience}")
        with part("rsft"):
            self.rsft.validate()
        with part("agent"):
            self.agent.validate()
        with part("sweep"):
            self.sweep.validate()

    def settings(self, kind: str) -> ScheduleSettings:
        return ScheduleSettings(kind, self.rollouts, self.weight_epochs, self.harness_iters,
                                self.cycles, (self.patience[0], self.patience[1]),
                                self.max_weight_epochs, self.max_harness_iters,
                                self.weight_patience, self.stagewise,
                                scoring_rollouts=self.search)  # fmt: skip


# What a resumed cotrain may change: nothing any recorded outcome, step or session depends on.
RESUMABLE = {"workers", "tracking", "out", "runtime.warm", "proposer.timeout_s",
             "schedules"} | EXECUTOR_RESUMABLE  # fmt: skip


class Splits(NamedTuple):
    pool: list[Question]  # training prompts; the first `search` also score harnesses
    held: list[Question]  # eval: read at every boundary, for the curves only
    validation: list[Question]  # the reported best point and the sweep's choice only


def cotrain_splits(task: Task, cfg: CotrainConfig) -> Splits:
    # Validation is drawn last, from the same seeded shuffle as train and eval.
    parts = split(task.questions(), {"train": cfg.train, "eval": cfg.eval,
                                     "validation": cfg.validation},
                  random.Random(cfg.seed))  # fmt: skip
    check_disjoint(parts)
    return Splits(parts["train"], parts["eval"], parts["validation"])


def needs_proposer(cfg: CotrainConfig) -> bool:
    return any(s != "weight-only" for s in cfg.schedules)


def check_resume(saved: CotrainConfig, requested: CotrainConfig, run_dir: Path) -> None:
    refuse_changes(saved, requested, run_dir, RESUMABLE, cfgmod.ConfigError)


def make_serving(cfg: CotrainConfig) -> tuple[Any, Path]:
    """The serving of trained weights and the checkpoint trained, per `cfg.serving`."""
    import whale.train.serving as sv
    from whale.train.checkpoint import resolve_gguf, trainable_checkpoint

    s = cfg.solver
    if cfg.serving == "hf":
        ckpt = Path(cfg.checkpoint or s.name)
        if not (ckpt / "config.json").is_file():
            raise RecordError(f"serving 'hf': {ckpt} is not a transformers checkpoint folder")
        return sv.InProcessServing(ckpt, alias=ckpt.name, threads=s.threads), ckpt
    if cfg.serving == "vllm":
        name, url = (s.name.split("@", 1) + [s.base_url or ""])[:2] if "@" in s.name else (
            s.name, s.base_url or "")  # fmt: skip
        if not url or not cfg.checkpoint:
            raise RecordError("serving 'vllm' needs the solver as NAME@URL and `checkpoint` "
                              "(the base model's transformers folder, to train)")
        return sv.VLLMServing(url, name), Path(cfg.checkpoint)
    alias, gguf = resolve_gguf(s.name)
    ckpt = Path(cfg.checkpoint) if cfg.checkpoint else trainable_checkpoint(s.name)
    return sv.EmbeddedServing(gguf, alias, n_ctx=s.n_ctx, threads=s.threads,
                              timeout_s=s.timeout_s), ckpt  # fmt: skip


def run_cotrain(
    cfg: CotrainConfig,
    run_dir: Path,
    task: Task,
    source: str,
    proposer_model: ChatModel | None,
    say: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Run (or resume) every schedule of `cfg` in `run_dir`, after the sweep where
    `cfg.sweep.enabled` (its chosen (E*, I*) is stagewise's); write curves and summary."""
    from whale.analysis.curves import markdown_table, schedule_summary, write_curves

    t0 = time.monotonic()
    serving = None
    results: list[dict[str, Any]] = []
    try:
        with RunLock(run_dir):
            if (run_dir / "config.toml").exists():
                check_resume(cfgmod.load(CotrainConfig, run_dir / "config.toml"), cfg, run_dir)
            check_seed(run_dir, cfg.harness, source)
            write_atomic(run_dir / "config.toml", tomli_w.dumps(cfgmod.to_dict(cfg)))
            splits = cotrain_splits(task, cfg)
            serving, ckpt = make_serving(cfg)
            swept = None
            if cfg.sweep.enabled:
                swept = run_sweep(cfg, run_dir, task, source, splits, serving, ckpt,
                                  proposer_model, say)  # fmt: skip
                e_star, i_star = swept["chosen"]
                cfg = dataclasses.replace(cfg, stagewise=(float(e_star), int(i_star)))
            for kind in cfg.schedules:
                say(f"schedule {kind}")
                results.append(_one_schedule(cfg, kind, run_dir / kind, task, source, splits,
                                             serving, ckpt, proposer_model, say))  # fmt: skip
            csv_path, _, png = write_curves(run_dir, cfg.task.id)
            meta = {"task": cfg.task.id, "harness": cfg.harness, "solver": cfg.solver.name,
                    "schedules": results, "summary": schedule_summary(run_dir),
                    "curves": str(csv_path), "plot": str(png),
                    "wall_s (this invocation)": round(time.monotonic() - t0, 1)}  # fmt: skip
            if swept is not None:
                meta["sweep"] = swept
            table = markdown_table(run_dir)
            write_atomic(run_dir / "summary.md", f"# whale cotrain: {cfg.task.id}\n\n{table}\n")
            write_atomic(run_dir / "summary.json", json.dumps(meta, indent=2, default=str))
            meta["table"] = table
    except cfgmod.ConfigError as e:
        raise RecordError(str(e)) from None
    finally:
        if serving is not None:
            serving.close()
        close_model(proposer_model)
    return meta


def point_name(epochs: float, iters: int) -> str:
    return f"E{epochs:g}-I{iters}"


def run_sweep(cfg: CotrainConfig, run_dir: Path, task: Task, source: str, splits: Splits,
              serving: Any, ckpt: Path, proposer: ChatModel | None,
              say: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """One stagewise run per (E*, I*) of the grid, each in `sweep/<point>/stagewise/` and
    scored on the validation split at its end; the best is chosen (`SweepSettings`). Writes
    `sweep.json`; a resume replays the points from their ledgers."""
    points = []
    for e, i in cfg.sweep.grid():
        say(f"sweep: stagewise (E*, I*) = ({e:g}, {i})")
        pc = dataclasses.replace(cfg, stagewise=(e, i))
        root = run_dir / "sweep" / point_name(e, i) / "stagewise"
        record_dir(run_dir / "sweep")  # never links: a point's ledger would be written there
        record_dir(root.parent)
        r = _one_schedule(pc, "stagewise", root, task, source, splits, serving, ckpt, proposer,
                          say, sweep_point=True)  # fmt: skip
        points.append({"epochs": e, "iters": i, "validation_accuracy": r["validation_accuracy"],
                       "validation_n": r["validation_n"],
                       "training_rollouts": r["training_rollouts"], "stopped": r["stopped"],
                       "dir": str(root.relative_to(run_dir))})  # fmt: skip
    best = max(points, key=lambda p: p["validation_accuracy"])  # first of equals: cheaper
    out = {"rule": "highest validation accuracy of the point's final (weights, harness); "
                   "ties: the smaller E*, then the smaller I*",
           "chosen": [best["epochs"], best["iters"]], "points": points,
           "training_rollouts": sum(p["training_rollouts"] for p in points)}  # fmt: skip
    write_atomic(run_dir / "sweep.json", json.dumps(out, indent=2))
    say(f"sweep: chose (E*, I*) = ({best['epochs']:g}, {best['iters']}), validation accuracy "
        f"{best['validation_accuracy']:.3f}")  # fmt: skip
    return out


def _one_schedule(cfg: CotrainConfig, kind: str, root: Path, task: Task, source: str,
                  splits: Splits, serving: Any, ckpt: Path, proposer: ChatModel | None,
                  say: Callable[[str], None],
                  sweep_point: bool = False) -> dict[str, Any]:  # fmt: skip
    """One schedule's run in `root`. A sweep point reads nothing at its boundaries; its final
    (θ, h) is scored on the validation split once, after the run."""
    from whale.train.checkpoint import base_tokenizer

    record_dir(root)  # never a link: the schedule's ledger would be written through it
    fp = outcome_fingerprint(cfg.task, cfg.solver, cfg.runtime)
    store = OutcomeStore(root, fp)
    cache = (cfg.solver.cache_path or str(Path.home() / ".cache" / "whale" / "responses.sqlite")
             if cfg.solver.cache else None)  # fmt: skip
    solver = Solver(serving, fp, cfg.runtime, cache_path=cache)
    weights = operator = reads = None
    try:
        if kind != "harness-only":
            weights = WeightPhase(root / "weight", task, splits.pool, store, solver, cfg.rsft,
                                  trainer_factory(ckpt, cfg.rsft, cfg.seed),
                                  lambda: base_tokenizer(ckpt), cfg.seed, cfg.workers)
        if kind != "weight-only":
            operator = _harness_operator(cfg, root / "harness", splits.pool, store, proposer)
        if not sweep_point:
            reads = Reads(root, kind, task, store, solver, cfg.workers, splits.held,
                          splits.validation, say)  # fmt: skip
        run = Cotrain(root, kind, cfg.settings(kind), task, source, store, solver, weights,
                      operator, cfg.workers, reads or no_read, say)  # fmt: skip
        try:
            result = run.run()
        finally:
            run.close()
        if reads is not None:
            result["reads"] = reads.rows()
        else:  # the sweep's score: after the run, never inside it
            va = score_split(store, solver, task, store.harness(result["harness"]),
                             splits.validation, cfg.workers,
                             {"schedule": kind, "cycle": 1, "phase": "eval",
                              "kind": "validation"})  # fmt: skip
            result.update(validation_accuracy=va.accuracy, validation_n=va.n)
        write_atomic(root / "summary.json", json.dumps(result, indent=2, default=str))
        return result
    finally:
        if reads is not None:
            reads.close()
        if weights is not None:
            weights.close()
        store.close()
        solver.close()


def _harness_operator(cfg: CotrainConfig, root: Path, pool: list[Question],
                      store: OutcomeStore, proposer: ChatModel | None) -> Any:  # fmt: skip
    """The harness phase's operator; it scores on the pool's first `search` questions. The
    search keeps one archive for all the schedule's harness phases (`root/archive`,
    `root/sessions`); when the weights changed between two harness phases, the earlier phase's
    top `m` candidates are scored again under the new ones (`SearchSettings.rescore`: one
    iteration's worth of scoring). The revision loop has no archive: `root/phase_NN/`."""
    if proposer is None:
        raise RecordError("a harness phase needs a proposer model")
    if cfg.operator == "revise":
        from whale.revise.loop import LoopSettings
        from whale.revise.operator import ReviseOperator
        from whale.revise.proposer import Proposer

        loop = LoopSettings(rounds=cfg.harness_iters, g=cfg.m, seed=cfg.seed,
                            workers=cfg.workers)  # fmt: skip
        return ReviseOperator(root, pool, pool[: cfg.search], store, Proposer(proposer), loop)
    from whale.search.loop import SearchSettings
    from whale.search.operator import SearchOperator

    settings = SearchSettings(iterations=cfg.harness_iters, m=cfg.m, workers=cfg.workers,
                              seed=cfg.seed, rescore=cfg.m)  # fmt: skip
    return SearchOperator(root, pool[: cfg.search], store, proposer, settings, cfg.agent)
