"""`whale report`: the HTML page of adapt, search, cotrain and train-proposer run directories
written by hand here (the records' shapes of whale/revise, whale/search, whale/cotrain and
whale/train/proposer), hostile text escaped, garbage noted instead of a crash."""

import base64
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import whale.cli.report  # noqa: F401  (registers `whale report` on app)
from whale.analysis.report import build_report
from whale.analysis.report_runs import load_run
from whale.cli import app

HOSTILE = "</pre><script>alert(1)</script>"
SEED = "def run(question, env):\n    return env.llm([{'role': 'user', 'content': question}])\n"
CHILD = SEED + f"# {HOSTILE}\n"
GRANDCHILD = CHILD + "# second edit\n"


def _jsonl(path: Path, rows: list, garbage: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + ("this is not json\n" if garbage else ""))


def _json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _outcome(h: str, split: str, correct: bool, fmt: bool = True, **tags) -> dict:
    return {"fingerprint": "f", "harness": h, "split": split, "question_id": "q",
            "answer": "1", "score": float(correct), "correct": correct, "status": "ok",
            "error": None, "format_ok": fmt, "truncated": False, "retrieval_hit": None,
            **tags}  # fmt: skip


def _cand(t: int, i: int, parent: str, h: str | None, score: float | None, reason: str = ""):
    return {"round": t, "index": i, "parent_hash": parent, "hash": h, "valid": h is not None,
            "reason": reason, "mode": "blocks", "parses": h is not None, "runnable": True,
            "rho_run": 1.0, "score": score, "reward": 0.0, "n_scored": 4}  # fmt: skip


def make_adapt(d: Path) -> Path:
    """seed -> r1.0 (valid, source holds HOSTILE) -> r2.0; r1.1 invalid with a hostile reason."""
    (d / "harnesses").mkdir(parents=True)
    for h, src in (("aaaa", SEED), ("bbbb", CHILD), ("cccc", GRANDCHILD)):
        (d / "harnesses" / f"{h}.py").write_text(src)
    (d / "config.toml").write_text('rounds = 2\ng = 2\n[task]\nid = "rg:gcd"\n')
    _json(d / "seed.json", {"harness": "single_call", "hash": "aaaa"})
    _json(
        d / "round_01" / "candidates.json",
        [_cand(1, 0, "aaaa", "bbbb", 0.5), _cand(1, 1, "aaaa", None, None, f"apply: {HOSTILE}")],
    )
    _json(
        d / "round_01" / "decision.json",
        {
            "kept_hash": "bbbb",
            "kept_score": 0.5,
            "parent_hash": "aaaa",
            "parent_score": 0.25,
            "chosen": 0,
            "rule": "ratchet",
            "why": "up",
        },
    )
    _json(d / "round_02" / "candidates.json", [_cand(2, 0, "bbbb", "cccc", 0.75)])
    _json(
        d / "round_02" / "decision.json",
        {
            "kept_hash": "cccc",
            "kept_score": 0.75,
            "parent_hash": "bbbb",
            "parent_score": 0.5,
            "chosen": 0,
            "rule": "ratchet",
            "why": "up",
        },
    )
    rows = [_outcome("aaaa", "score", c) for c in (True, False, False, False)]
    rows += [_outcome("bbbb", "score", c, fmt=c) for c in (True, True, False, False)]
    _jsonl(d / "outcomes.jsonl", rows, garbage=True)
    _json(
        d / "eval_read.json",
        {
            "purpose": "final eval: seed and final harness",
            "harnesses": ["aaaa", "cccc"],
            "n": 8,
            "at": "2026-12-01T10:00:00",
            "question_ids": [],
        },
    )
    return d


def make_search(d: Path) -> Path:
    for cid, parent, src, score in (("c0000", None, SEED, 0.2), ("c0100", "c0000", CHILD, 0.6)):
        (d / "archive" / cid).mkdir(parents=True)
        (d / "archive" / cid / "harness.py").write_text(src)
        _json(d / "archive" / cid / "meta.json", {"id": cid, "parent_id": parent,
              "iteration": 0 if parent is None else 1, "hypothesis": "h", "hash": cid + "h",
              "valid": True, "reason": "", "score": score})  # fmt: skip
    _json(d / "sessions" / "c0100.json", {"ended": "submitted"})
    _jsonl(d / "outcomes.jsonl", [_outcome("c0000h", "search", True)])
    return d


