"""`whale cotrain` and `whale rsft` as library calls: config, splits, one run per schedule.

Splits: a training prompt pool (`train`), a held-out eval split (`eval`) and a validation split
(`validation`), disjoint by id and normalized text (`cotrain_splits`). Train and eval are drawn
exactly as a run without a validation split draws them: the same task size (`pool_size`), the
same seeded shuffle. Validation comes from what that draw leaves: the rest of the shuffled
pool (not with `validation_from = "beyond"`), then questions of the task loaded larger
(`validation_source`) that are new by id and text. The weight phase samples the whole pool;
the harness phase scores candidates on its first `search` questions (training data too:
WHALE's harness phase climbs the archive's best *training* score). The eval split is read at
every phase boundary, for the curves only. The validation split is read at the same
boundaries, outside the loop's reach (`whale.schedule.loop.Reads`), and chooses two things only: the
reported best point of each schedule (`whale.schedule.curves`) and, with `sweep.enabled`
(`whale cotrain --sweep`), stagewise's (E*, I*). No switching rule reads it.

Layout of the run directory: `format.json` (the layout's version, `FORMAT`: a resume of a run
of another version is refused, see `check_format`), `config.toml`, then one folder per schedule
(`adaptive/`, `harness-only/`, ...), each with its ledger (`outcomes.jsonl` + `trajectories/` +
`harnesses/`), `reads.jsonl`, `phases.jsonl`, `weight/` (steps.jsonl and adapters/step_NNNN/),
`harness/` (the search's ONE archive for all the schedule's harness phases, `harness/archive/`,
with the proposer's sessions in `harness/sessions/`; the revision loop, which has no archive,
`harness/phase_NN/`) and `summary.json`; at the top `curves.csv`, `phases.csv`, `curves.png`,
`summary.md` and `summary.json` (with the (E*, I*) stagewise ran and where it came from). All
schedules share the splits and the rollout budget, so they are compared at the same cost. A
sweep adds `sweep/E<e>-I<i>/stagewise/` (one stagewise run per grid point, the same layout
without reads) and `sweep.json` (every point's validation accuracy at its end, and the point
chosen). The stagewise schedule then starts from a copy of the chosen point's records
(`whale.schedule.sweep_copy`): the same config and seed, so its weight steps and search
replay from them and only its boundary reads are new; the sweep's cost is not paid twice.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from whale import config as cfgmod
from whale.config import TrackerKind, above, at_least, check_choices, part
from whale.metaharness.agent import AgentConfig
from whale.models import ChatModel, close_model
from whale.records import RecordError, RunLock, record_dir, write_atomic
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
from whale.schedule.loop import (
    SCHEDULES,
    Cotrain,
    Reads,
    ScheduleKind,
    ScheduleSettings,
    no_read,
    score_split,
)
from whale.schedule.sweep_copy import stagewise_from_sweep
from whale.tasks import Question, Task, check_disjoint, dedupe, split
from whale.train.rsft import RsftSettings, Solver, WeightPhase, trainer_factory

Serving = Literal["embedded", "hf", "vllm"]
SERVING: tuple[Serving, ...] = typing.get_args(Serving)
OperatorKind = Literal["search", "revise"]  # the harness operator of the harness phase
ValidationFrom = Literal["rest", "beyond"]
# The run directory's layout version (format.json; `check_format`). 2: stagewise = (E*, I*),
# a validation split that leaves train and eval as without it, one archive per schedule.
FORMAT = 2
FORMAT_FILE = "format.json"
# (E*, I*) when neither `stagewise` nor the sweep gives it. At the defaults (train 50, G 4,
# search 20, m 2) it costs about the rollout budget: 0.75 epoch = 150 weight samples, the start
# harness's scoring + 3 iterations = 20 + 120.
STAGEWISE_DEFAULT = (0.75, 3)
STAGEWISE_RULE = ("two values [E_STAR, I_STAR]: E* > 0 epochs (the one weight stage) and I* an "
                  "integer >= 1 (the one harness stage's iterations)")  # fmt: skip


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
class CotrainConfig(OperatorFields):
    # What a resume may change besides where and how fast rollouts run (whale.runs.resume):
    # which schedules run (each at the same budget, in its own folder).
    budget_fields: ClassVar[frozenset[str]] = frozenset({"schedules"})

    agent: AgentConfig = field(default_factory=AgentConfig)
    rsft: RsftSettings = field(default_factory=RsftSettings)
    # How trained weights are served: "embedded" (llama.cpp on the GGUF + the adapter as a
    # LoRA GGUF), "hf" (transformers + PEFT in process), "vllm" (solver NAME@URL; adapters
    # loaded at run time, the adapter folders must be readable by the server).
    serving: Serving = "embedded"
    # The transformers checkpoint trained (default: made once from the solver's GGUF; with
    # serving "hf", the solver name may be the checkpoint folder itself).
    checkpoint: str | None = None
    # The harness operator: "search" (Meta-Harness, the paper's) or "revise" (Harness
    # Learning's revision loop: rounds = harness_iters, G = m, feedback from the pool).
    operator: OperatorKind = "search"
    schedules: list[ScheduleKind] = field(default_factory=lambda: ["adaptive"])
    # Training rollouts per schedule; none: no cap (`whale rsft` without --rollouts), which
    # needs cycles for a schedule that does not end by itself (whale.schedule.loop.ENDING).
    rollouts: int | None = 300
    weight_epochs: float = 0.2  # E (fixed, weight-only)
    harness_iters: int = 6  # I (fixed, harness-only)
    # (E*, I*): stagewise's one weight stage and one harness stage (STAGEWISE_RULE). Unset:
    # the sweep's choice with sweep.enabled, else STAGEWISE_DEFAULT. Set, it cannot go with
    # the sweep (whose choice would silently replace it).
    stagewise: list[int | float] | None = None
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
    # Where validation questions come from: "rest" (what the seeded train/eval draw leaves,
    # then beyond the pool) or "beyond" (only questions beyond the pool, new by id and text:
    # the same for every seed, so an (E*, I*) one seed's validation chose, run on another
    # seed, never read that seed's eval or train questions).
    validation_from: ValidationFrom = "rest"
    sweep: SweepSettings = field(default_factory=SweepSettings)
    workers: int = 2
    # mirror the finished run into an experiment tracker (whale.analysis.tracking.track_run):
    # "none" (default) | "mlflow" | "wandb", offline, files inside the run directory
    tracking: TrackerKind = "none"
    seed: int = 0
    out: str | None = None

    def validate(self) -> None:
        check_choices(self)
        at_least(self, 1, "rollouts", "harness_iters", "cycles", "max_harness_iters", "m",
                 "train", "search", "eval", "workers")  # fmt: skip
        above(self, 0.0, "weight_epochs", "max_weight_epochs")
        at_least(self, 0, "validation")
        st = self.stagewise
        if st is not None and not (len(st) == 2 and st[0] > 0 and isinstance(st[1], int)
                                   and st[1] >= 1):  # fmt: skip
            raise cfgmod.ConfigError(f"stagewise: want {STAGEWISE_RULE}; got {list(st)}")
        if not self.schedules or len(set(self.schedules)) != len(self.schedules):
            raise cfgmod.ConfigError(f"schedules: want distinct names of {', '.join(SCHEDULES)}; "
                                     f"got {self.schedules}")  # fmt: skip
        self._check_sweep()
        if self.search > self.train:
            raise cfgmod.ConfigError(f"search ({self.search}) must be at most train "
                                     f"({self.train}): it is the pool's first questions")
        if len(self.patience) != 2 or self.patience[0] < 0 or self.patience[1] < 1:
            raise cfgmod.ConfigError(f"patience must be [J_MIN, P_H], got {self.patience}")
        for kind in self.schedules:  # each schedule's own rules (without a cap, an end)
            self.settings(kind)
        with part("rsft"):
            self.rsft.validate()
        with part("agent"):
            self.agent.validate()
        with part("sweep"):
            self.sweep.validate()

    def _check_sweep(self) -> None:
        """The sweep only where its choice is used, never beside one it would replace."""
        if not self.sweep.enabled:
            return
        if self.validation < 1:
            raise cfgmod.ConfigError("sweep.enabled: the sweep chooses (E*, I*) on the "
                                     "validation split; set validation >= 1")  # fmt: skip
        if "stagewise" not in self.schedules:
            raise cfgmod.ConfigError(f"sweep.enabled: the sweep chooses stagewise's (E*, I*), "
                                     f"but schedules {self.schedules} has no stagewise to run "
                                     "it: add stagewise, or drop the sweep")  # fmt: skip
        if self.stagewise is not None:
            raise cfgmod.ConfigError(f"stagewise {list(self.stagewise)} and sweep.enabled: the "
                                     "sweep's choice would replace the (E*, I*) given; drop "
                                     "one of them")  # fmt: skip

    def stagewise_point(self) -> tuple[float, int]:
        """(E*, I*) as given, else the default (the sweep replaces `stagewise` with its
        choice before any schedule runs: `run_cotrain`)."""
        if self.stagewise is None:
            return STAGEWISE_DEFAULT
        return float(self.stagewise[0]), int(self.stagewise[1])

    def settings(self, kind: ScheduleKind) -> ScheduleSettings:
        return ScheduleSettings(kind, self.rollouts, self.weight_epochs, self.harness_iters,
                                self.cycles, (self.patience[0], self.patience[1]),
                                self.max_weight_epochs, self.max_harness_iters,
                                self.weight_patience, self.stagewise_point(),
                                scoring_rollouts=self.search)  # fmt: skip


class Splits(NamedTuple):
    pool: list[Question]  # training prompts; the first `search` also score harnesses
    held: list[Question]  # eval: read at every boundary, for the curves only
    validation: list[Question]  # the reported best point and the sweep's choice only


def pool_size(cfg: CotrainConfig) -> int:
    """The task size train and eval are drawn from, with or without a validation split:
    `task.size`, or just enough for train + eval."""
    return cfg.task.size or cfg.train + cfg.eval


def _draw(task: Task, cfg: CotrainConfig) -> tuple[dict[str, list[Question]], list[Question]]:
    """Train and eval exactly as a run without validation draws them (the same shuffle of the
    same questions: "rest" only names what the draw leaves, in shuffled order), and the
    deduplicated pool they came from."""
    pool = dedupe(task.questions())
    rest = max(0, len(pool) - cfg.train - cfg.eval)
    parts = split(pool, {"train": cfg.train, "eval": cfg.eval, "rest": rest},
                  random.Random(cfg.seed))  # fmt: skip
    return parts, pool


def validation_source(task: Task, cfg: CotrainConfig, load: Callable[[int], Task]) -> Task | None:
    """Where validation questions beyond `task` come from: `load(size)` of the task at
    `pool_size(cfg) + validation` questions, or larger (x2, x4, ... up to x16 the
    `validation`) until it holds enough new ones (a generator that repeats itself), when the
    questions the draw may take from (`_from_rest`) are fewer than `validation` (always, when
    task.size is not given); None when they are enough. `task` is the task at
    `pool_size(cfg)`."""
    if cfg.validation < 1:
        return None
    parts, pool = _draw(task, cfg)
    rest = _from_rest(parts, cfg)
    if len(rest) >= cfg.validation:
        return None
    for k in (1, 2, 4, 8, 16):
        more = load(pool_size(cfg) + k * cfg.validation)
        if len(rest) + len(dedupe([*pool, *more.questions()])) - len(pool) >= cfg.validation:
            break
    return more


def _from_rest(parts: dict[str, list[Question]], cfg: CotrainConfig) -> list[Question]:
    return parts["rest"] if cfg.validation_from == "rest" else []


def cotrain_splits(task: Task, cfg: CotrainConfig, more: Task | None = None) -> Splits:
    """Train and eval drawn from `task` (loaded at `pool_size(cfg)`) by the seeded shuffle, the
    same with or without a validation split; validation: what that draw leaves over (not with
    `validation_from = "beyond"`), then the questions of `more` (the task loaded larger,
    `validation_source`) that repeat none of `task`'s by id or normalized text, in order. By
    id and text, not by position: a larger Reasoning Gym dataset mostly keeps its first
    questions, but acre and list_functions do not. `task` grades them all (same family and
    config; the scorers read each entry). ValueError when there are too few."""
    parts, pool = _draw(task, cfg)
    extra = dedupe([*pool, *more.questions()])[len(pool):] if more is not None else []
    candidates = _from_rest(parts, cfg) + extra
    if len(candidates) < cfg.validation:
        raise ValueError(f"validation: asked for {cfg.validation} questions beyond train and "
                         f"eval, found {len(candidates)} (a larger pool: --set task.size=N, "
                         "which also redraws train and eval)")  # fmt: skip
    splits = Splits(parts["train"], parts["eval"], candidates[: cfg.validation])
    check_disjoint({"train": splits.pool, "eval": splits.held, "validation": splits.validation})
    return splits


def needs_proposer(cfg: CotrainConfig) -> bool:
    return any(s != "weight-only" for s in cfg.schedules)


def check_format(run_dir: Path) -> None:
    """RecordError when `run_dir` holds a run (config.toml) of another `FORMAT`. One without
    format.json predates (E*, I*) (stagewise was N weight phases of E, then N harness phases
    of I), a validation split drawn beside train and eval, and one search archive per
    schedule: its config.toml loads with today's defaults and passes `refuse_changes`, while its
    records mean something else."""
    if not (run_dir / "config.toml").exists():
        return
    path = run_dir / FORMAT_FILE
    found = None
    if path.exists():
        try:
            found = json.loads(path.read_text()).get("format")
        except (ValueError, AttributeError, OSError):
            raise RecordError(f"{path}: not a record of the run's format") from None
    if found == FORMAT:
        return
    made = f"format {found}" if found is not None else f"an older whale (no {FORMAT_FILE})"
    raise RecordError(
        f"--resume {run_dir}: the run was made by {made}, this whale writes format {FORMAT}: "
        "since then stagewise is one weight stage of E* epochs and one harness stage of I* "
        "iterations, a validation split leaves train and eval as drawn without it, and a "
        "schedule's harness phases share one search archive, so resuming would mix two "
        "experiments under one config; start a new run (its records stay readable)"
    )


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
                              timeout_s=s.timeout_s, prefix_cache=s.prefix_cache,
                              speculative=s.speculative), ckpt  # fmt: skip


def run_cotrain(
    cfg: CotrainConfig,
    run_dir: Path,
    task: Task,
    source: str,
    proposer_model: ChatModel | None,
    say: Callable[[str], None] = lambda s: None,
    more: Task | None = None,
) -> dict[str, Any]:
    """Run (or resume) every schedule of `cfg` in `run_dir`, after the sweep where
    `cfg.sweep.enabled` (its chosen (E*, I*) is stagewise's, recorded in summary.json and
    sweep.json); write curves and summary. `task`: loaded at `pool_size(cfg)`; `more`: where
    validation questions beyond it come from (`validation_source`)."""
    from whale.schedule.curves import markdown_table, schedule_summary, write_curves

    t0 = time.monotonic()
    serving = None
    results: list[dict[str, Any]] = []
    try:
        with RunLock(run_dir):
            check_format(run_dir)
            if (run_dir / "config.toml").exists():
                refuse_changes(load_run_config(run_dir, CotrainConfig, command="whale cotrain"),
                               cfg, run_dir)  # fmt: skip
            check_seed(run_dir, cfg.harness, source)
            record_seed(run_dir, cfg.harness, source)
            write_atomic(run_dir / FORMAT_FILE, json.dumps({"format": FORMAT}))
            save_run_config(run_dir, cfg)
            splits = cotrain_splits(task, cfg, more)
            check_splits(run_dir, {"train": splits.pool, "eval": splits.held,
                                   "validation": splits.validation})  # fmt: skip
            serving, ckpt = make_serving(cfg)
            swept = None
            chosen_by = "the config" if cfg.stagewise is not None else "the default"
            if cfg.sweep.enabled:
                swept = run_sweep(cfg, run_dir, task, source, splits, serving, ckpt,
                                  proposer_model, say)  # fmt: skip
                e_star, i_star = swept["chosen"]
                cfg = dataclasses.replace(cfg, stagewise=[float(e_star), int(i_star)])
                chosen_by = "the sweep (sweep.json)"
            for kind in cfg.schedules:
                say(f"schedule {kind}")
                if kind == "stagewise" and swept is not None:
                    stagewise_from_sweep(run_dir, swept, say)
                results.append(_one_schedule(cfg, kind, run_dir / kind, task, source, splits,
                                             serving, ckpt, proposer_model, say))  # fmt: skip
            csv_path, _, png = write_curves(run_dir, cfg.task.id)
            meta = {"task": cfg.task.id, "harness": cfg.harness, "solver": cfg.solver.name,
                    "schedules": results, "summary": schedule_summary(run_dir),
                    "curves": str(csv_path), "plot": str(png),
                    "wall_s (this invocation)": round(time.monotonic() - t0, 1)}  # fmt: skip
            if "stagewise" in cfg.schedules:
                e_star, i_star = cfg.stagewise_point()
                meta["stagewise"] = {"e_star": e_star, "i_star": i_star, "from": chosen_by}
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
        pc = dataclasses.replace(cfg, stagewise=[e, i])
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
           "chosen": [best["epochs"], best["iters"]],
           "stagewise": {"e_star": best["epochs"], "i_star": best["iters"],
                         "note": "the (E*, I*) the stagewise schedule of this run ran"},
           "points": points,
           "training_rollouts": sum(p["training_rollouts"] for p in points)}  # fmt: skip
    write_atomic(run_dir / "sweep.json", json.dumps(out, indent=2))
    say(f"sweep: chose (E*, I*) = ({best['epochs']:g}, {best['iters']}), validation accuracy "
        f"{best['validation_accuracy']:.3f}")  # fmt: skip
    return out


def _one_schedule(cfg: CotrainConfig, kind: ScheduleKind, root: Path, task: Task, source: str,
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
        if kind == "stagewise":  # the (E*, I*) it ran, which the sweep may have chosen
            result["stagewise"] = list(cfg.stagewise_point())
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
    from whale.metaharness.loop import SearchSettings
    from whale.metaharness.operator import SearchOperator

    settings = SearchSettings(iterations=cfg.harness_iters, m=cfg.m, workers=cfg.workers,
                              seed=cfg.seed, rescore=cfg.m)  # fmt: skip
    return SearchOperator(root, pool[: cfg.search], store, proposer, settings, cfg.agent)
