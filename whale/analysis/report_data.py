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

Not covered: the meaning of fields beyond the few each section shows (the report quotes the
files, it does not re-check the run's accounting; `whale.analysis.curves` does that for
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
            data.note(section, f"{_rel(path, data)}: missing")
        return None
    try:
        return read_untrusted(path, data.run_dir, limit)
    except UnsafeRead as e:
        why = str(e).removeprefix(f"{path}: ")
        data.note(section, f"{_rel(path, data)}: {why}")
    except OSError as e:
        data.note(section, f"{_rel(path, data)}: unreadable ({type(e).__name__})")
    return None


def unsafe_reason(path: Path, root: Path, limit: int = MAX_FILE_BYTES) -> str | None:
    """Why `read_untrusted` would refuse `path` (None: it would read it, or `path` is absent),
    for a module that reads run files with its own reader (`whale.analysis.curves`): the
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
        data.note(section, f"{_rel(path, data)}: unreadable ({type(e).__name__})")
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
        data.note(section, f"{_rel(path, data)}: {bad} line(s) not a JSON object, skipped")
    return rows


def _rel(path: Path, data: RunData) -> str:
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


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def diff_text(parent: str | None, child: str | None) -> str | None:
    if parent is None or child is None:
        return None
    return "".join(difflib.unified_diff(parent.splitlines(keepends=True),
                                        child.splitlines(keepends=True), "parent.py",
                                        "candidate.py"))  # fmt: skip


def _cap(text: str | None) -> str | None:
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


def _flat(d: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            if isinstance(v, dict) and depth < MAX_FLAT_DEPTH:
                out += _flat(v, f"{prefix}{k}.", depth + 1)
            else:
                out.append((f"{prefix}{k}", _short(v)))
    return out


def _short(v: Any) -> str:
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
            data.summary = [(k, v) for k, v in _flat(s)
                            if not v.startswith(("[", "{"))][:40]  # fmt: skip


# --- lineages --------------------------------------------------------------------------------


def _unique(nid: str, used: set[str], pos: int) -> str:
    """`nid`, or `nid#pos` (then `nid#pos.k`) when another node of the lineage already has it:
    two nodes sharing an id would make the parent links ambiguous (and the tree branch on
    every shared id)."""
    out, k = nid, 0
    if out in used:
        out = f"{nid}#{pos}"
    while out in used:
        k += 1
        out = f"{nid}#{pos}.{k}"
    used.add(out)
    return out


def archive_lineage(root: Path, title: str, data: RunData) -> Lineage:
    """A Meta-Harness archive (search, or the one archive of a cotrain's harness phases). A
    node's score is the candidate's accuracy (what the archive ranks on; `score` in records of
    older whales). The node marked best is the archive's best under the solver that scored its
    latest candidate (scores under other weights do not compare), ties to the earlier one.
    A parent_id naming no candidate stays as recorded (the tree shows the node as unreachable);
    a repeated id gets a `#pos` suffix and parent links go to its first holder."""
    metas: list[dict[str, Any]] = []
    folders = [p for p in root.glob("c[0-9]*") if p.is_dir()]
    for folder in sorted(folders, key=lambda p: (len(p.name), p.name)):  # c10000 after c9900
        m = json_file(folder / "meta.json", data, "lineage")
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            metas.append(m)
    if not metas and (root / "summary.jsonl").is_file():
        metas = [m for m in jsonl_rows(root / "summary.jsonl", data, "lineage")
                 if isinstance(m.get("id"), str)]  # fmt: skip
    if not metas:
        data.note("lineage", f"{_rel(root, data)}: no candidate")
    ids = {m["id"] for m in metas}
    best = _archive_best(metas)
    nodes: list[Node] = []
    used: set[str] = set()
    for pos, m in enumerate(metas):
        parent = _str(m.get("parent_id"))
        diff = None
        if parent is not None and parent in ids:
            diff = diff_text(text_file(root / parent / "harness.py", data),
                             text_file(root / m["id"] / "harness.py", data))  # fmt: skip
        nodes.append(Node(
            id=_unique(m["id"], used, pos), parent=parent, hash=_str(m.get("hash")),
            score=_j(m), valid=m.get("valid") is True,
            reason=str(m.get("reason") or ""),
            label=_archive_label(m),
            kept=best is m, diff=_cap(diff),
        ))  # fmt: skip
    return Lineage(title, nodes, mark="best")


def _archive_label(m: dict[str, Any]) -> str:
    """"seed"; "start, iteration J" (a later harness phase's start harness) and "rescore,
    iteration J" (an earlier candidate scored again under new weights), which are no proposals;
    "iteration J" for the agent's candidates."""
    it, origin = m.get("iteration"), m.get("origin")
    if it == 0 and (origin == "start" or m.get("parent_id") is None):
        return "seed"
    return f"{origin}, iteration {it}" if origin in ("start", "rescore") else f"iteration {it}"


def _j(m: dict[str, Any]) -> float | None:
    """A candidate's accuracy (the verifier's; older records: `score`), when it was ranked."""
    return num(_first(m, "accuracy", "score")) if m.get("valid") is True else None


def _archive_best(metas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best of `metas` (in the order made) under the solver of the latest scored one."""
    scored = [m for m in metas if _j(m) is not None]
    if not scored:
        return None
    solver = scored[-1].get("solver")
    same = [m for m in scored if m.get("solver") is None or m.get("solver") == solver]
    return max(same, key=lambda m: _j(m) or 0.0)  # max keeps the first of equals


def rounds_lineage(root: Path, title: str, harness_dirs: list[Path], data: RunData,
                   seed_hash: str | None = None) -> Lineage:  # fmt: skip
    """round_NN/ folders of adapt (or of a ratchet evaluation): candidates.json, decision.json,
    candidate_i.diff; sources looked up as <hash>.py in `harness_dirs` when a diff is absent.
    Node ids are r<round>.<index>, made unique with a `#pos` suffix when repeated."""

    def source(h: str | None) -> str | None:
        for d in harness_dirs:
            if h and (text := text_file(d / f"{h}.py", data)) is not None:
                return text
        return None

    by_hash: dict[str, str] = {}  # harness hash -> id of the node that first produced it
    nodes: list[Node] = []
    used: set[str] = set()
    rounds = sorted(p for p in root.glob("round_[0-9]*") if p.is_dir())
    for rd in rounds:
        t = round_number(rd.name)
        cands = json_file(rd / "candidates.json", data, "lineage")
        decision = json_file(rd / "decision.json", data, "lineage") if os.path.lexists(
            rd / "decision.json") else None  # fmt: skip
        if not isinstance(cands, list):
            continue
        chosen = decision.get("chosen") if isinstance(decision, dict) else None
        for pos, c in enumerate(cands):
            if not isinstance(c, dict):
                data.note("lineage", f"{_rel(rd, data)}/candidates.json: entry {pos} not an object")
                continue
            ph = _str(c.get("parent_hash"))
            if ph and ph not in by_hash:  # the seed (or a parent made outside these rounds)
                root_id = "seed" if ph == seed_hash or not by_hash else f"h:{ph}"
                root_id = _unique(root_id, used, pos)
                j = _first(decision, "parent_accuracy", "parent_score") if isinstance(
                    decision, dict) and decision.get("parent_hash") == ph else None  # fmt: skip
                nodes.append(Node(root_id, None, ph, num(j), True, "", "seed"))
                by_hash[ph] = root_id
            idx = c.get("index", pos)
            nid = _unique(f"r{rd.name.removeprefix('round_') if t is None else t}.{idx}", used,
                          pos)  # fmt: skip
            h = _str(c.get("hash"))
            diff = text_file(rd / f"candidate_{idx}.diff", data)
            if diff is None:
                diff = diff_text(source(ph), source(h))
            nodes.append(Node(
                id=nid, parent=by_hash.get(ph or ""), hash=h,
                score=num(_first(c, "accuracy", "score")),
                valid=c.get("valid") is True, reason=str(c.get("reason") or ""),
                label=rd.name if t is None else f"round {t}",
                kept=chosen == idx and chosen is not None, diff=_cap(diff),
            ))  # fmt: skip
            if h and h not in by_hash:
                by_hash[h] = nid
    if not rounds:
        data.note("lineage", f"{_rel(root, data)}: no round_NN folder")
    return Lineage(title, nodes)


def _first(row: dict[str, Any], *keys: str) -> Any:
    """The first of `keys` that `row` holds: adapt's rounds record J as `accuracy` (the
    binary verifier, issue 21); runs of older whales as `score`."""
    return next((row[k] for k in keys if k in row), None)


def lineage_curve(lin: Lineage, title: str) -> Curve | None:
    """Candidate scores and the running best against round / iteration (the label's number)."""
    pts: list[tuple[float, float]] = []
    for n in lin.nodes:
        m = re.search(r"([0-9]{1,9})$", n.label)
        x = 0.0 if n.label == "seed" else float(m.group(1)) if m else None
        if x is not None and n.score is not None and math.isfinite(n.score):
            pts.append((x, n.score))
    if not pts:
        return None
    best, running = -float("inf"), []
    for x in sorted({p[0] for p in pts}):
        best = max(best, *(y for px, y in pts if px == x))
        running.append((x, best))
    return Curve(title, "round / iteration", "score on the scoring split",
                 {"candidates": sorted(pts), "best so far": running})  # fmt: skip


def proposer_compliance(lin: Lineage) -> list[Any]:
    """[lineage, proposals, applied (a harness came out), valid, share applied]."""
    props = [n for n in lin.nodes if n.label != "seed"
             and not n.label.startswith(("start,", "rescore,"))]  # not the proposer's
    applied = sum(n.hash is not None for n in props)
    valid = sum(n.valid for n in props)
    share = f"{applied / len(props):.0%}" if props else "-"
    return [lin.title, len(props), applied, valid, share]


# --- ledgers and reads -----------------------------------------------------------------------


def ledger_metrics(path: Path, data: RunData, title: str, group_keys: tuple[str, ...]) -> Table:
    """Capability metrics of ledger rows grouped by `group_keys` (rows of the wrong shape for
    capability_metrics are skipped with a note)."""
    from whale.analysis.curves import capability_metrics
    from whale.records import RecordError

    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    bad = 0
    for row in jsonl_rows(path, data, "metrics"):
        if any(not isinstance(row.get(k), bool) for k in ("correct", "format_ok", "truncated")):
            bad += 1
            continue
        groups.setdefault(tuple(str(row.get(k, "-")) for k in group_keys), []).append(row)
    if bad:
        data.note("metrics", f"{_rel(path, data)}: {bad} row(s) without correct/format_ok/"
                             "truncated booleans, not counted")  # fmt: skip
    cols = list(group_keys) + ["n", "accuracy", "format_compliance", "truncation_rate",
                               "retrieval_accuracy", "answer_extraction"]  # fmt: skip
    rows = []
    for key, grp in groups.items():
        try:
            m = capability_metrics(grp)
        except RecordError as e:
            data.note("metrics", f"{_rel(path, data)} {key}: {e}")
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
            rows.append([_rel(path, data), "eval", str(r.get("at", "-")), _short(r.get("purpose")),
                         len(hs) if isinstance(hs, list) else "-", r.get("n", "-"),
                         r.get("resumed", 0)])  # fmt: skip
    for path in sorted(data.run_dir.glob("*/reads.jsonl")):
        for r in jsonl_rows(path, data, "reads"):
            at = num(r.get("at"))
            when = _iso(at) if at is not None else "-"
            rows.append([_rel(path, data), "eval", when,
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