def make_cotrain(d: Path, bad_read: bool = False) -> Path:
    """One schedule: 4 weight rows in cycle 1, then reads at start (0) and after weight (4)."""
    s = d / "adaptive"
    tags = {"schedule": "adaptive", "cycle": 1, "phase": "weight", "kind": "weight_sample"}
    ledger = [_outcome("aaaa", "train", c, **tags) for c in (True, False, True, True)]
    _jsonl(s / "outcomes.jsonl", ledger)
    read = {"schedule": "adaptive", "cycle": 1, "boundary": "weight", "n": 10,
            "training_rollouts": 5 if bad_read else 4, "accuracy": 0.6, "score": 0.6,
            "harness": "aaaa", "adapter": "ad", "at": 1796146956.0}  # fmt: skip
    start = dict(read, cycle=0, boundary="start", training_rollouts=0, accuracy=0.3, adapter=None)
    _jsonl(s / "reads.jsonl", [start, read])
    _jsonl(s / "weight" / "steps.jsonl", [{"step": 0, "reward": 0.25}, {"step": 1, "reward": 0.5}])
    (d / "config.toml").write_text('schedules = ["adaptive"]\nrollouts = 8\n')
    return d


def make_proposer(d: Path) -> Path:
    (d / "contexts").mkdir(parents=True)
    _json(d / "evaluate" / "readings.json", [{"proposer": "trained", "family": "rg:lcm",
          "seed_score": 0.1, "scores": [1.0, 0.0], "valid": 1, "ratchet": 1.0, "mean": 0.5,
          "oracle": 1.0}])  # fmt: skip
    _jsonl(
        d / "grpo" / "phase_1" / "updates.jsonl",
        [{"update": 1, "reward_mean": 0.2}, {"update": 2, "reward_mean": 0.4}],
    )
    _json(d / "teacher" / "summary.json", {"proposals": 9, "kept": 2, "rejected": {"apply": 1}})
    _json(
        d / "rollouts" / "rg_lcm" / "eval_read.json",
        {
            "purpose": "train-proposer evaluate",
            "harnesses": ["x"],
            "n": 20,
            "at": "2026-12-01T11:00:00",
            "question_ids": [],
        },
    )
    return d


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


AUDIT = {"harnesses": [{"hash": "bbbb", "family": "rg:gcd", "class": "single_call",
                        "structural": [], "functional": None, "evidence": ["one env.llm call"]}],
         "counts": {"rg:gcd": {"single_call": 1}},
         "screens": [{"hash": "bbbb", "screen": "answer_echo", "passed": False,
                      "evidence": [f"literal {HOSTILE}"]}]}  # fmt: skip


def test_adapt_report_holds_lineage_diffs_curves_metrics_reads_and_escapes(tmp_path):
    run = make_adapt(tmp_path / "run")
    page = build_report(run, audit=AUDIT).read_text()
    assert (run / "report.html").is_file()
    assert "<script" not in page  # every hostile string is text
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # the lineage is nested: r2.0 sits inside r1.0's list item, which sits inside the seed's
    seed = page.index('id="node-seed"')
    r10, r20 = page.index('id="node-r1.0"'), page.index('id="node-r2.0"')
    assert seed < r10 < r20 and "</li>" not in page[r10:r20]
    assert "invalid: apply: &lt;/pre&gt;" in page  # the invalid candidate and its reason
    assert "+# second edit" in page  # the difflib diff of r2.0 against r1.0's source
    pngs = _pngs(page)
    assert pngs and all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert "1 line(s) not a JSON object, skipped" in page  # the garbage ledger line: a note
    assert "final eval: seed and final harness" in page  # the split read
    assert "answer_echo" in page and "one env.llm call" in page  # the audit passed in
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing external


def test_adapt_data_capability_metrics_and_compliance(tmp_path):
    data = load_run(make_adapt(tmp_path / "run"))
    assert data.kind == "adapt"
    table = data.metrics[0]
    by = {(r[0], r[1]): dict(zip(table.columns, r, strict=True)) for r in table.rows}
    assert by[("score", "aaaa")]["accuracy"] == 0.25 and by[("score", "aaaa")]["n"] == 4
    assert by[("score", "bbbb")]["format_compliance"] == 0.5
    assert data.compliance[0].rows == [["adapt rounds", 3, 2, 2, "67%"]]


def test_search_report_diffs_sources_and_counts_sessions(tmp_path):
    run = make_search(tmp_path / "run")
    data = load_run(run)
    assert data.kind == "search"
    nodes = {n.id: n for n in data.lineages[0].nodes}
    assert nodes["c0100"].parent == "c0000" and nodes["c0100"].kept
    assert nodes["c0100"].diff is not None and "+# </pre>" in nodes["c0100"].diff
    page = build_report(run, out=tmp_path / "x.html", audit=AUDIT).read_text()
    assert "submitted" in page and "<script" not in page


