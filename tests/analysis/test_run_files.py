"""Reading run folders: trajectories with garbage, question-id families, and the lineage order
the audit's duplicate screen follows (records, never file times)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.analysis.test_audit import traj
from whale.analysis.run_files import Lineage, family_of, read_trajectories, scan_run


def test_family_of() -> None:
    assert family_of("rg:gcd:0:42") == "rg:gcd"
    assert family_of("mhqa:3:7") == "mhqa"
    assert family_of("hotpotqa:5ab3") is None


def test_garbage_trajectory_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = traj("t:0:1", "4", ("model", "Answer: 4"), h="abc").to_dict()
    path.write_bytes(b"not json\n" + json.dumps(good).encode() + b"\n[1, 2]\n\xff\xfe\n"
                     + json.dumps({**good, "version": 99}).encode() + b"\n")  # fmt: skip
    trajs, notes = read_trajectories(path, "abc")
    assert [t.question_id for t in trajs] == ["t:0:1"]
    assert notes == [f"{path}: 4 line(s) not a trajectory record, skipped"]


def test_order_parents_first_then_position_then_name() -> None:
    lin = Lineage()
    lin.place("kid", (0, 1, 1))
    lin.place("seed", (0, 0, 0))
    lin.place("late", (2, 0, 0))
    lin.link("late", "kid")  # an edge outranks the positions: the parent comes first
    items = {h: (None, name) for h, name in
             (("kid", "a.py"), ("seed", "z.py"), ("late", "m.py"), ("free2", "b.py"),
              ("free1", "a0.py"))}  # fmt: skip
    assert lin.order(items) == ["seed", "late", "kid", "free1", "free2"]
    # a site's own recorded position counts like a lineage record
    assert lin.order({"free1": ((5, 0, 0), "x.py"), "free2": (None, "a.py")}) == ["free1", "free2"]
    # and the earlier of the two when both exist
    assert lin.order({"late": ((0, 0, 1), "z.py"), "kid": (None, "a.py")}) == ["late", "kid"]


def test_order_survives_a_cycle_and_edges_outside_the_group() -> None:
    lin = Lineage()
    lin.place("a", (0, 1, 0))
    lin.place("b", (0, 2, 0))
    lin.link("a", "b")
    lin.link("b", "a")  # hostile: a cycle
    lin.link("elsewhere", "a")  # a parent in another family: ignored
    lin.link("a", "a")  # a self-edge is never recorded
    assert lin.order({"b": (None, "b.py"), "a": (None, "a.py")}) == ["a", "b"]
    assert lin.order({}) == []


def test_scan_run_reads_every_lineage_record(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "harnesses").mkdir(parents=True)
    (run / "seed.json").write_text(json.dumps({"hash": "s"}))
    (run / "round_02").mkdir()
    (run / "round_02" / "candidates.json").write_text(json.dumps(
        [{"index": 1, "parent_hash": "s", "hash": "r"}, "garbage", {"hash": None}]))  # fmt: skip
    arch = run / "adaptive" / "harness" / "phase_03"
    for cid, meta in (("c0000", {"id": "c0000", "iteration": 0, "hash": "a0"}),
                      ("c0102", {"id": "c0102", "parent_id": "c0000", "hash": "a1"}),
                      ("c0201", {"id": "c0201", "parent_id": "../x", "hash": "a2"})):  # fmt: skip
        (arch / cid).mkdir(parents=True)
        (arch / cid / "harness.py").write_text("")
        (arch / cid / "meta.json").write_text(json.dumps(meta))
    (run / "contexts").mkdir()
    (run / "contexts" / "rl_2.json").write_text(json.dumps([{"parent_hash": "p"}]))
    (run / "contexts" / "other.json").write_text(json.dumps([{"parent_hash": "ignored"}]))
    (run / "teacher").mkdir()
    (run / "teacher" / "candidates.jsonl").write_text(
        "{bad\n" + json.dumps({"context": "f/p/0", "result": {"hash": "t"}}) + "\n"
    )
    (run / "grpo" / "phase_2").mkdir(parents=True)
    (run / "grpo" / "phase_2" / "rewards.jsonl").write_text(
        json.dumps({"context": "rg:gcd/p/1", "hash": "g"}) + "\n"
    )
    (run / "phases.jsonl").write_text(json.dumps({"start_harness": "s", "end_harness": "e"}))
    notes: list[str] = []
    found = scan_run(run, notes)
    assert notes == []
    lin = found.lineage
    assert lin.positions == {"s": (0, 0, 0), "r": (0, 2, 2), "p": (2, 0, 0), "t": (0, 1, 0),
                             "g": (2, 1, 0)}  # fmt: skip
    assert lin.edges == {("s", "r"), ("a0", "a1"), ("p", "t"), ("p", "g"), ("s", "e")}
    by_hash = {s.hash: s for s in found.sites}
    assert by_hash["a0"].position == (3, 0, 0)
    assert by_hash["a1"].position == (3, 1, 102)  # no iteration recorded: cJJMM says JJ = 1
    assert by_hash["a1"].parent == arch / "c0000" / "harness.py"
    assert by_hash["a2"].parent is None  # a parent id that leaves the archive is refused
    assert found.datasets == [run / "teacher" / "candidates.jsonl"]
