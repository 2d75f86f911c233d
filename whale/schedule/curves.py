"""The curves of a `whale cotrain` run: eval accuracy against training rollouts, per schedule.

`whale cotrain` runs several schedules (adaptive, fixed, weight-only, harness-only, stagewise)
into one folder OUT, each in OUT/<schedule>/ with
- `outcomes.jsonl` (the ledger): one row per rollout ever paid for, tagged with schedule,
  cycle, phase and kind ("weight_sample" | "harness_score" | "eval");
- `reads.jsonl`: one row per read at a phase boundary ("start", or the phase that just
  ended): the eval split's accuracy and, where the run has a validation split, the validation
  accuracy, with the cumulative training rollouts spent before the read;
- `phases.jsonl`: one row per phase, with its length (weight: epochs; harness: iterations) and
  why it stopped.

The per-schedule summary (`schedule_summary`, `markdown_table`) reads these three: the final
eval read; the reported best point, chosen by validation accuracy (eval accuracy there is what
is reported; the eval split never chooses anything); the paper's cost figure, the training
rollouts at which a schedule's eval accuracy first passes (exceeds) stagewise's final eval
accuracy, as a fraction of stagewise's training rollouts (only reads after some training count:
a base that already reads at or above stagewise's final is reported as such, in its own field,
not as a crossing at 0 rollouts); and the phase lengths, median and maximum.

The counting rule is the point of this module: the x axis is the same for every schedule,
*training rollouts* = ledger rows of kind weight_sample or harness_score. Eval rows never count,
whichever schedule paid for them. Each read's `training_rollouts` is checked against the ledger
(`curve_rows` raises RecordError naming the read's file:line on a disagreement), so a schedule
that counted differently cannot draw a curve that looks cheaper than it was.

Nothing here trusts the files: every field used is type-checked and a bad row is a RecordError
naming file:line. Not covered: a (cycle, phase) tag reused for two separate stretches of one
schedule's ledger (the check then compares against the last stretch); reads for a phase that
left no training row in the ledger are not checked (there is no row to place them by).
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale.records import RecordError, iter_jsonl, write_atomic
from whale.train.guesses import answer_key

LEDGER = "outcomes.jsonl"  # the schedule's OutcomeStore ledger
READS = "reads.jsonl"
PHASES_FILE = "phases.jsonl"
TRAINING_KINDS = ("weight_sample", "harness_score")
KINDS = (*TRAINING_KINDS, "eval", "validation")
PHASES = ("weight", "harness", "eval")
BOUNDARIES = ("start", "weight", "harness")

METRICS = ("format_compliance", "truncation_rate", "retrieval_accuracy", "answer_extraction",
           "accuracy", "n")  # fmt: skip
CURVE_COLUMNS = ("schedule", "cycle", "boundary", "training_rollouts", "ledger_rollouts",
                 "accuracy", "score", "n", "format_compliance", "truncation_rate",
                 "retrieval_accuracy", "answer_extraction", "validation_accuracy",
                 "validation_n", "harness", "adapter")  # fmt: skip
# Training-row metrics under their own names; the eval read that ended the phase as eval_*.
PHASE_COLUMNS = ("schedule", "cycle", "phase", "rollouts", "eval_rollouts",
                 "validation_rollouts", "cum_rollouts", *METRICS[:-1], "eval_accuracy",
                 "eval_score", "eval_n", "eval_top_answer_share")  # fmt: skip
SUMMARY_COLUMNS = ("schedule", "base", "final", "best", "best_validation", "rollouts_at_best",
                   "training_rollouts", "stagewise_final", "crossing_rollouts",
                   "crossing_fraction", "base_at_or_above_stagewise_final", "weight_phases",
                   "weight_epochs_median", "weight_epochs_max", "harness_phases",
                   "harness_iters_median", "harness_iters_max")  # fmt: skip
STAGEWISE = "stagewise"  # the schedule whose final eval accuracy the cost figure is against
BUDGET_STOP = "rollout budget"  # in `stopped` of a phase the budget cut short


# --- field checks: each returns a problem (str) or None -------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _metric_problem(row: Mapping[str, Any]) -> str | None:
    for key in ("correct", "format_ok", "truncated"):
        if not isinstance(row.get(key), bool):
            return f"{key!r} must be true/false, got {row.get(key)!r}"
    hit = row.get("retrieval_hit")  # absent or null: the task has no gold passages
    if hit is not None and not isinstance(hit, bool):
        return f"'retrieval_hit' must be true/false/null, got {hit!r}"
    return None


def _ledger_problem(row: Mapping[str, Any]) -> str | None:
    if not isinstance(row.get("schedule"), str):
        return f"'schedule' must be a string, got {row.get('schedule')!r}"
    if not _is_int(row.get("cycle")):
        return f"'cycle' must be an integer, got {row.get('cycle')!r}"
    if row.get("phase") not in PHASES:
        return f"'phase' must be one of {PHASES}, got {row.get('phase')!r}"
    if row.get("kind") not in KINDS:
        return f"'kind' must be one of {KINDS}, got {row.get('kind')!r}"
    return _metric_problem(row)


def _read_problem(row: Mapping[str, Any]) -> str | None:
    if not isinstance(row.get("schedule"), str):
        return f"'schedule' must be a string, got {row.get('schedule')!r}"
    if row.get("boundary") not in BOUNDARIES:
        return f"'boundary' must be one of {BOUNDARIES}, got {row.get('boundary')!r}"
    for key in ("cycle", "training_rollouts", "n"):
        v: Any = row.get(key)
        if not _is_int(v) or v < 0:
            return f"{key!r} must be an integer >= 0, got {v!r}"
    acc: Any = row.get("accuracy")
    if not _is_num(acc) or not 0.0 <= acc <= 1.0:
        return f"'accuracy' must be a number in [0, 1], got {acc!r}"
    if not _is_num(row.get("score")):
        return f"'score' must be a number, got {row.get('score')!r}"
    if not isinstance(row.get("harness"), str):
        return f"'harness' must be a string, got {row.get('harness')!r}"
    if row.get("adapter") is not None and not isinstance(row.get("adapter"), str):
        return f"'adapter' must be a string or null, got {row.get('adapter')!r}"
    val: Any = row.get("validation_accuracy")  # absent or null: no validation split
    if val is not None and (not _is_num(val) or not 0.0 <= val <= 1.0):
        return f"'validation_accuracy' must be a number in [0, 1] or null, got {val!r}"
    vn: Any = row.get("validation_n", 0)
    if not _is_int(vn) or vn < 0:
        return f"'validation_n' must be an integer >= 0, got {vn!r}"
    return None


def _phase_problem(row: Mapping[str, Any]) -> str | None:
    if not _is_int(row.get("cycle")):
        return f"'cycle' must be an integer, got {row.get('cycle')!r}"
    if row.get("phase") not in ("weight", "harness"):
        return f"'phase' must be 'weight' or 'harness', got {row.get('phase')!r}"
    ep: Any = row.get("epochs")
    if not _is_num(ep) or ep < 0:
        return f"'epochs' must be a number >= 0, got {ep!r}"
    st: Any = row.get("steps")
    if not _is_int(st) or st < 0:
        return f"'steps' must be an integer >= 0, got {st!r}"
    if not isinstance(row.get("stopped"), str):
        return f"'stopped' must be a string, got {row.get('stopped')!r}"
    return None


# --- capability metrics ----------------------------------------------------------------------


def _mean(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def capability_metrics(rows: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """WHALE's capability metrics of ledger rows (any kind; filter before calling).

    format_compliance, truncation_rate and accuracy are means of format_ok, truncated and
    correct (None when there are no rows). retrieval_accuracy is the mean of retrieval_hit over
    rows where it is set; answer_extraction is the mean of correct over rows whose gold was
    retrieved. Both are None, not 0, when no row has the field: a task without gold passages
    has no retrieval to be bad at. A row of the wrong shape is a RecordError."""
    rows = list(rows)
    for i, row in enumerate(rows):
        problem = _metric_problem(row)
        if problem:
            raise RecordError(f"row {i}: {problem}")
    judged = [r for r in rows if r.get("retrieval_hit") is not None]
    hits = [r for r in judged if r["retrieval_hit"]]
    return {
        "format_compliance": _mean([r["format_ok"] for r in rows]),
        "truncation_rate": _mean([r["truncated"] for r in rows]),
        "retrieval_accuracy": _mean([r["retrieval_hit"] for r in judged]),
        "answer_extraction": _mean([r["correct"] for r in hits]),
        "accuracy": _mean([r["correct"] for r in rows]),
        "n": len(rows),
    }


def top_answer_share(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The share of `rows` whose answer is the most common one (compared as
    `whale.train.guesses.answer_key` does; no answer counts as none): 1.0 is a solver that gives
    every question one answer, the weight phase's collapse onto a constant. None: no rows."""
    if not rows:
        return None
    counts = Counter(answer_key(r.get("answer")) for r in rows if isinstance(r.get("answer"), str))
    counts.pop(None, None)
    return max(counts.values(), default=0) / len(rows)


