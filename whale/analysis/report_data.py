"""What `whale report` reads from a run directory, as plain data (no HTML here: see report.py).

A run directory is recognised by what it holds, not by a name: cotrain (schedule folders with
`outcomes.jsonl` / `reads.jsonl`), train-proposer (`teacher/`, `sft/`, `grpo/`, `evaluate/`),
search (`archive/`), adapt (`round_NN/`), a single eval (`harness.py` + `outcomes.jsonl`), else
"unknown". Every file is hostile: a missing file, a line that is not JSON, a field of the wrong
type becomes a note on the section it belongs to, never an exception, so a run that was killed
halfway still gives a report of what it had written. Lineages, curves, tables and split reads
are collected from whatever of them exists.

Not covered: the meaning of fields beyond the few each section shows (the report quotes the
files, it does not re-check the run's accounting; `whale.analysis.curves` does that for
cotrain, and its RecordError is shown as a note); runs nested more than one level deep other
than the layouts named above.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def json_file(path: Path, data: RunData, section: str) -> Any:
    """The JSON in `path`, or None with a note (missing, unreadable, not JSON)."""
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        data.note(section, f"{_rel(path, data)}: missing")
    except (OSError, ValueError, RecursionError) as e:
        data.note(section, f"{_rel(path, data)}: unreadable ({type(e).__name__})")
    return None


def jsonl_rows(path: Path, data: RunData, section: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; other lines are skipped and counted in a note."""
    try:
        raw = path.read_bytes()
    except OSError:
        data.note(section, f"{_rel(path, data)}: missing")
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


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


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


def _flat(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}",
                                                                          _short(v))]  # fmt: skip
    return out


def _short(v: Any) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= 160 else s[:157] + "..."


def load_config(data: RunData) -> None:
    path = data.run_dir / "config.toml"
    if not path.is_file():
        data.note("config", "config.toml: missing")
    else:
        import tomllib

        try:
            data.config = _flat(tomllib.loads(path.read_text(encoding="utf-8", errors="replace")))
        except (ValueError, OSError) as e:
            data.note("config", f"config.toml: unreadable ({type(e).__name__})")
    summary = data.run_dir / "summary.json"
    if summary.is_file():
        s = json_file(summary, data, "config")
        if isinstance(s, dict):
            data.summary = [(k, v) for k, v in _flat(s)
                            if not v.startswith(("[", "{"))][:40]  # fmt: skip


# --- lineages --------------------------------------------------------------------------------


def archive_lineage(root: Path, title: str, data: RunData) -> Lineage:
    """A Meta-Harness archive (search, or a cotrain harness phase with the search operator)."""
    metas: list[dict[str, Any]] = []
    for folder in sorted(p for p in root.glob("c[0-9]*") if p.is_dir()):
        m = json_file(folder / "meta.json", data, "lineage")
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            metas.append(m)
    if not metas and (root / "summary.jsonl").is_file():
        metas = [m for m in jsonl_rows(root / "summary.jsonl", data, "lineage")
                 if isinstance(m.get("id"), str)]  # fmt: skip
    if not metas:
        data.note("lineage", f"{_rel(root, data)}: no candidate")
    ids = {m["id"] for m in metas}
    best = max((m for m in metas if num(m.get("score")) is not None),
               key=lambda m: num(m.get("score")) or 0.0, default=None)  # fmt: skip
    nodes = []
    for m in metas:
        parent = _str(m.get("parent_id"))
        it = m.get("iteration")
        diff = None
        if parent is not None and parent in ids:
            diff = diff_text(
                _text(root / parent / "harness.py"), _text(root / m["id"] / "harness.py")
            )
        nodes.append(Node(
            id=m["id"], parent=parent if parent in ids else None, hash=_str(m.get("hash")),
            score=num(m.get("score")), valid=m.get("valid") is True,
            reason=str(m.get("reason") or ""),
            label="seed" if parent is None else f"iteration {it}",
            kept=best is m, diff=_cap(diff),
        ))  # fmt: skip
    return Lineage(title, nodes, mark="best")


def rounds_lineage(root: Path, title: str, harness_dirs: list[Path], data: RunData,
                   seed_hash: str | None = None) -> Lineage:  # fmt: skip
    """round_NN/ folders of adapt (or of a ratchet evaluation): candidates.json, decision.json,
    candidate_i.diff; sources looked up as <hash>.py in `harness_dirs` when a diff is absent."""

    def source(h: str | None) -> str | None:
        for d in harness_dirs:
            if h and (text := _text(d / f"{h}.py")) is not None:
                return text
        return None

    by_hash: dict[str, str] = {}  # harness hash -> id of the node that first produced it
    nodes: list[Node] = []
    rounds = sorted(p for p in root.glob("round_[0-9]*") if p.is_dir())
    for rd in rounds:
        t = rd.name.removeprefix("round_")
        cands = json_file(rd / "candidates.json", data, "lineage")
        decision = json_file(rd / "decision.json", data, "lineage") if (
            rd / "decision.json").exists() else None  # fmt: skip
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
                nodes.append(Node(root_id, None, ph, num(decision.get("parent_score"))
                                  if isinstance(decision, dict) and decision.get("parent_hash")
                                  == ph else None, True, "", "seed"))  # fmt: skip
                by_hash[ph] = root_id
            idx = c.get("index", pos)
            nid = f"r{int(t) if t.isdigit() else t}.{idx}"
            h = _str(c.get("hash"))
            diff = _text(rd / f"candidate_{idx}.diff")
            if diff is None:
                diff = diff_text(source(ph), source(h))
            nodes.append(Node(
                id=nid, parent=by_hash.get(ph or ""), hash=h, score=num(c.get("score")),
                valid=c.get("valid") is True, reason=str(c.get("reason") or ""),
                label=f"round {int(t)}" if t.isdigit() else rd.name,
                kept=chosen == idx and chosen is not None, diff=_cap(diff),
            ))  # fmt: skip
            if h and h not in by_hash:
                by_hash[h] = nid
    if not rounds:
        data.note("lineage", f"{_rel(root, data)}: no round_NN folder")
    return Lineage(title, nodes)


def lineage_curve(lin: Lineage, title: str) -> Curve | None:
    """Candidate scores and the running best against round / iteration (the label's number)."""
    pts: list[tuple[float, float]] = []
    for n in lin.nodes:
        m = re.search(r"(\d+)$", n.label)
        x = 0.0 if n.label == "seed" else float(m.group(1)) if m else None
        if x is not None and n.score is not None:
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
    props = [n for n in lin.nodes if n.label != "seed"]
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
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + "Z"
