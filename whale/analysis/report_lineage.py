"""The candidates of a run as lineages, for `whale report` (split from report_data.py, which
holds the tolerant readers these use).

- `archive_lineage`: a Meta-Harness archive (search; a cotrain schedule's one archive), each
  candidate with its diff against its parent's source and the hypothesis its meta.json states;
- `rounds_lineage`: adapt's round_NN/ folders (also a ratchet evaluation's, and a cotrain
  revision phase's), the candidate Select kept in each round with the explanation its proposal
  opened with (the text before its first SEARCH/REPLACE block or code fence) and the
  decision's `why`;
- `lineage_curve`, `proposer_compliance`: what the report draws and counts from a lineage.

Every text taken from the records (ids, reasons, diffs, hypotheses) is hostile: it is kept as
text, capped (MAX_DIFF_CHARS, MAX_HYPOTHESIS_CHARS), and escaped by the renderer. Not covered:
the explanation of a proposal Select did not keep (the lineage shows its diff and reason only).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from whale.analysis.report_data import (
    Curve,
    Lineage,
    Node,
    RunData,
    cap_diff,
    cap_text,
    diff_text,
    json_file,
    jsonl_rows,
    num,
    rel_path,
    round_number,
    str_or_none,
    text_file,
)


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
        data.note("lineage", f"{rel_path(root, data)}: no candidate")
    ids = {m["id"] for m in metas}
    best = _archive_best(metas)
    nodes: list[Node] = []
    used: set[str] = set()
    for pos, m in enumerate(metas):
        parent = str_or_none(m.get("parent_id"))
        diff = None
        if parent is not None and parent in ids:
            diff = diff_text(text_file(root / parent / "harness.py", data),
                             text_file(root / m["id"] / "harness.py", data))  # fmt: skip
        nodes.append(Node(
            id=_unique(m["id"], used, pos), parent=parent, hash=str_or_none(m.get("hash")),
            score=_j(m), valid=m.get("valid") is True,
            reason=str(m.get("reason") or ""),
            label=_archive_label(m),
            kept=best is m, diff=cap_diff(diff),
            hypothesis=cap_text(str_or_none(m.get("hypothesis"))),
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
        if isinstance(chosen, bool) or not isinstance(chosen, int):
            chosen = None  # a hostile `true` would equal index 1
        said = _explanation(rd, chosen, data) if chosen is not None else None
        why = cap_text(str_or_none(decision.get("why"))) if isinstance(decision, dict) else None
        for pos, c in enumerate(cands):
            if not isinstance(c, dict):
                data.note("lineage", f"{rel_path(rd, data)}/candidates.json: entry {pos} "
                                     "not an object")  # fmt: skip
                continue
            ph = str_or_none(c.get("parent_hash"))
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
            h = str_or_none(c.get("hash"))
            diff = text_file(rd / f"candidate_{idx}.diff", data)
            if diff is None:
                diff = diff_text(source(ph), source(h))
            nodes.append(Node(
                id=nid, parent=by_hash.get(ph or ""), hash=h,
                score=num(_first(c, "accuracy", "score")),
                valid=c.get("valid") is True, reason=str(c.get("reason") or ""),
                label=rd.name if t is None else f"round {t}",
                kept=chosen == idx and chosen is not None, diff=cap_diff(diff),
            ))  # fmt: skip
            if nodes[-1].kept:
                nodes[-1].hypothesis, nodes[-1].why = said, why
            if h and h not in by_hash:
                by_hash[h] = nid
    if not rounds:
        data.note("lineage", f"{rel_path(root, data)}: no round_NN folder")
    return Lineage(title, nodes)


def _explanation(rd: Path, chosen: int, data: RunData) -> str | None:
    """What the kept proposal said its edit changes: the lines of round folder `rd`'s
    proposals.json entry `chosen` before its first block marker or code fence (the proposer is
    asked for "one or two sentences" first). None when the file, the entry or the text is
    absent (runs of older whales; a missing file is no note: the lineage needs none)."""
    from whale.revise.edits import is_marker

    path = rd / "proposals.json"
    rows = json_file(path, data, "lineage") if os.path.lexists(path) else None
    if not isinstance(rows, list):
        return None
    for pos, row in enumerate(rows):
        i = row.get("index", pos) if isinstance(row, dict) else None
        if isinstance(row, dict) and type(i) is int and i == chosen:
            text = row.get("text")
            if not isinstance(text, str):
                return None
            said: list[str] = []
            for line in text.splitlines():
                if is_marker(line) or line.lstrip().startswith("```"):
                    break
                said.append(line)
            return cap_text("\n".join(said).strip()) or None
    return None


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