# --- loading a run ---------------------------------------------------------------------------


@dataclass
class _Schedule:
    """One schedule folder, validated: ledger and reads as (line number, row)."""

    name: str
    dir: Path
    ledger: list[tuple[int, dict[str, Any]]]
    reads: list[tuple[int, dict[str, Any]]]
    phases: list[tuple[int, dict[str, Any]]]


def _load_rows(
    path: Path, name: str | None, problem_of: Callable[[Mapping[str, Any]], str | None]
) -> list[tuple[int, dict[str, Any]]]:
    """Rows of `path`, checked; `name`: the schedule every row must name (None: not checked)."""
    rows = iter_jsonl(path)
    for n, row in rows:
        problem = problem_of(row)
        if problem is None and name is not None and row["schedule"] != name:
            problem = f"row of schedule {row['schedule']!r} in the folder of {name!r}"
        if problem:
            raise RecordError(f"{path}:{n}: {problem}")
    return rows


def _load_schedule(d: Path) -> _Schedule:
    return _Schedule(
        name=d.name, dir=d,
        ledger=_load_rows(d / LEDGER, d.name, _ledger_problem),
        reads=_load_rows(d / READS, d.name, _read_problem),
        phases=_load_rows(d / PHASES_FILE, None, _phase_problem),
    )  # fmt: skip


