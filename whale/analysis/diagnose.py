"""`whale diagnose`: which lever moves which capability, the harness or the weights?

WHALE's advice (seed 000, "the model can't" vs "the harness prevents it"): before a large
training budget, run a short harness-only probe and a short weight-only probe at the same small
rollout budget and see, per capability, which one moved it. This module is that diagnosis built
on the existing machinery, not a new loop: it runs `whale cotrain` (`run_cotrain`) with the two
schedules "harness-only" and "weight-only", one cycle each, at one rollout budget, into the
diagnose run directory (which is therefore also a cotrain run directory: curves, ledger,
reads), then compares the probe split's first read (boundary "start") with its last read, per
capability, for each probe.

Capabilities (`CAPABILITIES`): format compliance, truncation rate (lower is better), retrieval
accuracy and answer extraction (retrieval tasks only: tasks with gold passages), and accuracy.
Per-question values come from the eval rows of each schedule's ledger (`outcomes.jsonl`), matched
to a read by its harness and adapter: the same probe questions before and after, so the effect
of a probe is a *paired* difference d_i = after_i - before_i, with delta = mean(d) and noise
SE = sd(d) / sqrt(n). Answer extraction is conditional on the gold being retrieved, so its two
question sets differ: its SE is the unpaired binomial sqrt(p0(1-p0)/n0 + p1(1-p1)/n1). Where the
ledger rows of a read are not all there, the read's aggregates (reads.jsonl) are used with the
unpaired binomial SE (`paired: false` in the output).

The rule (`verdict`): a probe *moved* a capability when it improved it by more than z·SE (z = 2
by default, `z` in the config; the improvement must be strictly larger, and an SE of None,
n < 2, never counts). "harness bottleneck": the harness probe moved it and the weight probe did
not; "model bottleneck": the reverse; "both"; "neither (within noise)". A probe that made a
capability *worse* beyond noise is named in the row's notes, not in the verdict. A capability
the task does not have (no gold passages) is "n/a".

The probe split, and what is never read: the probe questions are cotrain's boundary split
(`eval` questions), drawn with the training pool by `cotrain_splits` (seeded shuffle, disjoint
from the training questions by id and normalized text, checked). Diagnose never builds a
`SealedSplit` and never reads a run's `eval_read.json`. With `reserve_adapt` (default on) it
also keeps out of its pool the held-out questions that `whale adapt` would seal for the same
task and seed at adapt's default sizes (dev 25, eval 75): they are computed from the first
dev + eval questions of the pool (question ids and texts only) and removed, by id and normalized
text, before any split is drawn. Not covered: that computation assumes the pool of size N is the
first N questions of a larger pool (true of Reasoning Gym families and the generated mhqa;
file tasks ignore the size), and an adapt run started with other sizes, `whale eval`'s first-n
questions and a `whale search` split are not reserved.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from whale import config as cfgmod
from whale.config import above, at_least, check_choices, part
from whale.metaharness.agent import AgentConfig
from whale.models import ChatModel, close_model
from whale.records import RecordError, iter_jsonl, write_atomic
from whale.runs import load_run_config, refuse_changes, save_run_config
from whale.runs.fields import OperatorFields
from whale.schedule.cotrain import CotrainConfig, OperatorKind, Serving, run_cotrain
from whale.schedule.loop import ScheduleKind
from whale.tasks import Question, Task
from whale.tasks.base import WrappedTask, normalize_prompt
from whale.train.rsft import RsftSettings

CAPABILITIES = ("format_compliance", "truncation_rate", "retrieval_accuracy",
                "answer_extraction", "accuracy")  # fmt: skip
LOWER_IS_BETTER = frozenset({"truncation_rate"})
# probe -> cotrain schedule
PROBES: dict[str, ScheduleKind] = {"harness": "harness-only", "weight": "weight-only"}
VERDICTS = ("harness bottleneck", "model bottleneck", "both", "neither (within noise)", "n/a")
CONFIG_NAME = "diagnose.toml"
ADAPT_DEV, ADAPT_EVAL = 25, 75  # whale adapt's default split sizes (AdaptConfig)


def _probe_rsft() -> RsftSettings:
    return RsftSettings(g=4, step_epochs=0.5)


@dataclass
class DiagnoseConfig(OperatorFields):
    """Config of `whale diagnose`. The default budget is small on purpose: 48 training rollouts
    per probe (weight: 2 steps of 6 prompts x G = 4; harness: the seed and its candidates
    scored on the 12 search questions), one cycle each, 30 probe questions."""

    # What a resume may change besides where and how fast rollouts run (whale.runs.resume):
    # z only re-judges the recorded probes.
    judging_fields: ClassVar[frozenset[str]] = frozenset({"z"})

    agent: AgentConfig = field(default_factory=AgentConfig)
    rsft: RsftSettings = field(default_factory=_probe_rsft)
    serving: Serving = "embedded"
    checkpoint: str | None = None
    operator: OperatorKind = "search"
    rollouts: int = 48  # training rollouts of each probe (the same budget for both)
    weight_epochs: float = 1.0  # E of the weight probe
    harness_iters: int = 2  # I of the harness probe
    m: int = 2
    train: int = 12  # training prompt pool (both probes)
    search: int = 12  # its first N score harness candidates
    eval: int = 30  # probe questions, read before and after each probe
    workers: int = 2
    seed: int = 0
    z: float = 2.0  # moved = improved by more than z standard errors
    reserve_adapt: bool = True  # keep whale adapt's default held-out questions out of the pool
    out: str | None = None

    def validate(self) -> None:
        check_choices(self)
        at_least(self, 1, "rollouts", "harness_iters", "m", "train", "search", "eval",
                 "workers")  # fmt: skip
        above(self, 0.0, "weight_epochs", "z")
        if self.search > self.train:
            raise cfgmod.ConfigError(f"search ({self.search}) must be at most train "
                                     f"({self.train}): it is the pool's first questions")
        if self.eval < 2:
            raise cfgmod.ConfigError(f"eval must be at least 2 (a standard error), got {self.eval}")
        with part("rsft"):
            self.rsft.validate()
        with part("agent"):
            self.agent.validate()

    def pool_size(self) -> int:
        """Questions to load: the given task.size, else adapt's pool plus the probe's needs."""
        if self.task.size is not None:
            return self.task.size
        return (ADAPT_DEV + ADAPT_EVAL if self.reserve_adapt else 0) + self.train + self.eval

    def cotrain(self) -> CotrainConfig:
        """The cotrain run the two probes are: harness-only and weight-only, one cycle."""
        return CotrainConfig(
            task=dataclasses.replace(self.task, size=self.pool_size()), harness=self.harness,
            solver=self.solver, proposer=self.proposer, agent=self.agent, runtime=self.runtime,
            rsft=self.rsft, serving=self.serving, checkpoint=self.checkpoint,
            operator=self.operator, schedules=list(PROBES.values()), rollouts=self.rollouts,
            weight_epochs=self.weight_epochs, harness_iters=self.harness_iters, cycles=1,
            m=self.m, train=self.train, search=self.search, eval=self.eval,
            validation=0,  # the probes report no best point and sweep nothing
            workers=self.workers, seed=self.seed, out=self.out,
        )  # fmt: skip


# --- the pool: adapt's sealed held-out questions kept out -------------------------------------


class _Pool:
    def __init__(self, questions: Sequence[Question]) -> None:
        self._qs = list(questions)

    def questions(self) -> list[Question]:
        return list(self._qs)


def adapt_held_out(task: Task, seed: int) -> list[Question]:
    """The held-out split `whale adapt` seals for this task and seed at its default sizes, drawn
    as adapt draws it (`split_pools`) from the pool's first dev + eval questions. Only ids and
    prompts are used; no `SealedSplit` is opened and nothing is recorded."""
    from whale.revise.run import AdaptConfig, split_pools

    acfg = AdaptConfig(seed=seed)
    prefix = task.questions()[: acfg.dev + acfg.eval]
    if len(prefix) < acfg.dev + acfg.eval:
        return []  # adapt could not run on this pool at its defaults: nothing is sealed
    try:
        return split_pools(cast(Task, _Pool(prefix)), acfg)[2]
    except ValueError:  # too few distinct questions (rg:coin_flip: 79 among its first 100):
        return []  # adapt refuses this pool at its defaults too, so it seals nothing


class Excluding(WrappedTask):
    """`task` without the questions of `reserved` (by id and by normalized prompt text); every
    other attribute (grader, format check, gold passages, retriever) is the task's own."""

    def __init__(self, task: Task, reserved: Sequence[Question]) -> None:
        super().__init__(task)
        self._task = task  # the wrapped task's earlier name, read by callers
        self._ids = {q.id for q in reserved}
        self._texts = {normalize_prompt(q.prompt) for q in reserved}
        self.reserved = len(reserved)

    def questions(self) -> list[Question]:
        return [q for q in self.inner.questions()
                if q.id not in self._ids and normalize_prompt(q.prompt) not in self._texts]


