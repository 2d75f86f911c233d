"""The answer `whale report` opens with, per run kind (plain data; report.py renders it).

- adapt / search: the held-out eval split, read once at the end, seed -> final (search: the
  accepted candidate) as k/n, counted from the ledger's eval rows of the two harnesses
  (restricted to the question ids eval_read.json recorded); then the edits that made the
  final harness, in order from the seed (adapt: the candidate each round's Select kept, with
  the explanation its proposal opened with and the decision's reason; search: the accepted
  candidate's ancestry in the archive, with each meta.json hypothesis), and the whole change
  against the seed when it took more than one edit; then the lineage's curve.
- cotrain (also rsft and diagnose, which write its layout): per schedule the eval read at the
  start (base) and the last one (final) as k/n, the training rollouts the schedule spent (its
  ledger) and where it first passes stagewise's final eval accuracy (the paper's cost figure;
  `whale.schedule.curves.schedule_summary`); a diagnose run's verdicts; then the curves.
- eval: the run's accuracy as k/n.
- train-proposer: per proposer and family, the seed's score -> the ratchet's (the readings hold
  no n).

Where the ledger has no eval row (a run killed before its final eval, or one whose ledger was
refused) the accuracy summary.json records is shown, with n from eval_read.json or the config,
and k only when accuracy * n is a whole number. When summary.json and the ledger disagree, the
ledger's count is shown and a note says so. Everything here is hostile text from the records:
capped here, escaped by the renderer.

Not covered: an interval for the difference between seed and final (each reading gets its own
Wilson interval; they are not a paired test); which of several kept-edit paths a best-of-G
select would have taken had it been run again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whale.analysis.report_data import (
    Change,
    Lead,
    Line,
    Lineage,
    Node,
    Reading,
    RunData,
    cap_diff,
    cap_text,
    diff_text,
    human,
    json_file,
    num,
    str_or_none,
    text_file,
)

MAX_CHANGES = 20  # kept edits shown in the answer at most (the lineage holds every one)
CONTEXT_KEYS = (("task.id", "task"), ("harness", "seed harness"), ("solver.name", "solver"),
                ("proposer.name", "proposer"), ("model.name", "model"))  # fmt: skip


def reading(k: Any = None, n: Any = None, accuracy: Any = None) -> Reading:
    """A Reading from values of the records: `k` and `n` only as whole numbers with
    0 <= k <= n, n >= 1; `k` from accuracy * n when that is whole; an accuracy outside [0, 1]
    or not finite is dropped."""
    acc = num(accuracy)
    acc = acc if acc is not None and 0.0 <= acc <= 1.0 else None
    n_ok = n if type(n) is int and n >= 1 else None
    k_ok = k if type(k) is int and n_ok is not None and 0 <= k <= n_ok else None
    if k_ok is None and n_ok is not None and acc is not None:
        whole = round(acc * n_ok)
        k_ok = whole if math.isclose(acc * n_ok, whole, abs_tol=1e-6) else None
    return Reading(k_ok, n_ok, k_ok / n_ok if k_ok is not None and n_ok else acc)


def context(data: RunData) -> list[tuple[str, str]]:
    config = dict(data.config)
    return [(label, config[key]) for key, label in CONTEXT_KEYS if key in config]


def _dig(obj: Any, *keys: str) -> Any:
    for k in keys:
        obj = obj.get(k) if isinstance(obj, dict) else None
    return obj


def _eval_read(data: RunData) -> dict[str, Any]:
    path = data.run_dir / "eval_read.json"
    r = json_file(path, RunData(data.run_dir, data.kind), "answer") if path.exists() else None
    return r if isinstance(r, dict) else {}  # unreadable: the reads section notes it


def _held_out(data: RunData, ledger: Sequence[dict[str, Any]], h: str | None,
              recorded: Any, ids: set[str] | None, n_read: Any) -> Reading:  # fmt: skip
    """Harness `h` on the eval split: k/n of its ledger rows (the question ids `ids` only, when
    known; one row per question, the last), else the `recorded` accuracy of summary.json."""
    by_q: dict[str, bool] = {}
    for row in ledger:
        q, ok = row.get("question_id"), row.get("correct")
        if row.get("split") == "eval" and row.get("harness") == h and isinstance(ok, bool) \
                and isinstance(q, str) and (ids is None or q in ids):  # fmt: skip
            by_q[q] = ok
    acc = num(recorded)
    if not by_q:
        return reading(n=n_read, accuracy=acc)
    r = reading(sum(by_q.values()), len(by_q))
    if acc is not None and r.accuracy is not None and abs(acc - r.accuracy) > 1e-9:
        data.note("answer", f"summary.json records accuracy {human(acc)} for {h}; its ledger eval "
                            f"rows give {r.k}/{r.n}, shown")  # fmt: skip
    return r


def _split_ids(read: dict[str, Any]) -> set[str] | None:
    ids = read.get("question_ids")
    if isinstance(ids, list) and ids and all(isinstance(q, str) for q in ids):
        return set(ids)
    return None


def _seed_final_line(data: RunData, ledger: Sequence[dict[str, Any]], name: str,
                     fallback: tuple[str | None, str | None]
                     ) -> tuple[Line, str | None]:  # fmt: skip
    """The held-out line `seed -> <name>`, and the final harness's hash. The hashes come from
    summary.json, else eval_read.json's harnesses (seed first), else `fallback`."""
    s = data.summary_json or {}
    read = _eval_read(data)
    listed = [h for h in read.get("harnesses") or [] if isinstance(h, str)] if isinstance(
        read.get("harnesses"), list) else []  # fmt: skip
    seed = str_or_none(_dig(s, "seed_eval", "hash")) or (listed[0] if listed else fallback[0])
    final = str_or_none(_dig(s, "final_eval", "hash")) or (listed[-1] if listed else fallback[1])
    n_read = read.get("n") if type(read.get("n")) is int else s.get("eval")
    ids = _split_ids(read)
    before = _held_out(data, ledger, seed, _dig(s, "seed_eval", "accuracy"), ids, n_read)
    after = _held_out(data, ledger, final, _dig(s, "final_eval", "accuracy"), ids, n_read)
    if before.accuracy is None and after.accuracy is None:
        data.note("answer", "no held-out reading recorded (the run did not reach its final eval,"
                            " or its ledger and summary.json were not read)")  # fmt: skip
    return Line("held-out eval", [("seed", before), (name, after)]), final


