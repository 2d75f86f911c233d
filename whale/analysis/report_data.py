"""What `whale report` reads from a run directory, as plain data (no HTML here: see report.py).

A run directory is recognised by what it holds, not by a name: cotrain (schedule folders with
`outcomes.jsonl` / `reads.jsonl`), train-proposer (`teacher/`, `sft/`, `grpo/`, `evaluate/`),
search (`archive/`), adapt (`round_NN/`), a single eval (`harness.py` + `outcomes.jsonl`), else
"unknown". Every file is hostile: a missing file, a line that is not JSON, a field of the wrong
type becomes a note on the section it belongs to, never an exception, so a run that was killed
halfway still gives a report of what it had written. Lineages, curves, tables and split reads
are collected from whatever of them exists. Every read goes through
`whale.records.read_untrusted` with the run directory as root: a symlink out of the run, a FIFO
or device, a file over MAX_FILE_BYTES (records) or MAX_SOURCE_BYTES (sources, diffs) is a note
("not read"), never quoted and never waited on. Non-finite numbers (NaN, Infinity, 1e300 as a
time) are treated as absent; round folders count only with ASCII digits ("round_2²" is not a
number); a config or summary nested too deep for the parser is a note.

The lineage builders (archive, round folders) are in report_lineage.py, the answer the page
opens with in report_lead.py; the types they fill (Node, Lineage, Curve, Table, Lead, RunData)
and the readers they share are here.

Not covered: the meaning of fields beyond the few each section shows (the report quotes the
files, it does not re-check the run's accounting; `whale.schedule.curves` does that for
cotrain, and its RecordError is shown as a note); runs nested more than one level deep other
than the layouts named above.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale.records import UnsafeRead, read_untrusted

MAX_FILE_BYTES = 64 * 2**20  # one JSON / JSONL / TOML record file read at most (else a note)
MAX_SOURCE_BYTES = 4 * 2**20  # one harness source or candidate diff read at most
MAX_FLAT_DEPTH = 32  # config / summary tables stop nesting here (deeper shows as JSON text)
MAX_DIFF_CHARS = 20_000  # one candidate's diff shown in the report at most (a note says so)
MAX_ROWS = 200  # rows of one table at most
MAX_HYPOTHESIS_CHARS = 2_000  # one hypothesis / explanation / decision reason shown at most


@dataclass
class Node:
    """One candidate of a lineage; `parent` is another node's `id` (None for a root)."""

    id: str
    parent: str | None
    hash: str | None
    score: float | None
    valid: bool
    reason: str
    label: str  # "round 2", "iteration 1", "seed"
    kept: bool = False
    diff: str | None = None  # unified diff against the parent's source; None when unknown
    hypothesis: str | None = None  # what the proposal said it changes (archive meta; adapt: kept)
    why: str | None = None  # why Select kept it (adapt's decision.json)


@dataclass
class Lineage:
    title: str
    nodes: list[Node]
    mark: str = "kept"  # what Node.kept means here: "kept" by Select, or "best" in an archive


@dataclass
class Curve:
    title: str
    xlabel: str
    ylabel: str
    series: dict[str, list[tuple[float, float]]]


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass(frozen=True)
class Reading:
    """One accuracy on a held-out split: `k` correct of `n` when the records give both, else
    the accuracy (and `n`) as recorded. All None: nothing recorded."""

    k: int | None = None
    n: int | None = None
    accuracy: float | None = None


@dataclass
class Line:
    """One line of the answer: `label: step_1 → step_2 …` (each step a name and a Reading),
    then `extra` facts (plain text: a cost, a stop reason)."""

    label: str
    steps: list[tuple[str, Reading]]
    extra: list[str] = field(default_factory=list)


@dataclass
class Change:
    """An edit the run kept: what it changed (a diff) and what its proposer said it would."""

    title: str
    diff: str | None
    hypothesis: str | None
    why: str | None = None
    proposed: bool = True  # False: a sum of edits (no proposal, so no hypothesis to miss)


