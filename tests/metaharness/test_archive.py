import json

import pytest

from whale.harness import Trajectory, harness_hash
from whale.metaharness import Archive, ArchiveError, CandidateMeta

SRC = "def run(question, env):\n    return 'x'\n"
SRC2 = "def run(question, env):\n    return 'y'\n"


def meta(cid, source, parent=None, score=0.5, it=0, accuracy=0.5, solver=None):
    return CandidateMeta(cid, parent, it, f"hypothesis {cid}", harness_hash(source), True,
                         score=score, accuracy=accuracy, n_scored=2, solver=solver)


def outcome(qid, correct=True):
    return {"question_id": qid, "answer": "a\u2028b", "score": float(correct), "correct": correct,
            "status": "ok", "error": None}


def test_round_trip(tmp_path):
    a = Archive(tmp_path / "archive", ["q1", "q2"])
    a.add(meta("c0000", SRC), SRC, [outcome("q1"), outcome("q2", False)],
          [Trajectory("q1", harness_hash(SRC))])
    b = Archive(tmp_path / "archive", ["q1", "q2"])
    assert b.candidates() == a.candidates()
    assert b.source("c0000") == SRC
    assert [o["answer"] for o in b.outcomes("c0000")] == ["a\u2028b", "a\u2028b"]
    assert set(b.trajectories("c0000")) == {"q1"}
    assert json.loads((tmp_path / "archive/c0000/meta.json").read_text())["hypothesis"]


def test_outcomes_outside_the_search_split_are_refused(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    with pytest.raises(ArchiveError, match="outside the search split"):
        a.add(meta("c0000", SRC), SRC, [outcome("q1"), outcome("eval-7")])
    assert not (tmp_path / "archive/c0000").exists()
    assert "eval-7" not in "".join(p.read_text() for p in (tmp_path / "archive").rglob("*")
                                   if p.is_file())


def test_best_is_the_archive_best_and_ties_go_to_the_earlier(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(meta("c0000", SRC, score=0.5), SRC)
    a.add(meta("c0001", SRC2, "c0000", score=0.9, it=1), SRC2)  # the same accuracy
    assert a.best().id == "c0000"


def test_the_ranking_is_by_accuracy_not_the_partial_score(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(meta("c0000", SRC, score=0.9, accuracy=0.4), SRC)
    a.add(meta("c0100", SRC2, "c0000", score=0.6, accuracy=0.6, it=1), SRC2)
    assert [m.id for m in a.top(2)] == ["c0100", "c0000"]


def test_only_scores_under_the_viewed_solver_rank(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(meta("c0000", SRC, accuracy=0.9, solver="A"), SRC)
    a.add(meta("c0100", SRC2, "c0000", accuracy=0.2, it=1, solver="B"), SRC2)
    a.view("B", None)
    assert [m.id for m in a.top(5)] == ["c0100"] and [m.id for m in a.earlier(5)] == ["c0000"]
    a.view("B", 0)  # up to iteration 0: c0100 is not reached yet
    assert a.top(5) == []


def test_ids_past_iteration_99_keep_their_order(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(meta("c9900", SRC, it=99), SRC)
    a.add(meta("c10000", SRC2, it=100), SRC2)
    again = Archive(tmp_path / "archive", ["q1"])
    assert [m.id for m in again.candidates()] == ["c9900", "c10000"]


def test_invalid_candidate_is_archived_with_its_reason_and_no_score(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(meta("c0000", SRC), SRC)
    bad = CandidateMeta("c0001", "c0000", 1, "h", None, False, "block 1: SEARCH text not found")
    a.add(bad, None)
    again = Archive(tmp_path / "archive", ["q1"])
    assert again.get("c0001").reason.startswith("block 1")
    assert [m.id for m in again.top(5)] == ["c0000"]


def test_duplicate_hash_is_found_for_reuse(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(meta("c0000", SRC), SRC)
    assert a.by_hash(harness_hash(SRC)).id == "c0000"
    assert a.by_hash(harness_hash(SRC2)) is None


def test_a_killed_write_leaves_no_half_candidate(tmp_path):
    root = tmp_path / "archive"
    a = Archive(root, ["q1"])
    a.add(meta("c0000", SRC), SRC)
    (root / ".tmp-c0001").mkdir()  # a kill between writing and renaming
    (root / ".tmp-c0001/harness.py").write_text(SRC2)
    with open(root / "summary.jsonl", "w") as f:  # and summary.jsonl lost its last row
        f.write("")
    b = Archive(root, ["q1"])
    assert [m.id for m in b.candidates()] == ["c0000"]
    assert not (root / ".tmp-c0001").exists()
    assert len((root / "summary.jsonl").read_text().splitlines()) == 1


def test_an_edited_harness_file_is_refused(tmp_path):
    a = Archive(tmp_path / "archive", ["q1"])
    a.add(meta("c0000", SRC), SRC)
    (tmp_path / "archive/c0000/harness.py").write_text(SRC2)
    with pytest.raises(ArchiveError, match="does not match its hash"):
        a.source("c0000")