def _changes(path: list[Node], total: str | None, where: str) -> list[Change]:
    """The edits of `path` (seed side first), each against its parent, then the whole change
    against the seed when there was more than one."""
    out = [Change(f"{n.id} ({n.label}): against its parent {n.parent}"
                  + (f", accuracy {human(n.score)} on the scoring split" if n.score is not None
                     else ""), n.diff, n.hypothesis, n.why)
           for n in path[:MAX_CHANGES]]  # fmt: skip
    if len(path) > 1:
        out.append(Change(f"all {len(path)} edits together: the final harness against the seed"
                          f" ({where})", cap_diff(total), None, proposed=False))  # fmt: skip
    return out


def _source(dirs: Sequence[Path], name: str | None, data: RunData) -> str | None:
    for d in dirs:
        if name and (text := text_file(d / name, data)) is not None:
            return text
    return None


def adapt_lead(data: RunData, lin: Lineage, ledger: Sequence[dict[str, Any]],
               curves: list[int], seed_hash: str | None) -> Lead:  # fmt: skip
    """seed -> final on the held-out split; the candidates Select kept, round by round."""
    kept = [n for n in lin.nodes if n.kept]
    line, final = _seed_final_line(data, ledger, "final", (seed_hash, kept[-1].hash if kept
                                                                   else seed_hash))  # fmt: skip
    lead = Lead("held-out eval split, read once at the end (seed and final harness)", [line],
                context(data), curves=curves)  # fmt: skip
    seed = seed_hash or next((n.hash for n in lin.nodes if n.parent is None), None)
    harnesses = [data.run_dir / "harnesses"]
    total = (
        diff_text(_source(harnesses, f"{seed}.py", data), _source(harnesses, f"{final}.py", data))
        if len(kept) > 1
        else None
    )
    lead.changes = _changes(kept, total, "harnesses/")
    _count_note(lead, kept, "no edit was kept: the final harness is the seed")
    return lead