# --- the statistics and the rule ---------------------------------------------------------------


@dataclass
class Shift:
    """One probe's effect on one capability."""

    before: float | None
    after: float | None
    delta: float | None
    se: float | None
    n: int  # questions behind delta (paired) or behind `after` (unpaired)
    paired: bool
    moved: bool = False  # improved by more than z * se
    worse: bool = False  # worsened by more than z * se


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def paired_shift(before: Mapping[str, float], after: Mapping[str, float], z: float,
                 lower_is_better: bool = False) -> Shift:  # fmt: skip
    """delta = mean over the questions in both of after - before; se = sample sd / sqrt(n)."""
    common = sorted(set(before) & set(after))
    d = [after[q] - before[q] for q in common]
    n = len(d)
    b, a = _mean([before[q] for q in common]), _mean([after[q] for q in common])
    delta = _mean(d)
    se = None
    if n >= 2 and delta is not None:
        se = math.sqrt(sum((x - delta) ** 2 for x in d) / (n - 1) / n)
    return _judge(Shift(b, a, delta, se, n, True), z, lower_is_better)


def unpaired_shift(p0: float | None, n0: int, p1: float | None, n1: int, z: float,
                   lower_is_better: bool = False) -> Shift:  # fmt: skip
    """Two proportions on different question sets: se = sqrt(p0(1-p0)/n0 + p1(1-p1)/n1)."""
    if p0 is None or p1 is None or n0 < 1 or n1 < 1:
        return Shift(p0, p1, None, None, n1, False)
    se = math.sqrt(p0 * (1 - p0) / n0 + p1 * (1 - p1) / n1) if min(n0, n1) >= 2 else None
    return _judge(Shift(p0, p1, p1 - p0, se, n1, False), z, lower_is_better)


