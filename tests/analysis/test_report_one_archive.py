"""`whale report` and the audit's run scan on a cotrain schedule whose harness phases share one
archive (`harness/archive`, `harness/sessions`; issue 21): one lineage, the best marked by
accuracy under the latest solver, starts and rescores not counted as proposals."""

import json
from pathlib import Path

from tests.analysis.test_report import make_cotrain
from whale.analysis.report_runs import load_run
from whale.analysis.run_files import scan_run

SEED = "def run(question, env):\n    return env.llm(question).text\n"
CHILD = SEED + "# one\n"
OTHER = SEED + "# two\n"


def _candidate(archive: Path, cid: str, parent, it: int, src: str, phase: int, solver: str,
               accuracy: float, score: float, origin: str = "proposal") -> None:  # fmt: skip
    (archive / cid).mkdir(parents=True)
    (archive / cid / "harness.py").write_text(src)
    (archive / cid / "meta.json").write_text(json.dumps({
        "id": cid, "parent_id": parent, "iteration": it, "hypothesis": "h", "hash": f"h{src[-3:]}",
        "valid": True, "reason": "", "score": score, "accuracy": accuracy, "n_scored": 4,
        "phase": phase, "solver": solver, "origin": origin}))  # fmt: skip


def make_run(d: Path) -> Path:
    make_cotrain(d)
    archive = d / "adaptive" / "harness" / "archive"
    _candidate(archive, "c0000", None, 0, SEED, 1, "A", 0.25, 0.25, "start")
    _candidate(archive, "c0100", "c0000", 1, CHILD, 1, "A", 1.0, 1.0)  # best under A
    _candidate(archive, "c0101", "c0000", 1, OTHER, 1, "A", 0.75, 0.75)
    _candidate(archive, "c0200", "c0100", 2, CHILD, 2, "B", 0.25, 0.9, "start")
    _candidate(archive, "c0201", "c0101", 2, OTHER, 2, "B", 0.5, 0.5, "rescore")
    _candidate(archive, "c0300", "c0200", 3, CHILD + "#\n", 2, "B", 0.5, 0.6)
    (d / "adaptive" / "harness" / "sessions").mkdir()
    for cid in ("c0100", "c0101", "c0300"):
        (d / "adaptive" / "harness" / "sessions" / f"{cid}.json").write_text(
            json.dumps({"ended": "submitted"}))
    return d


def test_one_archive_is_one_lineage_with_the_best_under_the_latest_solver(tmp_path):
    data = load_run(make_run(tmp_path / "run"))
    (lin,) = [x for x in data.lineages if x.title == "adaptive / archive"]
    kept = [n.id for n in lin.nodes if n.kept]
    # c0100's 1.0 was measured under other weights; under B c0201 and c0300 tie: the earlier
    assert kept == ["c0201"]
    labels = {n.id: n.label for n in lin.nodes}
    assert labels["c0000"] == "seed" and labels["c0200"] == "start, iteration 2"
    assert labels["c0201"] == "rescore, iteration 2" and labels["c0300"] == "iteration 3"
    scores = {n.id: n.score for n in lin.nodes}
    assert scores["c0200"] == 0.25  # the accuracy, not the partial score 0.9
    applied = {row[0]: row[1] for row in data.compliance[0].rows}
    assert applied["adaptive / archive"] == 3  # c0100, c0101, c0300: the proposer's
    assert any(t.title.startswith("adaptive / archive: how proposer sessions ended")
               for t in data.compliance)  # fmt: skip


def test_the_run_scan_places_archive_candidates_in_their_recorded_phase(tmp_path):
    found = scan_run(make_run(tmp_path / "run"), [])
    pos = {s.source.parent.name: s.position for s in found.sites if s.position is not None}
    assert pos["c0100"] == (1, 1, 100) and pos["c0300"] == (2, 3, 300)