@dataclass
class Lead:
    """The answer the page opens with (built per run kind by report_lead.py): what was read,
    its lines, the kept edits, and which of RunData.curves to draw under them."""

    what: str  # the reading's description: "held-out eval split, read once at the end"
    lines: list[Line] = field(default_factory=list)
    context: list[tuple[str, str]] = field(default_factory=list)  # task, solver, ...
    changes: list[Change] = field(default_factory=list)
    changes_title: str = "What the kept edits changed"
    curves: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class RunData:
    run_dir: Path
    kind: str
    config: list[tuple[str, str]] = field(default_factory=list)
    summary: list[tuple[str, str]] = field(default_factory=list)
    lineages: list[Lineage] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    metrics: list[Table] = field(default_factory=list)
    compliance: list[Table] = field(default_factory=list)
    reads: Table | None = None
    lead: Lead | None = None
    summary_json: dict[str, Any] | None = None  # summary.json as read (for the lead)
    notes: dict[str, list[str]] = field(default_factory=dict)

    def note(self, section: str, text: str) -> None:
        self.notes.setdefault(section, []).append(text)


# --- tolerant readers ------------------------------------------------------------------------


def read_run_file(path: Path, data: RunData, section: str, limit: int = MAX_FILE_BYTES, *,
                  missing: bool = True) -> bytes | None:  # fmt: skip
    """The bytes of `path` read with `read_untrusted` (root: the run directory), or None with
    a note: missing (only when `missing`), a link out of the run, not a regular file, over
    `limit` bytes, or any other OSError."""
    if not os.path.lexists(path):
        if missing:
            data.note(section, f"{rel_path(path, data)}: missing")
        return None
    try:
        return read_untrusted(path, data.run_dir, limit)
    except UnsafeRead as e:
        why = str(e).removeprefix(f"{path}: ")
        data.note(section, f"{rel_path(path, data)}: {why}")
    except OSError as e:
        data.note(section, f"{rel_path(path, data)}: unreadable ({type(e).__name__})")
    return None


def unsafe_reason(path: Path, root: Path, limit: int = MAX_FILE_BYTES) -> str | None:
    """Why `read_untrusted` would refuse `path` (None: it would read it, or `path` is absent),
    for a module that reads run files with its own reader (`whale.schedule.curves`): the
    caller checks first and does not call it when a reason comes back. Not covered: a file
    swapped between this check and that module's read (the check is on paths, not on an open
    descriptor as `read_untrusted` is)."""
    if not os.path.lexists(path):
        return None
    try:
        real = path.resolve(strict=True)
        inside = real.is_relative_to(root.resolve(strict=True))
        st = os.stat(real)
    except (OSError, RuntimeError):
        return "cannot resolve"
    if not inside:
        return "a link out of the run directory"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size > limit:
        return f"{st.st_size} bytes, over the limit of {limit}"
    return None


def json_file(path: Path, data: RunData, section: str) -> Any:
    """The JSON in `path`, or None with a note (missing, refused, unreadable, not JSON)."""
    raw = read_run_file(path, data, section)
    if raw is None:
        return None
    try:
        return json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as e:
        data.note(section, f"{rel_path(path, data)}: unreadable ({type(e).__name__})")
    return None