def _judge(s: Shift, z: float, lower_is_better: bool) -> Shift:
    if s.delta is None or s.se is None:
        return s
    gain = -s.delta if lower_is_better else s.delta
    bar = z * s.se + 1e-9  # strictly beyond z·SE; float dust at the boundary is not a move
    s.moved = gain > bar
    s.worse = -gain > bar
    return s


def verdict(harness: Shift, weight: Shift) -> str:
    """The rule of the module docstring, on two probes' shifts of one capability."""
    if harness.delta is None and weight.delta is None:
        return "n/a"
    if harness.moved and weight.moved:
        return "both"
    if harness.moved:
        return "harness bottleneck"
    if weight.moved:
        return "model bottleneck"
    return "neither (within noise)"


# --- reading the probes' records ------------------------------------------------------------


def _values(rows: Mapping[str, Mapping[str, Any]], cap: str) -> dict[str, float]:
    """Per-question 0/1 values of capability `cap` (paired capabilities only)."""
    key = {"format_compliance": "format_ok", "truncation_rate": "truncated",
           "accuracy": "correct", "retrieval_accuracy": "retrieval_hit"}[cap]  # fmt: skip
    return {q: float(r[key]) for q, r in rows.items() if r.get(key) is not None}


def _check_row(row: Mapping[str, Any], where: str) -> None:
    for key in ("correct", "format_ok", "truncated"):
        if not isinstance(row.get(key), bool):
            raise RecordError(f"{where}: {key!r} must be true/false, got {row.get(key)!r}")
    hit = row.get("retrieval_hit")
    if hit is not None and not isinstance(hit, bool):
        raise RecordError(f"{where}: 'retrieval_hit' must be true/false/null, got {hit!r}")
    if not isinstance(row.get("question_id"), str):
        raise RecordError(f"{where}: 'question_id' must be a string")


@dataclass
class Probe:
    """One probe's schedule folder: its first and last read and their per-question rows."""

    name: str
    schedule: str
    start: dict[str, Any]
    end: dict[str, Any]
    start_rows: dict[str, dict[str, Any]] | None  # question id -> ledger row; None: incomplete
    end_rows: dict[str, dict[str, Any]] | None