def _load(out: Path) -> list[_Schedule]:
    """Every schedule folder of `out` (one holding a ledger or reads), sorted by name."""
    if not out.is_dir():
        raise RecordError(f"{out}: not a folder")
    dirs = sorted(d for d in out.iterdir() if (d / LEDGER).is_file() or (d / READS).is_file())
    if not dirs:
        raise RecordError(f"{out}: no schedule folder (none holds {LEDGER} or {READS})")
    return [_load_schedule(d) for d in dirs]


def count_rollouts(out_schedule_dir: Path) -> dict[str, int]:
    """Ledger rows of one schedule folder per kind, plus "training" (weight_sample +
    harness_score): what the reads' training_rollouts must add up to."""
    s = _load_schedule(out_schedule_dir)
    counts = dict.fromkeys(KINDS, 0)
    for _, row in s.ledger:
        counts[row["kind"]] += 1
    counts["training"] = sum(counts[k] for k in TRAINING_KINDS)
    return counts


def _training_at_end(s: _Schedule) -> dict[tuple[int, str], int]:
    """(cycle, phase) -> training rows in the ledger up to that phase's last training row."""
    at_end: dict[tuple[int, str], int] = {}
    total = 0
    for _, row in s.ledger:
        if row["kind"] in TRAINING_KINDS:
            total += 1
            at_end[(row["cycle"], row["phase"])] = total
    return at_end