def _count_note(lead: Lead, kept: list[Node], none: str) -> None:
    if not kept:
        lead.notes.append(none)
    elif len(kept) > MAX_CHANGES:
        lead.notes.append(f"{len(kept) - MAX_CHANGES} more kept edits: see the lineage")


def search_lead(data: RunData, lin: Lineage, ledger: Sequence[dict[str, Any]],
                curves: list[int]) -> Lead:  # fmt: skip
    """seed -> accepted on the held-out split; the accepted candidate's ancestry."""
    s = data.summary_json or {}
    by_id: dict[str, Node] = {}
    for n in lin.nodes:
        by_id.setdefault(n.id, n)
    best = next((n for n in lin.nodes if n.kept), None)
    accepted = by_id.get(str_or_none(_dig(s, "final_eval", "id")) or "", best)
    root = next((n for n in lin.nodes if n.parent is None), None)
    line, _ = _seed_final_line(data, ledger, "accepted", (
        root.hash if root else None, accepted.hash if accepted else None))  # fmt: skip
    sa, aa = num(s.get("seed search accuracy")), num(s.get("accepted search accuracy"))
    if sa is not None and aa is not None:
        line.extra.append(f"search split: {human(sa)} -> {human(aa)}")
    if stopped := cap_text(str_or_none(s.get("stopped")), 300):
        line.extra.append(f"stopped: {stopped}")
    lead = Lead("held-out eval split, read once at the end (seed and accepted candidate)",
                [line], context(data), curves=curves)  # fmt: skip
    path: list[Node] = []
    node, seen = accepted, set()
    while node is not None and node.parent is not None and id(node) not in seen:
        seen.add(id(node))  # a parent cycle ends the walk
        path.append(node)
        node = by_id.get(node.parent)
    path.reverse()
    archive = data.run_dir / "archive"
    total = diff_text(_source([archive / root.id] if root else [], "harness.py", data),
                      _source([archive / accepted.id] if accepted else [], "harness.py", data)
                      ) if len(path) > 1 else None  # fmt: skip
    lead.changes = _changes(path, total, "archive/")
    lead.changes_title = "What the accepted candidate changed (its ancestry from the seed)"
    _count_note(lead, path, "no candidate was accepted over the seed")
    return lead


def eval_lead(data: RunData, ledger: Sequence[dict[str, Any]]) -> Lead:
    """The eval's accuracy: k/n of its outcomes (one per question), else summary.json's."""
    s = data.summary_json or {}
    by_q: dict[str, bool] = {}
    for i, row in enumerate(ledger):
        if isinstance(row.get("correct"), bool):
            by_q[str_or_none(row.get("question_id")) or f"#{i}"] = row["correct"]
    r = reading(sum(by_q.values()), len(by_q)) if by_q else reading(
        n=s.get("n"), accuracy=s.get("accuracy"))  # fmt: skip
    if r.accuracy is None:
        data.note("answer", "no outcome recorded")
    return Lead("one eval: every question once", [Line("accuracy", [("harness", r)])],
                context(data))  # fmt: skip


