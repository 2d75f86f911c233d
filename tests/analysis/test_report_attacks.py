"""`whale report` on hostile run directories (the reviewer's findings 1-4, 10, 15, 17): links
out of the run, FIFOs, huge or deeply nested files, duplicate ids, parent cycles, numbers a
clock cannot place and folder names that only look like numbers. Each builds on the adapt run
of test_report.py and asserts what the page shows (or that the CLI refuses)."""

import contextlib
import json
import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

import whale.cli.report  # noqa: F401  (registers `whale report` on app)
from whale.analysis.report import build_report
from whale.analysis.report_runs import load_run
from whale.cli import app

from .test_report import SEED, _json, make_adapt, make_cotrain

SECRET = "TOP-SECRET-TOKEN-5d1f"


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when the block runs longer than `seconds`."""

    def _raise(*_):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _secret(tmp_path: Path) -> Path:
    p = tmp_path / "outside" / "secret.txt"  # outside the run dir tmp_path/run
    p.parent.mkdir()
    p.write_text(f"{SECRET}\n")
    return p


def _lineage_html(page: str) -> str:
    return page.split('<h2 id="lineage">')[1].split('<h2 id="curves">')[0]


# --- finding 1: links out of the run ----------------------------------------------------------


def test_symlinked_diff_and_harness_are_not_quoted(tmp_path):
    secret = _secret(tmp_path)
    d = make_adapt(tmp_path / "run")
    os.symlink(secret, d / "round_01" / "candidate_0.diff")
    os.unlink(d / "harnesses" / "cccc.py")
    os.symlink(secret, d / "harnesses" / "cccc.py")
    page = build_report(d).read_text()
    assert SECRET not in page
    assert "round_01/candidate_0.diff: a link out of the run directory" in page
    assert "harnesses/cccc.py: a link out of the run directory" in page
    # r1.0's diff falls back to the sources inside the run: still shown
    assert "+# &lt;/pre&gt;&lt;script&gt;" in page


def test_symlinked_config_and_records_are_not_quoted(tmp_path):
    secret = _secret(tmp_path)
    (secret.parent / "cfg.toml").write_text(f'token = "{SECRET}"\n')
    d = make_adapt(tmp_path / "run")
    os.unlink(d / "config.toml")
    os.symlink(secret.parent / "cfg.toml", d / "config.toml")
    (secret.parent / "c.json").write_text(json.dumps([{"round": 1, "index": 0, "hash": SECRET,
                                                        "parent_hash": "aaaa"}]))  # fmt: skip
    os.unlink(d / "round_02" / "candidates.json")
    os.symlink(secret.parent / "c.json", d / "round_02" / "candidates.json")
    page = build_report(d).read_text()
    assert SECRET not in page
    assert "config.toml: a link out of the run directory" in page
    assert "round_02/candidates.json: a link out of the run directory" in page


def test_a_link_inside_the_run_is_still_read(tmp_path):
    d = make_adapt(tmp_path / "run")
    (d / "round_01" / "candidate_0.diff").write_text("+inside the run\n")
    os.symlink("candidate_0.diff", d / "round_01" / "candidate_1.diff")
    nodes = {n.id: n for n in load_run(d).lineages[0].nodes}
    assert nodes["r1.1"].diff == "+inside the run\n"


# --- findings 2 and 17: duplicate ids ---------------------------------------------------------


def _dup(p, h):
    return {"round": 1, "index": 0, "parent_hash": p, "hash": h, "valid": True, "reason": "",
            "score": 0.5}  # fmt: skip


def test_duplicate_node_ids_draw_each_candidate_once(tmp_path):
    d = make_adapt(tmp_path / "run")
    _json(d / "round_01" / "candidates.json",
          [_dup("aaaa", "bbbb"), _dup("bbbb", "x1"), _dup("bbbb", "x2")])  # fmt: skip
    with deadline(20):
        data = load_run(d)
        page = build_report(d, audit={}).read_text()
    ids = [n.id for n in data.lineages[0].nodes]
    assert len(ids) == len(set(ids)) and {"r1.0", "r1.0#1", "r1.0#2"} <= set(ids)
    parents = {n.id: n.parent for n in data.lineages[0].nodes}
    assert parents["r1.0#1"] == parents["r1.0#2"] == "r1.0"
    tree = _lineage_html(page)
    assert tree.count('class="lineage-node"') == len(ids)  # every node once, none lost


def test_node_id_attributes_are_unique_across_lineages(tmp_path):
    d = make_cotrain(tmp_path / "run")
    for phase in ("phase_1", "phase_2"):  # two harness phases, both with a round r1.0
        _json(d / "adaptive" / "harness" / phase / "round_01" / "candidates.json",
              [_dup("aaaa", f"{phase}h")])  # fmt: skip
    page = build_report(d, audit={}).read_text()
    ids = Counter(re.findall(r'\bid="([^"]*)"', page))
    assert ids["node-r1.0"] == 1 and ids["node-r1.0-2"] == 1
    assert all(v == 1 for v in ids.values()), [k for k, v in ids.items() if v > 1]


# --- finding 3: FIFOs -------------------------------------------------------------------------


def test_fifo_in_the_run_is_a_note_not_a_hang(tmp_path):
    d = make_adapt(tmp_path / "run")
    os.mkfifo(d / "round_01" / "candidate_1.diff")
    os.unlink(d / "config.toml")
    os.mkfifo(d / "config.toml")
    with deadline(10):
        page = build_report(d, audit={}).read_text()
    assert "round_01/candidate_1.diff: not a regular file" in page
    assert "config.toml: not a regular file" in page


def test_fifo_ledger_of_a_cotrain_run_is_a_note_not_a_hang(tmp_path):
    d = make_cotrain(tmp_path / "run")
    os.unlink(d / "adaptive" / "outcomes.jsonl")
    os.mkfifo(d / "adaptive" / "outcomes.jsonl")
    with deadline(10):
        data = load_run(d)
    assert any("adaptive/outcomes.jsonl: not a regular file" in n for n in data.notes["curves"])
    assert data.curves[0].series["adaptive"] == [(0.0, 0.3), (4.0, 0.6)]  # drawn unchecked


# --- finding 4: crashes -----------------------------------------------------------------------


@pytest.mark.parametrize("line", ['{"at": 1e300, "cycle": 1, "n": 3}', '{"at": NaN, "cycle": 1}',
                                  '{"at": -1e20, "cycle": 1}'])  # fmt: skip
def test_timestamps_no_clock_places_do_not_crash(tmp_path, line):
    d = make_adapt(tmp_path / "run")
    (d / "sched").mkdir()
    (d / "sched" / "reads.jsonl").write_text(line + "\n")
    data = load_run(d)
    assert data.reads is not None
    row = next(r for r in data.reads.rows if r[0] == "sched/reads.jsonl")
    assert row[2] == "-" or "not a time" in row[2]


def test_round_folder_with_a_superscript_digit(tmp_path):
    d = make_adapt(tmp_path / "run")
    os.rename(d / "round_02", d / "round_2\u00b2")
    data = load_run(d)
    node = next(n for n in data.lineages[0].nodes if n.hash == "cccc")
    assert node.label == "round_2\u00b2" and node.id == "r2\u00b2.0"
    build_report(d, audit={})


def test_deeply_nested_config_and_summary_are_notes(tmp_path):
    d = make_adapt(tmp_path / "run")
    (d / "config.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    v: object = 1
    for _ in range(900):
        v = {"k": v}
    (d / "summary.json").write_text(json.dumps(v))
    page = build_report(d, audit={}).read_text()
    assert "config.toml: unreadable (RecursionError)" in page


def test_huge_ledger_is_refused_by_size(tmp_path):
    d = make_adapt(tmp_path / "run")
    with open(d / "outcomes.jsonl", "r+b") as f:
        f.truncate(65 * 2**20)  # sparse: no disk, but over the 64 MiB limit
    with deadline(20):
        page = build_report(d, audit={}).read_text()
    assert re.search(r"outcomes\.jsonl: \d+ bytes, over the limit of \d+: not read", page)


def test_infinite_score_is_not_plotted(tmp_path):
    d = make_adapt(tmp_path / "run")
    (d / "round_02" / "candidates.json").write_text(
        '[{"round": 2, "index": 0, "parent_hash": "bbbb", "hash": "cccc", "valid": true,'
        ' "score": Infinity}]')  # fmt: skip
    data = load_run(d)
    assert all(p[1] != float("inf") for c in data.curves for s in c.series.values() for p in s)
    build_report(d, audit={})


# --- finding 10: parent cycles ----------------------------------------------------------------


def test_parent_cycle_and_self_parent_are_drawn_as_unreachable(tmp_path):
    d = tmp_path / "run" / "archive"
    for cid, pid in (("c0000", None), ("c0101", "c0102"), ("c0102", "c0101"), ("c0103", "c0103"),
                     ("c0104", "c0999")):  # fmt: skip
        (d / cid).mkdir(parents=True)
        (d / cid / "harness.py").write_text(SEED + f"# {cid}\n")
        _json(d / cid / "meta.json", {"id": cid, "parent_id": pid, "hash": cid, "valid": True,
                                      "score": 0.9 if cid == "c0102" else 0.1,
                                      "iteration": 1})  # fmt: skip
    with deadline(20):
        tree = _lineage_html(build_report(tmp_path / "run", audit={}).read_text())
    for cid in ("c0000", "c0101", "c0102", "c0103", "c0104"):
        assert tree.count(f'id="node-{cid}"') == 1, cid
    unreachable = tree.split("unreachable (parent cycle or missing parent)")[1]
    assert all(f'id="node-{c}"' in unreachable for c in ("c0101", "c0102", "c0103", "c0104"))
    assert 'id="node-c0000"' not in unreachable
    assert "4 candidate(s) no root reaches (1 with a parent id that names no candidate" in tree


def test_a_chain_deeper_than_the_tree_nesting_is_drawn_whole(tmp_path):
    d = tmp_path / "run" / "archive"
    n = 450  # deeper than any nesting the tree allows (MAX_DEPTH; the browser's parser stops at 512)
    for i in range(n):
        cid = f"c{i:04d}"
        (d / cid).mkdir(parents=True)
        _json(d / cid / "meta.json", {"id": cid, "parent_id": f"c{i - 1:04d}" if i else None,
                                      "valid": True, "score": 0.1, "iteration": i})  # fmt: skip
    tree = _lineage_html(build_report(tmp_path / "run", audit={}).read_text())
    assert tree.count('class="lineage-node"') == n
    assert tree.count("<ul") == tree.count("</ul>") and tree.count("<li") == tree.count("</li>")
    assert re.search(r"deeper than \d+ levels, continued", tree)


# --- finding 15: a folder with no run --------------------------------------------------------


def test_cli_refuses_a_folder_without_run_records(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "junk.jsonl").write_bytes(b"\x00")
    res = CliRunner().invoke(app, ["report", str(empty)])
    assert res.exit_code == 2 and "no run records found in" in res.output
    assert not (empty / "report.html").exists()
    cut = tmp_path / "cut"  # an adapt run killed before round 1: still a report, with notes
    cut.mkdir()
    (cut / "config.toml").write_text("rounds = 2\n")
    res = CliRunner().invoke(app, ["report", str(cut)])
    assert res.exit_code == 0, res.output
    assert "unknown run kind" in (cut / "report.html").read_text()