def test_cotrain_report_draws_eval_against_rollouts_and_phase_metrics(tmp_path):
    data = load_run(make_cotrain(tmp_path / "run"))
    assert data.kind == "cotrain" and "curves" not in data.notes
    curve = data.curves[0]
    assert curve.series == {"adaptive": [(0.0, 0.3), (4.0, 0.6)]}
    phase = dict(zip(data.metrics[0].columns, data.metrics[0].rows[0], strict=True))
    assert phase["rollouts"] == 4 and phase["accuracy"] == 0.75 and phase["eval_accuracy"] == 0.6
    assert data.reads is not None and len(data.reads.rows) == 2


def test_cotrain_read_that_disagrees_with_the_ledger_is_drawn_with_a_note(tmp_path):
    data = load_run(make_cotrain(tmp_path / "run", bad_read=True))
    assert any("not checked against the ledger" in n for n in data.notes["curves"])
    assert data.curves[0].series["adaptive"][-1] == (5.0, 0.6)


def test_train_proposer_report_reads_grpo_readings_and_teacher(tmp_path):
    run = make_proposer(tmp_path / "run")
    data = load_run(run)
    assert data.kind == "train-proposer"
    assert data.curves[0].series == {"phase_1": [(1.0, 0.2), (2.0, 0.4)]}
    shares = {t.title: t.rows for t in data.compliance}
    assert shares["proposals that applied (evaluation readings)"] == [
        ["trained", "rg:lcm", 1, 2, "50%"]
    ]
    assert ["rejected: apply", 1] in shares["teacher proposals"]
    assert data.reads is not None and data.reads.rows[0][3] == "train-proposer evaluate"
    build_report(run, audit=AUDIT)


def test_garbage_and_partial_runs_give_a_report_with_notes(tmp_path):
    run = make_adapt(tmp_path / "run")
    (run / "round_02" / "candidates.json").write_text("{cut")
    (run / "round_01" / "decision.json").write_bytes(b"\xff\xfe")
    (run / "eval_read.json").write_text("[1, 2")
    page = build_report(run, audit={"harnesses": "nonsense", "screens": [3]}).read_text()
    assert "round_02/candidates.json: unreadable" in page
    assert "eval_read.json: unreadable" in page
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "junk.jsonl").write_bytes(b"\x00\x01")
    page = build_report(unknown, audit=AUDIT).read_text()
    assert "unknown run kind" in page and "config.toml: missing" in page
    assert "no record of a split read" in page


def test_missing_audit_module_is_a_visible_note(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "whale.analysis.audit", None)  # import -> ImportError
    page = build_report(make_search(tmp_path / "run")).read_text()
    assert "the audit module (whale.analysis.audit) is missing" in page


def test_cli_report_prints_the_path_and_refuses_a_missing_folder(tmp_path):
    run = make_cotrain(tmp_path / "run")
    out = tmp_path / "out" / "r.html"
    res = CliRunner().invoke(app, ["report", str(run), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["report"] == str(out) and out.is_file()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2


REAL = Path(__file__).resolve().parents[2] / "runs"


@pytest.mark.parametrize("name", ["cotrain-letter", "cotrain-chain", "proposer-real"])
def test_real_run_dirs_render(tmp_path, name):
    run = REAL / name
    if not run.is_dir():
        pytest.skip(f"{run} is not on this machine")
    page = build_report(run, out=tmp_path / "r.html", audit=AUDIT).read_text()
    data = load_run(run)
    assert data.lineages and all(lin.nodes for lin in data.lineages)
    assert len(_pngs(page)) == len(data.curves) > 0
    assert not (run / "r.html").exists()


def test_audit_module_is_called_lazily_and_its_failure_is_a_note(tmp_path, monkeypatch):
    import types

    run = make_search(tmp_path / "run")
    seen = []

    class Audit:
        def to_json(self):
            return AUDIT

    def audit_run(run_dir):
        seen.append(run_dir)
        return Audit()

    fake = types.ModuleType("whale.analysis.audit")
    fake.audit_run = audit_run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "whale.analysis.audit", fake)
    page = build_report(run).read_text()
    assert seen == [run] and "one env.llm call" in page

    def broken(run_dir):
        raise ValueError("cut record")

    fake.audit_run = broken  # type: ignore[attr-defined]
    page = build_report(run).read_text()
    assert "the audit failed: ValueError: cut record" in page