def jsonl_rows(path: Path, data: RunData, section: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; other lines are skipped and counted in a note."""
    raw = read_run_file(path, data, section)
    if raw is None:
        return []
    rows, bad = [], 0
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            rec = None
        if isinstance(rec, dict):
            rows.append(rec)
        else:
            bad += 1
    if bad:
        data.note(section, f"{rel_path(path, data)}: {bad} line(s) not a JSON object, skipped")
    return rows


def rel_path(path: Path, data: RunData) -> str:
    try:
        return str(path.relative_to(data.run_dir))
    except ValueError:
        return str(path)


def text_file(path: Path, data: RunData, section: str = "lineage") -> str | None:
    """A source or diff of the run (None when absent; refused reads are a note)."""
    raw = read_run_file(path, data, section, MAX_SOURCE_BYTES, missing=False)
    return None if raw is None else raw.decode("utf-8", errors="replace")


def num(v: Any) -> float | None:
    """A finite number, else None (booleans, NaN, infinities and ints too big for a float
    are not numbers the report can place)."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def round_number(name: str) -> int | None:
    """N of a "round_N" folder: ASCII digits only (str.isdigit takes "²"), at most 9 of them."""
    m = re.fullmatch(r"round_([0-9]{1,9})", name)
    return int(m.group(1)) if m else None


def str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def diff_text(parent: str | None, child: str | None) -> str | None:
    if parent is None or child is None:
        return None
    return "".join(difflib.unified_diff(parent.splitlines(keepends=True),
                                        child.splitlines(keepends=True), "parent.py",
                                        "candidate.py"))  # fmt: skip


def cap_text(text: str | None, limit: int = MAX_HYPOTHESIS_CHARS) -> str | None:
    """`text` cut to `limit` characters, with a note of how many more there were."""
    if text is not None and len(text) > limit:
        return text[:limit] + f" ... ({len(text) - limit} more characters)"
    return text


def human(v: float) -> str:
    """A float as a person reads it: 3 decimals below 1, 2 below 1000, none above (and 3
    significant digits past 1e15), trailing zeros dropped; below 0.001 in exponent form. Never
    more than 4 decimals, so `0.09333333333333334` shows as 0.093."""
    a = abs(v)
    if not math.isfinite(v) or v == 0:
        return str(v) if v != 0 else "0"
    if a < 1e-3:
        return f"{v:.1e}"
    if a >= 1e15:
        return f"{v:.3g}"
    text = f"{v:.3f}" if a < 1 else f"{v:.2f}" if a < 1000 else f"{v:.0f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def cap_diff(text: str | None) -> str | None:
    if text is not None and len(text) > MAX_DIFF_CHARS:
        return text[:MAX_DIFF_CHARS] + f"\n... ({len(text) - MAX_DIFF_CHARS} more characters)\n"
    return text


# --- run kind and config ---------------------------------------------------------------------


def schedule_dirs(run_dir: Path) -> list[Path]:
    marks = ("reads.jsonl", "phases.jsonl")  # a cotrain schedule folder writes these
    return sorted(
        d for d in run_dir.iterdir() if d.is_dir() and any((d / m).is_file() for m in marks)
    )


def run_kind(run_dir: Path) -> str:
    if not run_dir.is_dir():
        return "unknown"
    if schedule_dirs(run_dir):
        return "cotrain"
    if any((run_dir / d).is_dir() for d in ("teacher", "grpo", "sft", "contexts")):
        return "train-proposer"
    if (run_dir / "archive").is_dir():
        return "search"
    if any(run_dir.glob("round_[0-9]*")):
        return "adapt"
    if (run_dir / "harness.py").is_file() and (run_dir / "outcomes.jsonl").is_file():
        return "eval"
    return "unknown"


# any run writes one of these at its top
RECORD_NAMES = ("config.toml", "summary.json", "seed.json", "outcomes.jsonl", "harness.py",
                "eval_read.json", "harnesses", "sessions")  # fmt: skip


def has_run_records(run_dir: Path) -> bool:
    """Whether `run_dir` holds anything a run writes: a known run kind, or one of
    RECORD_NAMES at its top (a run killed before its first round still shows, with notes).
    `whale report` refuses a folder without any, rather than writing an empty "unknown" page."""
    if not run_dir.is_dir():
        return False
    return run_kind(run_dir) != "unknown" or any(os.path.lexists(run_dir / n) for n in RECORD_NAMES)


def _flat(d: Any, prefix: str = "", depth: int = 0, *,
          rounded: bool = False) -> list[tuple[str, str]]:  # fmt: skip
    """(dotted key, shown value) of every leaf of `d`; `rounded`: floats as `human` shows them
    (the summary; the config keeps its values exact, as set)."""
    out: list[tuple[str, str]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            if isinstance(v, dict) and depth < MAX_FLAT_DEPTH:
                out += _flat(v, f"{prefix}{k}.", depth + 1, rounded=rounded)
            else:
                out.append((f"{prefix}{k}", _short(v, rounded)))
    return out


def _short(v: Any, rounded: bool = False) -> str:
    if rounded and isinstance(v, float):
        return human(v)
    try:
        s = json.dumps(v, default=str) if not isinstance(v, str) else v
    except (ValueError, RecursionError):
        s = f"({type(v).__name__} nested too deep to show)"
    return s if len(s) <= 160 else s[:157] + "..."


def load_config(data: RunData) -> None:
    raw = read_run_file(data.run_dir / "config.toml", data, "config")
    if raw is not None:
        import tomllib

        try:
            data.config = _flat(tomllib.loads(raw.decode("utf-8", errors="replace")))
        except (ValueError, RecursionError) as e:
            data.note("config", f"config.toml: unreadable ({type(e).__name__})")
    summary = data.run_dir / "summary.json"
    if os.path.lexists(summary):
        s = json_file(summary, data, "config")
        if isinstance(s, dict):
            data.summary_json = s
            data.summary = [(k, v) for k, v in _flat(s, rounded=True)
                            if not v.startswith(("[", "{"))][:40]  # fmt: skip


# --- ledgers and reads -----------------------------------------------------------------------


def ledger_metrics(path: Path, data: RunData, title: str, group_keys: tuple[str, ...],
                   ledger: list[dict[str, Any]] | None = None) -> Table:  # fmt: skip
    """Capability metrics of ledger rows grouped by `group_keys` (rows of the wrong shape for
    capability_metrics are skipped with a note); `ledger`: its rows, when the caller read it
    already (else read from `path`)."""
    from whale.records import RecordError
    from whale.schedule.curves import capability_metrics

    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    bad = 0
    for row in ledger if ledger is not None else jsonl_rows(path, data, "metrics"):
        if any(not isinstance(row.get(k), bool) for k in ("correct", "format_ok", "truncated")):
            bad += 1
            continue
        groups.setdefault(tuple(str(row.get(k, "-")) for k in group_keys), []).append(row)
    if bad:
        data.note("metrics", f"{rel_path(path, data)}: {bad} row(s) without correct/format_ok/"
                             "truncated booleans, not counted")  # fmt: skip
    cols = list(group_keys) + ["n", "accuracy", "format_compliance", "truncation_rate",
                               "retrieval_accuracy", "answer_extraction"]  # fmt: skip
    rows = []
    for key, grp in groups.items():
        try:
            m = capability_metrics(grp)
        except RecordError as e:
            data.note("metrics", f"{rel_path(path, data)} {key}: {e}")
            continue
        rows.append([*key, *(m[c] for c in cols[len(group_keys) :])])
    return Table(title, cols, rows[:MAX_ROWS])


def split_reads(data: RunData) -> None:
    """Every record of a split read: eval_read.json files (adapt, search, train-proposer) and
    reads.jsonl rows (cotrain), with when, what for and how many questions."""
    rows: list[list[Any]] = []
    for path in sorted(data.run_dir.rglob("eval_read.json")):
        r = json_file(path, data, "reads")
        if isinstance(r, dict):
            hs = r.get("harnesses")
            rows.append([rel_path(path, data), "eval", str(r.get("at", "-")),
                         _short(r.get("purpose")), len(hs) if isinstance(hs, list) else "-",
                         r.get("n", "-"), r.get("resumed", 0)])  # fmt: skip
    for path in sorted(data.run_dir.glob("*/reads.jsonl")):
        for r in jsonl_rows(path, data, "reads"):
            at = num(r.get("at"))
            when = _iso(at) if at is not None else "-"
            rows.append([rel_path(path, data), "eval", when,
                         f"cycle {r.get('cycle')} after {r.get('boundary')} "
                         f"({r.get('training_rollouts')} training rollouts)",
                         1, r.get("n", "-"), "-"])  # fmt: skip
    if not rows:
        data.note("reads", "no record of a split read (no eval_read.json, no reads.jsonl)")
    data.reads = Table("split reads", ["record", "split", "at", "purpose", "harnesses", "n",
                                       "resumed"], rows[:MAX_ROWS])  # fmt: skip


def _iso(t: float) -> str:
    """UTC time of a POSIX timestamp; a time the C library cannot place shows as the number."""
    import time

    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + "Z"
    except (OverflowError, OSError, ValueError):
        return f"{t!r} (not a time)"