def cotrain_lead(data: RunData, reads: Sequence[dict[str, Any]],
                 summary: Sequence[dict[str, Any]], curves: list[int]) -> Lead:  # fmt: skip
    """Per schedule base -> final eval read, its training rollouts and stagewise crossing."""
    order: list[str] = []
    by: dict[str, list[dict[str, Any]]] = {}
    for r in reads:
        name = str(r.get("schedule"))
        if name not in by:
            order.append(name)
        by.setdefault(name, []).append(r)
    cost = {str(r.get("schedule")): r for r in summary if isinstance(r, dict)}
    lead = Lead("eval split, read at every phase boundary for the curves (nothing is chosen on "
                "it): the start read (base) and the last one (final), per schedule",
                context=context(data), curves=curves)  # fmt: skip
    for name in order:
        rows = sorted(by[name], key=lambda r: num(r.get("training_rollouts")) or 0.0)
        start = next((r for r in rows if r.get("boundary") == "start"), None)
        steps = [("base", _read_row(start))] if start is not None else []
        steps.append(("final", _read_row(rows[-1])))
        line = Line(name, steps)
        spent = num(rows[-1].get("training_rollouts"))
        if spent is not None:
            line.extra.append(f"final read after {human(spent)} training rollouts")
        line.extra += _cost(cost.get(name))
        lead.lines.append(line)
    if not order:
        lead.notes.append("no eval read recorded")
    lead.lines += _diagnosis(data)
    return lead


def _read_row(r: dict[str, Any]) -> Reading:
    return reading(n=r.get("n"), accuracy=r.get("accuracy"))


def _cost(row: dict[str, Any] | None) -> list[str]:
    """The schedule's training rollouts (ledger) and where it passes stagewise's final."""
    if row is None:
        return []
    out = []
    if (spent := num(row.get("training_rollouts"))) is not None:
        out.append(f"{human(spent)} training rollouts in all (ledger)")
    frac, at = num(row.get("crossing_fraction")), num(row.get("crossing_rollouts"))
    if frac is not None and at is not None:
        out.append(f"passes stagewise's final eval accuracy at {human(frac)} of stagewise's "
                   f"training rollouts ({human(at)})")  # fmt: skip
    elif num(row.get("stagewise_final")) is not None and row.get("schedule") != "stagewise":
        out.append("never passes stagewise's final eval accuracy")
    return out


def _diagnosis(data: RunData) -> list[Line]:
    """A diagnose run's verdict per capability (diagnosis.json), as lines without readings."""
    path = data.run_dir / "diagnosis.json"
    d = json_file(path, data, "answer") if path.exists() else None
    caps = d.get("capabilities") if isinstance(d, dict) else None
    rows = [c for c in caps if isinstance(c, dict)] if isinstance(caps, list) else []
    return [Line(f"diagnosis, {cap_text(str(c.get('capability')), 100)}: "
                 f"{cap_text(str(c.get('verdict')), 100)}", []) for c in rows[:50]]  # fmt: skip


def proposer_lead(data: RunData, readings: Sequence[dict[str, Any]], curves: list[int]) -> Lead:
    """Per proposer and family: the seed's score -> the ratchet's, with the mean proposal."""
    lead = Lead("evaluation readings per family: the seed harness's score, then the ratchet's "
                "(the readings record no n)", context=context(data), curves=curves)  # fmt: skip
    for r in readings[:50]:
        line = Line(f"{cap_text(str(r.get('proposer')), 100)} on "
                    f"{cap_text(str(r.get('family')), 100)}",
                    [("seed", reading(accuracy=r.get("seed_score"))),
                     ("ratchet", reading(accuracy=r.get("ratchet")))])  # fmt: skip
        mean, scores = num(r.get("mean")), r.get("scores")
        if mean is not None and isinstance(scores, list):
            line.extra.append(f"mean proposal {human(mean)} over {len(scores)}")
        lead.lines.append(line)
    if not readings:
        lead.notes.append("no evaluation reading recorded (evaluate/readings.json)")
    return lead
