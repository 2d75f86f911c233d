"""Reading a run folder for the audit: where its harnesses, trajectories, ledgers and datasets of
edits are, which task family each belongs to, and in what order its harnesses came to be.

`scan_run(run_dir)` walks an adapt, search, cotrain, train-proposer or eval run (symlinks not
followed; `_PRUNE` folders such as adapters and checkpoints skipped; at most `MAX_FILES` files)
and finds every harness source: `harnesses/<hash>.py` with `trajectories/<hash>.jsonl` and the
ledger `outcomes.jsonl` beside the folder, and archive candidate folders `cNNNN/harness.py` with
`meta.json`, `trajectories.jsonl` and `outcomes.jsonl`; and the train-proposer teacher's
datasets of edits (`teacher/candidates.jsonl`, `kept.jsonl`).

Lineage. The audit's duplicate screen needs each harness after the ones it came from, so that
a candidate is a duplicate of its parent and never the reverse. File times say nothing (a
`cp -r` sets them all to the copy's time), so the order is read from what the run records,
as a position (phase, generation, sequence) and parent -> child edges:

- `seed.json` (adapt, cotrain): the seed, position (0, 0, 0);
- `round_NN/candidates.json` (adapt, a cotrain revise phase): (phase, round, index + 1), and
  the edge parent_hash -> hash;
- archive `cNNNN/meta.json` (search, the one archive of a cotrain's search phases):
  (phase, iteration, NNNN), the phase as meta.json names it, and the edge from the candidate
  its `parent_id` names in the same archive (ids are `cJJMM`, iteration JJ's M-th candidate;
  `c0000` is the seed; a rescore has the source of its parent: no edge);
- `contexts/sft.json`, `contexts/rl_K.json` (train-proposer): each context's parent at
  (0 or K, 0, row); `teacher/candidates.jsonl`: each row's candidate at (0, 1, row) and
  `grpo/phase_K/rewards.jsonl` at (K, 1, row), both with the edge from the parent their
  context id "<family>/<parent hash>/<draw>" names;
- `phases.jsonl` (cotrain): the edge start_harness -> end_harness of each phase.

The phase is the one an archive candidate's meta.json records, else the number of the nearest
enclosing `phase_K` folder (0 when none). A harness
recorded several times takes its earliest position. `Lineage.order` sorts topologically
(parents first), ties and the rest by position, then by file name; harnesses no record names
come after the recorded ones, in file name order. A cycle (a hostile record) is cut at its
earliest member.

Hostile input: every file is read with `whale.records.read_untrusted` inside the run folder
(a symlink out of it, a FIFO or device, or more than a size cap is refused: a note for
harness sources, trajectories and configs, nothing for lineage records) and a garbage record
is skipped; a trajectory file's garbage lines are counted in a note; a config.toml too deeply
nested for the TOML parser (RecursionError) counts as no config, with a note.
Not covered: lineage a run does not write down (an eval run's harnesses are in file name
order), and runs whose files were renamed.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale.harness.trajectory import Trajectory
from whale.records import UnsafeRead, read_untrusted

MAX_TRAJECTORY_BYTES = 64_000_000
MAX_TRAJECTORIES = 500
MAX_FILES = 200_000
MAX_RECORD_BYTES = 64_000_000  # a lineage record (candidates.json, contexts) larger is not read
# final_harness/: a folder harness written out (whale.runs.ledger.FINAL_FOLDER), a copy of
# its bundle in harnesses/<hash>.py; its harness.py is one file of it, not a harness.
_PRUNE = frozenset({"adapters", "dataset", "checkpoints", "adapter", "weight", "__pycache__",
                    "final_harness"})  # fmt: skip
_PHASE = re.compile(r"phase_(\d+)")
_ROUND = re.compile(r"round_(\d+)")
_CAND = re.compile(r"c(\d+)")
Position = tuple[int, int, int]  # (phase, generation, sequence): see the module docstring


@dataclass
class Site:
    """One harness source, the files recorded with it, and what its own folder says of it."""

    source: Path
    hash: str | None
    trajectories: Path
    ledger: Path
    parent: Path | None = None  # the parent's source, where the run records it
    position: Position | None = None  # from the archive folder's meta.json


@dataclass
class Lineage:
    """Recorded positions of harness hashes and parent -> child edges (module docstring)."""

    positions: dict[str, Position] = field(default_factory=dict)
    edges: set[tuple[str, str]] = field(default_factory=set)

    def place(self, h: Any, pos: Position) -> None:
        if isinstance(h, str) and h:
            self.positions[h] = min(pos, self.positions.get(h, pos))

    def link(self, parent: Any, child: Any) -> None:
        if isinstance(parent, str) and isinstance(child, str) and parent and child != parent:
            self.edges.add((parent, child))

    def order(self, items: Mapping[str, tuple[Position | None, str]]) -> list[str]:
        """The hashes of `items` (hash -> (its sites' own position or None, file name)),
        parents before children, then by position, then by file name."""
        prio: dict[str, tuple[int, Position, str]] = {}
        for h, (own, name) in items.items():
            known = [p for p in (own, self.positions.get(h)) if p is not None]
            prio[h] = (0, min(known), name) if known else (1, (0, 0, 0), name)
        children: dict[str, list[str]] = {h: [] for h in items}
        waiting = dict.fromkeys(items, 0)
        for parent, child in self.edges:
            if parent in items and child in items:
                children[parent].append(child)
                waiting[child] += 1
        heap = [(prio[h], h) for h, n in waiting.items() if n == 0]
        heapq.heapify(heap)
        out: list[str] = []
        done: set[str] = set()
        while len(out) < len(items):
            if not heap:  # a cycle: release its earliest member
                h = min((h for h in items if h not in done), key=lambda h: (prio[h], h))
                heap.append((prio[h], h))
            _, h = heapq.heappop(heap)
            if h in done:
                continue
            done.add(h)
            out.append(h)
            for c in children[h]:
                waiting[c] -= 1
                if waiting[c] == 0 and c not in done:
                    heapq.heappush(heap, (prio[c], c))
        return out


@dataclass
class RunFiles:
    sites: list[Site] = field(default_factory=list)
    datasets: list[Path] = field(default_factory=list)
    lineage: Lineage = field(default_factory=Lineage)


def read_text(path: Path, limit: int, root: Path | None = None) -> tuple[str | None, str]:
    """The text of `path` (undecodable bytes replaced), or None and why not. Read with
    `whale.records.read_untrusted` inside `root` (default: the file's own folder): a symlink
    out of it, a FIFO or device, more than `limit` bytes, or an unreadable file is refused."""
    try:
        data = read_untrusted(path, root if root is not None else path.parent, limit)
    except OSError as e:
        if isinstance(e, UnsafeRead):
            return None, str(e)
        return None, f"{path.name}: cannot read ({e.strerror or e})"
    return data.decode("utf-8", "replace"), ""


def read_trajectories(
    path: Path, harness: str | None = None, root: Path | None = None
) -> tuple[list[Trajectory], list[str]]:
    """The trajectories in a JSONL file (of `harness` when given), with notes on what was not
    read: garbage lines, rows of another version, more than `MAX_TRAJECTORIES`, a file over
    `MAX_TRAJECTORY_BYTES` or one `read_text` refuses (a link out of `root`, a FIFO). A missing
    file is no trajectories and no note."""
    if not os.path.lexists(path):
        return [], []
    out: list[Trajectory] = []
    bad, notes = 0, []
    try:
        data = read_untrusted(path, root if root is not None else path.parent,
                              MAX_TRAJECTORY_BYTES)  # fmt: skip
    except OSError as e:
        why = str(e) if isinstance(e, UnsafeRead) else f"cannot read ({e.strerror or e})"
        return [], [why if why.startswith(str(path)) else f"{path}: {why}"]
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        if len(out) >= MAX_TRAJECTORIES:
            notes.append(f"{path}: only the first {MAX_TRAJECTORIES} trajectories read")
            break
        try:
            row = json.loads(raw.decode("utf-8", "replace"))
            t = Trajectory.from_dict(row)
            if not isinstance(t.events, list) or not isinstance(t.question_id, str):
                raise ValueError("events is not a list")
        except (ValueError, TypeError, RecursionError, AttributeError):
            bad += 1
            continue
        if harness is None or t.harness_hash == harness:
            out.append(t)
    if bad:
        notes.append(f"{path}: {bad} line(s) not a trajectory record, skipped")
    return out, notes


def scan_run(run_dir: Path, notes: list[str]) -> RunFiles:
    """Harness sites, datasets of edits and the lineage under `run_dir` (module docstring);
    what could not be searched is appended to `notes`."""
    found = RunFiles()
    archives: dict[Path, dict[str, str]] = {}  # archive folder -> candidate id -> hash
    parent_ids: list[tuple[Path, str, str]] = []  # (archive folder, parent id, child hash)
    seen = 0
    for root, dirs, files in os.walk(run_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _PRUNE and not d.startswith("."))
        here = Path(root)
        seen += len(files)
        if seen > MAX_FILES:
            notes.append(f"more than {MAX_FILES} files: the rest of the run was not searched")
            break
        phase = _phase(here, run_dir)
        if here.name == "harnesses":
            for name in sorted(files):
                if name.endswith(".py"):
                    found.sites.append(Site(here / name, name[:-3],
                                            here.parent / "trajectories" / f"{name[:-3]}.jsonl",
                                            here.parent / "outcomes.jsonl"))  # fmt: skip
        elif "harness.py" in files:
            found.sites.append(_archive_site(here, phase, archives, parent_ids, run_dir))
        if "seed.json" in files:
            found.lineage.place(json_dict(here / "seed.json", run_dir).get("hash"), (0, 0, 0))
        if (m := _ROUND.fullmatch(here.name)) and "candidates.json" in files:
            _round(here / "candidates.json", phase, int(m.group(1)), found.lineage, run_dir)
        if here.name == "teacher":
            found.datasets += [here / n for n in ("candidates.jsonl", "kept.jsonl") if n in files]
            if "candidates.jsonl" in files:
                _edit_rows(here / "candidates.jsonl", 0, "result", found.lineage, run_dir)
        if "rewards.jsonl" in files:
            _edit_rows(here / "rewards.jsonl", phase, "", found.lineage, run_dir)
        if here.name == "contexts":
            for name in sorted(n for n in files if n.endswith(".json")):
                k = _contexts_stage(name[:-5])
                if k is not None:
                    _contexts(here / name, k, found.lineage, run_dir)
        if "phases.jsonl" in files:
            for row in jsonl_rows(here / "phases.jsonl", root=run_dir):
                found.lineage.link(row.get("start_harness"), row.get("end_harness"))
    for folder, pid, child in parent_ids:
        found.lineage.link(archives.get(folder, {}).get(pid), child)
    return found


def _archive_site(here: Path, phase: int, archives: dict[Path, dict[str, str]],
                  parent_ids: list[tuple[Path, str, str]], root: Path) -> Site:  # fmt: skip
    meta = json_dict(here / "meta.json", root)
    h, pid, cid = (meta.get(k) for k in ("hash", "parent_id", "id"))
    h = h if isinstance(h, str) else None
    pid = pid if isinstance(pid, str) and "/" not in pid and pid not in ("", ".", "..") else None
    parent = here.parent / pid / "harness.py" if pid is not None else None
    cid = cid if isinstance(cid, str) else here.name
    m = _CAND.fullmatch(cid) or _CAND.fullmatch(here.name)
    position = None
    if m:
        seq = int(m.group(1))
        # cJJMM: iteration JJ. One archive holds all of a cotrain's harness phases: its
        # meta.json names the phase (iterations continue across phases, so either orders).
        position = (_int(meta.get("phase"), phase), _int(meta.get("iteration"), seq // 100), seq)
    if h is not None:
        archives.setdefault(here.parent, {})[cid] = h
        if pid is not None:
            parent_ids.append((here.parent, pid, h))
    return Site(here / "harness.py", h, here / "trajectories.jsonl", here / "outcomes.jsonl",
                parent, position)  # fmt: skip


def _round(path: Path, phase: int, number: int, lineage: Lineage, root: Path) -> None:
    rows = json_value(path, root=root)
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if not isinstance(row, dict):
            continue
        r, idx = row.get("round"), row.get("index")
        pos = (phase, _int(r, number), _int(idx, i) + 1)
        lineage.place(row.get("hash"), pos)
        lineage.link(row.get("parent_hash"), row.get("hash"))


def _edit_rows(path: Path, phase: int, nested: str, lineage: Lineage, root: Path) -> None:
    """A teacher's candidates.jsonl (hash under `nested`) or a GRPO rewards.jsonl."""
    for n, row in enumerate(jsonl_rows(path, root=root)):
        res = row.get(nested) if nested else row
        h = res.get("hash") if isinstance(res, dict) else None
        lineage.place(h, (phase, 1, n))
        ctx = row.get("context")
        parts = ctx.rsplit("/", 2) if isinstance(ctx, str) else []
        if len(parts) == 3:
            lineage.link(parts[1], h)


def _contexts(path: Path, stage: int, lineage: Lineage, root: Path) -> None:
    rows = json_value(path, root=root)
    for n, row in enumerate(rows if isinstance(rows, list) else []):
        if isinstance(row, dict):
            lineage.place(row.get("parent_hash"), (stage, 0, n))


def _contexts_stage(name: str) -> int | None:
    if name == "sft":
        return 0
    m = re.fullmatch(r"rl_(\d+)", name)
    return int(m.group(1)) if m else None


def _phase(d: Path, run_dir: Path) -> int:
    try:
        parts = d.relative_to(run_dir).parts
    except ValueError:
        return 0
    for part in reversed(parts):
        if m := _PHASE.fullmatch(part):
            return int(m.group(1))
    return 0


def _int(x: Any, default: int) -> int:
    """`x` when it is a plausible recorded number (an int, not a bool, 0 <= x < 10**9)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 10**9 else default


def json_value(path: Path, limit: int = MAX_RECORD_BYTES, root: Path | None = None) -> Any:
    """The JSON value in `path`, or None when it is missing, too large, not JSON or refused by
    `read_text` (inside `root`)."""
    text, _ = read_text(path, limit, root) if path.is_file() else (None, "")
    try:
        return json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None


def json_dict(path: Path, root: Path | None = None) -> dict[str, Any]:
    """The JSON object in `path` (at most 10 MB), or {} when it is anything else."""
    d = json_value(path, 10_000_000, root)
    return d if isinstance(d, dict) else {}


def jsonl_rows(
    path: Path, limit: int = MAX_RECORD_BYTES, root: Path | None = None
) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file (read inside `root`), in order; other lines are
    skipped."""
    text, _ = read_text(path, limit, root) if path.is_file() else (None, "")
    for line in (text or "").split("\n"):
        try:
            row = json.loads(line) if line.strip() else None
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            yield row


def config_task(
    d: Path,
    run_dir: Path,
    cache: dict[Path, dict[str, Any] | None],
    notes: list[str] | None = None,
) -> dict[str, Any] | None:
    """The `[task]` table of the nearest config.toml from `d` up to `run_dir`. A config that
    cannot be read (a FIFO, a link out of the run) or parsed (garbage, or nesting deep enough
    to exhaust the parser's recursion) counts as none, with a note in `notes`."""
    for p in (d, *d.parents):
        if p not in cache:
            cfg, path = None, p / "config.toml"
            text, why = read_text(path, 1_000_000, run_dir) if os.path.lexists(path) \
                else (None, "")  # fmt: skip
            try:
                task = tomllib.loads(text).get("task") if text else None
                cfg = task if isinstance(task, dict) and isinstance(task.get("id"), str) else None
            except tomllib.TOMLDecodeError:
                cfg = None
            except RecursionError:
                why = f"{path}: nested too deeply to parse: read as no config"
            if why and notes is not None:
                notes.append(why)
            cache[p] = cfg
        if cache[p] is not None or p == run_dir:
            return cache[p]
    return None


def family_of(question_id: str) -> str | None:
    """The task part of a question id "<family>:<seed>:<index>" ("rg:gcd:0:42" -> "rg:gcd")."""
    parts = question_id.split("@", 1)[0].rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and parts[0]:
        return parts[0]
    return None


def dev_ids(ledger: Path, root: Path | None = None) -> set[str]:
    """Question ids a ledger (or an archive's outcomes.jsonl) scored outside the eval split."""
    ids: set[str] = set()
    for row in jsonl_rows(ledger, MAX_TRAJECTORY_BYTES, root):
        if row.get("split") != "eval":
            qid = row.get("question_id", row.get("id"))
            if isinstance(qid, str):
                ids.add(qid)
    return ids
