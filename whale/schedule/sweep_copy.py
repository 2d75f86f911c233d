"""Stagewise after `whale cotrain --sweep`: its folder starts as a copy of the chosen point's.

The chosen sweep point ran stagewise's config and seed without boundary reads, so a stagewise
run from a copy of its records replays its weight steps (adapters on disk) and its search
(archive, sessions) and pays only for its reads: the sweep's cost is not paid twice. What the
copy changes, and why:
- the point's validation score (its ledger rows of kind "validation", read after its run; a
  sweep point reads nothing else) is left out, with those trajectories: the ledger is keyed by
  (fingerprint, harness, question), so stagewise's last validation read would be answered by
  them, under the sweep's tags, and the phase table would show a phase the run never had;
- paths into the point's folder, in whale's own records (not the ledger or the trajectories,
  wherever they are kept: what models and harnesses wrote is never rewritten), name the
  copy's folder: a record's path may be absolute or relative (as `--out` was given), either
  way it names the point's folder as a segment `sweep/<point>/stagewise`;
- the copy is made under `sweep/` and renamed in, so a kill leaves no half-made schedule
  folder beside the others (the tables read every folder of the run that holds a ledger).
Not covered: the adapters are copied, not linked (twice their disk: small at `small`, tens of
GB at the paper's scale).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from whale.records import read_jsonl, write_atomic

LEDGER = "outcomes.jsonl"
TRAJECTORIES = "trajectories"


def stagewise_from_sweep(run_dir: Path, swept: dict[str, Any],
                         say: Callable[[str], None]) -> None:  # fmt: skip
    """Start `run_dir/stagewise` as a copy of the chosen point's run (`swept`: sweep.json's
    content), unless it exists (a resume, or a stagewise begun before)."""
    dst = run_dir / "stagewise"
    if dst.exists():
        return
    (point,) = [p for p in swept["points"] if [p["epochs"], p["iters"]] == swept["chosen"]]
    src = run_dir / point["dir"]
    tmp = run_dir / "sweep" / ".stagewise.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, symlinks=True)
    (tmp / "summary.json").unlink(missing_ok=True)
    _drop_the_sweep_score(tmp)
    _rename_paths(tmp, point["dir"], str(dst))
    tmp.rename(dst)
    say(f"stagewise: from the sweep's run of {point['dir']} (its records replay; the boundary "
        "reads are new)")


def _lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=True) + "\n" for r in rows)


def _drop_the_sweep_score(root: Path) -> None:
    rows = read_jsonl(root / LEDGER)
    dropped = {(r["fingerprint"], r["harness"], r["question_id"]) for r in rows
               if r["kind"] == "validation"}  # fmt: skip
    if not dropped:
        return
    write_atomic(root / LEDGER, _lines([r for r in rows if r["kind"] != "validation"]))
    for h in {d[1] for d in dropped}:
        path = root / TRAJECTORIES / f"{h}.jsonl"
        if path.is_file():
            kept = [r for r in read_jsonl(path)
                    if (r.get("fingerprint", ""), h, r.get("question_id")) not in dropped]
            write_atomic(path, _lines(kept))


def _moved(value: Any, rel: str, dst: str) -> Any:
    """`value` with every string that is a path inside the folder `rel` (a segment of it)
    made to name the same path inside `dst`. A string is taken for a path only where nothing
    before the folder holds a space (a message that quotes a path is left as it is; so is a
    path under a run folder whose name holds one, which then still names the sweep's copy)."""
    if isinstance(value, dict):
        return {k: _moved(v, rel, dst) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, rel, dst) for v in value]
    if isinstance(value, str):
        i = value.find(rel)
        while i >= 0:
            end = i + len(rel)
            if (i == 0 or value[i - 1] == "/") and (end == len(value) or value[end] == "/") \
                    and not any(c.isspace() for c in value[:i]):  # fmt: skip
                return dst + value[end:]
            i = value.find(rel, i + 1)
    return value


def _rename_paths(root: Path, rel: str, dst: str) -> None:
    for f in sorted([*root.rglob("*.jsonl"), *root.rglob("*.json")]):
        parts = f.relative_to(root).parts
        if not f.is_file() or f.is_symlink() or f.name in (LEDGER, f"{TRAJECTORIES}.jsonl") \
                or TRAJECTORIES in parts[:-1]:  # fmt: skip
            continue  # what models and harnesses wrote (the archive keeps trajectories too)
        if f.suffix == ".jsonl":
            rows = read_jsonl(f)
            moved = [_moved(r, rel, dst) for r in rows]
            if moved != rows:
                write_atomic(f, _lines(moved))
        else:
            data = json.loads(f.read_text())
            new = _moved(data, rel, dst)
            if new != data:
                write_atomic(f, json.dumps(new, indent=2))