def _ledger_rollouts(s: _Schedule, read: Mapping[str, Any], at_end: dict[tuple[int, str], int]
                     ) -> int | None:  # fmt: skip
    """Training rollouts the ledger says were spent before `read`; None where it cannot say."""
    if read["boundary"] == "start":  # before this cycle's first phase
        return sum(1 for _, r in s.ledger
                   if r["kind"] in TRAINING_KINDS and r["cycle"] < read["cycle"])  # fmt: skip
    return at_end.get((read["cycle"], read["boundary"]))


# --- tables ----------------------------------------------------------------------------------


def _curve_rows(schedules: list[_Schedule]) -> list[dict[str, Any]]:
    rows = []
    for s in schedules:
        at_end = _training_at_end(s)
        mine: list[dict[str, Any]] = []
        for n, read in s.reads:
            counted = _ledger_rollouts(s, read, at_end)
            if counted is not None and counted != read["training_rollouts"]:
                raise RecordError(
                    f"{s.dir / READS}:{n}: training_rollouts {read['training_rollouts']} but the "
                    f"ledger holds {counted} weight_sample + harness_score rows before this read"
                )
            mine.append({c: read.get(c) for c in CURVE_COLUMNS} | {"ledger_rollouts": counted})
        rows += sorted(mine, key=lambda r: r["training_rollouts"])  # stable: file order on ties
    return rows


def curve_rows(out: Path) -> list[dict[str, Any]]:
    """The eval reads of every schedule (CURVE_COLUMNS), ordered by schedule and then by
    training_rollouts; `ledger_rollouts` is the ledger's own count before each read (None where
    the ledger cannot place the read). A read that disagrees with the ledger is a RecordError."""
    return _curve_rows(_load(out))


_PHASE_RANK = {"weight": 1, "harness": 2}


def _phase_order(group: tuple[tuple[int, str], Any]) -> tuple[int, int]:
    """(cycle, rank): the start read ("eval" of cycle 0) first, then weight, harness, and reads
    tagged "eval" in a later cycle after its phases; another phase last (sorted stably: in
    ledger order)."""
    (cycle, phase), _ = group
    if phase == "eval":
        return cycle, 0 if cycle == 0 else 3
    return cycle, _PHASE_RANK.get(phase, 4)


def _phase_rows(schedules: list[_Schedule]) -> list[dict[str, Any]]:
    table = []
    for s in schedules:
        groups: dict[tuple[int, str], list[dict[str, Any]]] = {}  # insertion = ledger order
        for _, row in s.ledger:
            groups.setdefault((row["cycle"], row["phase"]), []).append(row)
        at_end = _training_at_end(s)
        last_read = {(r["cycle"], r["boundary"]): r for _, r in s.reads}
        cum = 0
        # In the order a run makes them (the start read, then each cycle's weight and harness
        # phases): a stagewise copied from the sweep (whale.schedule.sweep_copy) has its
        # training rows first and its reads after them.
        for (cycle, phase), rows in sorted(groups.items(), key=_phase_order):
            training = [r for r in rows if r["kind"] in TRAINING_KINDS]
            cum = at_end.get((cycle, phase), cum)
            metrics = capability_metrics(training)
            del metrics["n"]
            read = last_read.get((cycle, phase))
            table.append({
                "schedule": s.name, "cycle": cycle, "phase": phase,
                "rollouts": len(training),
                "eval_rollouts": sum(r["kind"] == "eval" for r in rows),
                "validation_rollouts": sum(r["kind"] == "validation" for r in rows),
                "cum_rollouts": cum, **metrics,
                "eval_accuracy": read["accuracy"] if read else None,
                "eval_score": read["score"] if read else None,
                "eval_n": read["n"] if read else None,
                "eval_top_answer_share": top_answer_share([r for r in rows
                                                           if r["kind"] == "eval"]),
            })  # fmt: skip
    return table