def load_probe(run_dir: Path, name: str) -> Probe:
    d = run_dir / PROBES[name]
    reads = iter_jsonl(d / "reads.jsonl")
    if not reads:
        raise RecordError(f"{d / 'reads.jsonl'}: no read of the probe split (did it run?)")
    start = next((r for _, r in reads if r.get("boundary") == "start"), None)
    if start is None:
        raise RecordError(f"{d / 'reads.jsonl'}: no 'start' read")
    end = reads[-1][1]
    eval_rows: list[tuple[int, dict[str, Any]]] = [
        (i, r) for i, r in iter_jsonl(d / "outcomes.jsonl") if r.get("split") == "eval"]
    for i, r in eval_rows:
        _check_row(r, f"{d / 'outcomes.jsonl'}:{i}")
    ids = {r["question_id"] for _, r in eval_rows if r.get("cycle") == 0}

    def rows_of(read: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
        got: dict[str, dict[str, Any]] = {}
        for _, r in eval_rows:
            if (r.get("harness") == read.get("harness") and r.get("adapter") == read.get("adapter")
                    and r["question_id"] in ids):
                got.setdefault(r["question_id"], r)
        return got if got and len(got) == read.get("n") else None

    return Probe(name, PROBES[name], start, end, rows_of(start), rows_of(end))


def probe_shift(p: Probe, cap: str, z: float) -> Shift:
    low = cap in LOWER_IS_BETTER
    if p.start_rows is not None and p.end_rows is not None:
        if cap != "answer_extraction":
            return paired_shift(_values(p.start_rows, cap), _values(p.end_rows, cap), z, low)

        def hits(rows: Mapping[str, Mapping[str, Any]]) -> list[bool]:
            return [bool(r["correct"]) for r in rows.values() if r.get("retrieval_hit")]

        h0, h1 = hits(p.start_rows), hits(p.end_rows)
        return unpaired_shift(_mean([float(x) for x in h0]), len(h0),
                              _mean([float(x) for x in h1]), len(h1), z, low)  # fmt: skip

    def agg(read: Mapping[str, Any]) -> tuple[float | None, int]:
        v, n = read.get(cap), int(read.get("n") or 0)
        if cap == "answer_extraction" and read.get("retrieval_accuracy") is not None:
            n = round(n * float(read["retrieval_accuracy"]))
        return (float(v) if isinstance(v, int | float) else None), n

    (p0, n0), (p1, n1) = agg(p.start), agg(p.end)
    return unpaired_shift(p0, n0, p1, n1, z, low)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _cell(s: Shift) -> str:
    if s.delta is None:
        return _fmt(s.after)
    se = "n/a" if s.se is None else f"{s.se:.3f}"
    mark = " *" if s.moved else " (worse)" if s.worse else ""
    return f"{s.after:.3f} ({s.delta:+.3f} ± {se}){mark}"


def diagnose(run_dir: Path, z: float = 2.0) -> dict[str, Any]:
    """The diagnosis of a run directory holding both probes (the rule: module docstring)."""
    probes = {name: load_probe(run_dir, name) for name in PROBES}
    rows: list[dict[str, Any]] = []
    for cap in CAPABILITIES:
        h, w = probe_shift(probes["harness"], cap, z), probe_shift(probes["weight"], cap, z)
        notes = [f"the {n} probe made it worse beyond noise"
                 for n, s in (("harness", h), ("weight", w)) if s.worse]
        if h.before is not None and w.before is not None and abs(h.before - w.before) > 1e-9:
            notes.append(f"the two probes' before reads differ ({h.before:.3f} vs "
                         f"{w.before:.3f}): sampled, not greedy, probe reads")
        rows.append({"capability": cap, "before": h.before if h.before is not None else w.before,
                     "harness": dataclasses.asdict(h), "weight": dataclasses.asdict(w),
                     "verdict": verdict(h, w), "notes": notes,
                     "lower_is_better": cap in LOWER_IS_BETTER})  # fmt: skip
    spent = {n: int(p.end.get("training_rollouts", 0)) for n, p in probes.items()}
    return {
        "rule": (f"a probe moved a capability when it improved it by more than z = {z:g} "
                 "standard errors (paired over the probe questions: sd(after - before)/sqrt(n); "
                 "answer extraction and incomplete ledgers: binomial, unpaired); harness "
                 "bottleneck = only the harness probe moved it, model bottleneck = only the "
                 "weight probe, both, or neither (within noise)"),
        "z": z,
        "probes": {n: {"schedule": p.schedule, "training_rollouts": spent[n],
                       "probe_questions": p.start.get("n"), "start": p.start, "end": p.end,
                       "paired": p.start_rows is not None and p.end_rows is not None}
                   for n, p in probes.items()},  # fmt: skip
        "equal_budget": len(set(spent.values())) == 1,
        "capabilities": rows,
    }


def markdown(diag: Mapping[str, Any], title: str = "whale diagnose") -> str:
    p = diag["probes"]
    lines = [f"# {title}", "",
             f"Probe questions: {p['harness']['probe_questions']}; training rollouts: harness "
             f"probe {p['harness']['training_rollouts']}, weight probe "
             f"{p['weight']['training_rollouts']}.", "",
             "| capability | before | harness probe | weight probe | verdict |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in diag["capabilities"]:
        name = r["capability"] + (" (lower is better)" if r["lower_is_better"] else "")
        h, w = Shift(**r["harness"]), Shift(**r["weight"])
        lines.append(f"| {name} | {_fmt(r['before'])} | {_cell(h)} | {_cell(w)} | "
                     f"{r['verdict']} |")
    lines += ["", "Cells: after (delta ± SE); * = moved (improved by more than z·SE).",
              f"Rule: {diag['rule']}."]
    if not diag["equal_budget"]:
        lines.append("Note: the probes spent different training rollouts (a probe stopped "
                     "early); compare with care.")
    notes = [f"- {r['capability']}: {n}" for r in diag["capabilities"] for n in r["notes"]]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


# --- the run -------------------------------------------------------------------------------


def run_diagnose(
    cfg: DiagnoseConfig,
    run_dir: Path,
    task: Task,
    source: str,
    proposer_model: ChatModel | None,
    say: Callable[[str], None] = lambda s: None,
    cotrain: Callable[..., dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run (or resume: a rerun replays what is recorded and pays nothing twice) both probes in
    `run_dir`, then write diagnosis.json and diagnosis.md there. `task` must hold
    `cfg.pool_size()` questions. `cotrain`: `run_cotrain` when None (a parameter for tests)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        if (run_dir / CONFIG_NAME).exists():
            saved = load_run_config(run_dir, DiagnoseConfig, CONFIG_NAME, "whale diagnose")
            refuse_changes(saved, cfg, run_dir)
    except (cfgmod.ConfigError, RecordError):  # a refused resume keeps its type and field
        close_model(proposer_model)
        raise
    save_run_config(run_dir, cfg, CONFIG_NAME)
    pool: Task = task
    if cfg.reserve_adapt:
        held = adapt_held_out(task, cfg.seed)
        pool = cast(Task, Excluding(task, held))
        say(f"kept out of the pool: the {len(held)} held-out questions whale adapt seals "
            f"for {cfg.task.id} at seed {cfg.seed}")
    meta = (cotrain or run_cotrain)(cfg.cotrain(), run_dir, pool, source, proposer_model, say)
    diag = diagnose(run_dir, cfg.z)
    diag.update({"task": cfg.task.id, "harness": cfg.harness, "solver": cfg.solver.name,
                 "proposer": cfg.proposer.name, "reserved_adapt_held_out": cfg.reserve_adapt,
                 "cotrain": {k: v for k, v in meta.items() if k != "table"}})  # fmt: skip
    md = markdown(diag, f"whale diagnose: {cfg.task.id}, harness {cfg.harness}")
    write_atomic(run_dir / "diagnosis.json", json.dumps(diag, indent=2, default=str))
    write_atomic(run_dir / "diagnosis.md", md)
    diag["table"] = md
    return diag


def prepare(cfg: DiagnoseConfig, unsafe: bool,
            task: Task | None = None) -> tuple[Task, str, ChatModel]:  # fmt: skip
    """(task, seed source, proposer model) of `cfg`, each checked before any run directory:
    typed WhaleErrors naming the field. The solver is only checked to exist (the probes serve
    it themselves), uncached; the splits can be drawn with adapt's held-out questions kept out
    (`reserve_adapt`)."""
    from whale.runs.setup import SplitRefused, model
    from whale.schedule.cotrain import cotrain_splits
    from whale.schedule.setup import seed_and_task

    task_obj, source, _ = seed_and_task(cfg, unsafe, cfg.pool_size(), task)
    try:  # the splits can be drawn (before any run dir or model)
        pool = Excluding(task_obj, adapt_held_out(task_obj, cfg.seed)) if cfg.reserve_adapt \
            else task_obj  # fmt: skip
        cotrain_splits(pool, cfg.cotrain())  # type: ignore[arg-type]
    except ValueError as e:
        raise SplitRefused(f"{e} (diagnose keeps whale adapt's held-out questions out: "
                           "reserve_adapt)").at("train") from None
    return task_obj, source, model(cfg.proposer, "proposer.name")