def phase_table(out: Path) -> list[dict[str, Any]]:
    """One row per (schedule, cycle, phase) tagged in the ledgers (PHASE_COLUMNS), in the
    order a run makes them (by cycle: the start read, weight, harness): training rollouts of
    the phase, eval rows tagged with it (eval_rollouts), cumulative training rollouts at its
    end, capability metrics of its training rows, and the eval read that ended it (eval_*;
    None when there is none). Not covered: a phase with no ledger row."""
    return _phase_rows(_load(out))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def phase_lengths(phases: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and maximum length of the weight phases (epochs) and harness phases
    (iterations) among `phases` (rows of phases.jsonl), with how many of each were counted. A
    phase the rollout budget cut short is left out: its length was not chosen (by a patience
    rule, or as E / I). None where no phase of the kind is counted."""
    rows = [p for p in phases if BUDGET_STOP not in p["stopped"]]
    w = [float(p["epochs"]) for p in rows if p["phase"] == "weight"]
    h = [float(p["steps"]) for p in rows if p["phase"] == "harness"]
    return {"weight_phases": len(w), "weight_epochs_median": _median(w),
            "weight_epochs_max": max(w, default=None), "harness_phases": len(h),
            "harness_iters_median": _median(h),
            "harness_iters_max": max(h, default=None)}  # fmt: skip


# Accuracies are k/n: a difference smaller than this is float noise, and "equal" is equal.
_TIE = 1e-12


def crossing(reads: Sequence[Mapping[str, Any]], target: float) -> int | None:
    """Training rollouts of the first read (in curve order) after some training (training
    rollouts > 0) whose eval accuracy passes `target` (is strictly above it; equal does not
    count, as the paper's figure is where WHALE *exceeds* stagewise's final); None when none
    does. A start read never counts: no training made it (see `at_or_above`)."""
    for r in reads:
        if r["training_rollouts"] > 0 and r["accuracy"] > target + _TIE:
            return int(r["training_rollouts"])
    return None


def at_or_above(accuracy: float | None, target: float | None) -> bool | None:
    """Whether `accuracy` (a schedule's base read) is already at or above `target`
    (stagewise's final); None when either is missing."""
    if accuracy is None or target is None:
        return None
    return accuracy >= target - _TIE


def _summary(schedules: list[_Schedule]) -> list[dict[str, Any]]:
    curves = _curve_rows(schedules)
    by_name = {s.name: [r for r in curves if r["schedule"] == s.name] for s in schedules}
    trained = {s.name: sum(1 for _, r in s.ledger if r["kind"] in TRAINING_KINDS)
               for s in schedules}  # fmt: skip
    sw = by_name.get(STAGEWISE) or []
    sw_final = sw[-1]["accuracy"] if sw else None
    out = []
    for s in schedules:
        reads = by_name[s.name]
        start = [r for r in reads if r["boundary"] == "start"]
        judged = [r for r in reads if r.get("validation_accuracy") is not None]
        # The reported best point: by validation accuracy (first of equal bests: the cheaper).
        best = max(judged, key=lambda r: r["validation_accuracy"], default=None)
        at = crossing(reads, sw_final) if sw_final is not None else None
        total = trained.get(STAGEWISE, 0)
        base = start[0]["accuracy"] if start else None
        out.append({
            "schedule": s.name,
            "base": base,
            "final": reads[-1]["accuracy"] if reads else None,
            "best": best["accuracy"] if best else None,
            "best_validation": best["validation_accuracy"] if best else None,
            "rollouts_at_best": best["training_rollouts"] if best else None,
            "training_rollouts": trained[s.name],
            "stagewise_final": sw_final,
            "crossing_rollouts": at,
            "crossing_fraction": at / total if at is not None and total else None,
            "base_at_or_above_stagewise_final": at_or_above(base, sw_final),
            **phase_lengths(r for _, r in s.phases),
        })  # fmt: skip
    return out


def schedule_summary(out: Path) -> list[dict[str, Any]]:
    """One row per schedule (SUMMARY_COLUMNS): base, final and best eval accuracy (best: the
    read of highest validation accuracy, and that accuracy; None without a validation split),
    training rollouts, the stagewise crossing (`crossing_rollouts`: training rollouts at the
    first read after some training whose eval accuracy passes stagewise's final one, see
    `crossing`; `crossing_fraction`: that over stagewise's training rollouts; None without a
    stagewise schedule, or when never passed), `base_at_or_above_stagewise_final` (the start
    read already at or above it, so that a crossing says little; None without a stagewise
    schedule or a start read) and the phase lengths (`phase_lengths`)."""
    return _summary(_load(out))


def markdown_table(out: Path) -> str:
    """A Markdown table for the docs, one row per schedule: base eval accuracy (the "start"
    read), final (the read after the most training rollouts), the reported best point (the
    eval accuracy of the read of highest validation accuracy, that validation accuracy and the
    training rollouts spent before it), training rollouts used (ledger weight_sample +
    harness_score rows, including any spent after the last read), where the schedule first
    passes stagewise's final eval accuracy after some training (fraction of stagewise's training
    rollouts, and the rollouts; "never"; "base >= it" added where the start read already was at
    or above it), and the phase lengths: median / max (phases counted). "-" where there is
    nothing to show."""

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    def span(med: Any, top: Any, n: int) -> str:
        return "-" if not n else f"{med:g} / {top:g} ({n})"

    lines = [
        "| schedule | base eval acc | final eval acc | eval acc at best val | best val acc "
        "| rollouts at best | training rollouts | passes stagewise final at "
        "| weight phase epochs med / max (n) | harness phase iters med / max (n) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in _summary(_load(out)):
        if r["stagewise_final"] is None:
            cross = "-"
        elif r["crossing_rollouts"] is None:
            cross = "never"
        else:
            cross = f"{fmt(r['crossing_fraction'])} ({r['crossing_rollouts']})"
        if r["base_at_or_above_stagewise_final"]:
            cross += "; base >= it"
        cells = [r["schedule"], *(fmt(r[k]) for k in ("base", "final", "best",
                 "best_validation")), fmt(r["rollouts_at_best"]), fmt(r["training_rollouts"]),
                 cross, span(r["weight_epochs_median"], r["weight_epochs_max"],
                             r["weight_phases"]),
                 span(r["harness_iters_median"], r["harness_iters_max"],
                      r["harness_phases"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- files -----------------------------------------------------------------------------------


def _csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for row in rows:  # None -> empty cell
        w.writerow({c: "" if row.get(c) is None else row[c] for c in columns})
    return buf.getvalue()


def _plot(rows: list[dict[str, Any]], path: Path, task: str | None) -> None:
    # The Agg canvas directly, not pyplot: no global backend switch, no figure registry.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name in dict.fromkeys(r["schedule"] for r in rows):
        mine = [r for r in rows if r["schedule"] == name]
        ax.plot([r["training_rollouts"] for r in mine], [r["accuracy"] for r in mine],
                marker="o", label=name)  # fmt: skip
    if rows:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no eval reads", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("training rollouts (weight_sample + harness_score, cumulative)")
    ax.set_ylabel("eval accuracy")
    title = "eval accuracy vs training rollouts"
    ax.set_title(f"{task}: {title}" if task else title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_atomic(path, buf.getvalue())


def write_curves(out: Path, task: str | None = None) -> tuple[Path, Path, Path]:
    """Write OUT/curves.csv (curve_rows), OUT/phases.csv (phase_table) and OUT/curves.png
    (eval accuracy against training rollouts, one line per schedule; `task` goes in the title),
    each atomically. Raises RecordError before writing anything if a file is bad."""
    schedules = _load(out)
    curves, phases = _curve_rows(schedules), _phase_rows(schedules)
    paths = (out / "curves.csv", out / "phases.csv", out / "curves.png")
    write_atomic(paths[0], _csv_text(curves, CURVE_COLUMNS))
    write_atomic(paths[1], _csv_text(phases, PHASE_COLUMNS))
    _plot(curves, paths[2], task)
    return paths
