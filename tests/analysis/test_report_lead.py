"""`whale report` leads with the answer (issue 22): the first section after the title is the
result (held-out k/n with its Wilson interval, before -> after), with the kept edits' diffs and
hypotheses (escaped) and the curve; numbers rounded; the raw config and summary.json last,
collapsed. The run directories are those of test_report.py, completed with a final eval."""

import json
import re
from pathlib import Path

import pytest

from whale.analysis.report import build_report, reading_text
from whale.analysis.report_data import MAX_HYPOTHESIS_CHARS, Reading, human
from whale.analysis.report_runs import load_run
from whale.stats import wilson_ci

from .test_report import AUDIT, SEED, _json, _outcome, make_adapt, make_cotrain, make_proposer
from .test_report import make_search as _make_search

HYPOTHESIS = "Ask for the answer alone <script>alert('hyp')</script> & nothing else."
N = 75


def _eval_rows(h: str, k: int) -> list[dict]:
    return [dict(_outcome(h, "eval", i < k), question_id=f"q{i}") for i in range(N)]


def _append(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _final_eval(d: Path, seed: str, final: str, k_seed: int, k_final: int, **extra) -> None:
    """The records of a final eval: ledger rows, eval_read.json, and a summary.json holding
    the floats a run writes (7/75 = 0.09333333333333334)."""
    _append(d / "outcomes.jsonl", _eval_rows(seed, k_seed) + _eval_rows(final, k_final))
    _json(d / "eval_read.json", {"purpose": "final eval: seed and final harness",
                                 "harnesses": [seed, final], "n": N, "at": "2026-12-01T10:00:00",
                                 "question_ids": [f"q{i}" for i in range(N)]})  # fmt: skip
    _json(d / "summary.json", {"task": "rg:gcd", "eval": N, "wall_s_this_invocation": 12.3456789,
                               "seed_eval": {"accuracy": k_seed / N, "hash": seed},
                               "final_eval": {"accuracy": k_final / N, "hash": final,
                                              "mean_score": 0.5212121212121212}, **extra})  # fmt: skip


def adapt_run(tmp_path: Path) -> Path:
    """make_adapt (seed aaaa -> r1.0 bbbb -> r2.0 cccc, both kept), round 1's proposal opening
    with a hostile hypothesis, and a final eval: seed 7/75, final 39/75."""
    d = make_adapt(tmp_path / "adapt")
    _json(d / "round_01" / "proposals.json", [{"index": 0, "seed": 1, "finish_reason": "stop",
          "text": f"{HYPOTHESIS}\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n"}])  # fmt: skip
    _final_eval(d, "aaaa", "cccc", 7, 39)
    return d


def search_run(tmp_path: Path) -> Path:
    """make_search (c0000 -> c0100, accepted), c0100's meta.json hypothesis hostile, and a
    final eval: seed 15/75, accepted 30/75."""
    d = _make_search(tmp_path / "search")
    meta = json.loads((d / "archive" / "c0100" / "meta.json").read_text())
    _json(d / "archive" / "c0100" / "meta.json", dict(meta, hypothesis=HYPOTHESIS))
    _final_eval(d, "c0000h", "c0100h", 15, 30, **{"seed search accuracy": 0.2000000000000001,
                "accepted search accuracy": 0.6000000000000001, "stopped": "iterations"})
    s = json.loads((d / "summary.json").read_text())
    s["final_eval"]["id"] = "c0100"  # the accepted candidate, as search writes it
    _json(d / "summary.json", s)
    return d


def cotrain_run(tmp_path: Path) -> Path:
    """make_cotrain: schedule adaptive, eval read 0.3 of 10 at the start, 0.6 after 4 rollouts."""
    d = make_cotrain(tmp_path / "cotrain")
    _json(d / "summary.json", {"task": "rg:gcd", "wall_s (this invocation)": 3.14159265358979})
    return d


def eval_run(tmp_path: Path) -> Path:
    """A `whale eval` run: harness.py, 9 outcomes (6 correct), summary.json."""
    d = tmp_path / "eval"
    d.mkdir()
    (d / "harness.py").write_text(SEED)
    (d / "config.toml").write_text('harness = "single_call"\nn = 9\n[task]\nid = "rg:gcd"\n')
    rows = [{"question_id": f"q{i}", "answer": "1", "score": float(i < 6), "correct": i < 6,
             "status": "ok", "format_ok": True, "truncated": False, "retrieval_hit": None}
            for i in range(9)]  # fmt: skip
    _append(d / "outcomes.jsonl", rows)
    _json(d / "summary.json", {"n": 9, "accuracy": 6 / 9, "accuracy_ci": list(wilson_ci(6, 9)),
                               "score": 0.6666666666666666, "wall_s": 1.234567})  # fmt: skip
    return d


KINDS = {"adapt": adapt_run, "search": search_run, "cotrain": cotrain_run, "eval": eval_run}


def _page(run: Path) -> str:
    return build_report(run, audit=AUDIT).read_text()


def _answer(page: str) -> str:
    return page.split('<h2 id="answer">')[1].split('<h2 id="lineage">')[0]


def _ci(k: int, n: int) -> str:
    lo, hi = wilson_ci(k, n)
    return f"{k}/{n} ({k / n:.2f}, 95% CI {lo:.2f}\u2013{hi:.2f})"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_first_heading_after_the_title_is_the_answer(tmp_path, kind):
    page = _page(KINDS[kind](tmp_path))
    after_title = page[page.index("</h1>") :]
    first = re.search(r"<h[1-6][^>]*>", after_title)
    assert first is not None and first.group(0) == '<h2 id="answer">'


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_answer_shows_k_of_n_and_its_interval(tmp_path, kind):
    want = {"adapt": [_ci(7, N), _ci(39, N)], "search": [_ci(15, N), _ci(30, N)],
            "cotrain": [_ci(3, 10), _ci(6, 10)], "eval": [_ci(6, 9)]}[kind]  # fmt: skip
    answer = _answer(_page(KINDS[kind](tmp_path)))
    text = answer.replace("&rarr;", "->")
    for reading in want:
        assert reading in text
    if len(want) == 2:  # before, then after
        assert text.index(want[0]) < text.index("->") < text.index(want[1])


@pytest.mark.parametrize("kind", [*sorted(KINDS), "train-proposer"])
def test_no_float_with_more_than_four_decimals_on_the_page(tmp_path, kind):
    run = make_proposer(tmp_path / "p") if kind == "train-proposer" else KINDS[kind](tmp_path)
    assert not re.findall(r"\d\.\d{5,}", _page(run))


def test_summary_dump_rounds_the_floats_it_quotes(tmp_path):
    data = load_run(adapt_run(tmp_path))
    summary = dict(data.summary)
    assert summary["seed_eval.accuracy"] == "0.093"
    assert summary["wall_s_this_invocation"] == "12.35"


def test_adapt_answer_holds_the_kept_edits_diffs_and_hypothesis_escaped(tmp_path):
    page = _page(adapt_run(tmp_path))
    answer = _answer(page)
    assert "<script" not in page
    assert "hypothesis: Ask for the answer alone &lt;script&gt;alert(&#x27;hyp&#x27;)&lt;/script&gt;" \
        " &amp; nothing else." in answer  # fmt: skip
    assert "SEARCH" not in answer  # the explanation only, not the blocks
    assert "+# &lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in answer  # r1.0's diff
    assert "+# second edit" in answer  # r2.0's diff
    assert answer.index("r1.0 (round 1)") < answer.index("r2.0 (round 2)")
    assert "kept because: up" in answer
    assert "all 2 edits together" in answer  # the final harness against the seed
    assert answer.count("no hypothesis recorded") == 1  # r2.0's; the sum of edits has none


def test_search_answer_holds_the_accepted_diff_against_the_seed_and_its_hypothesis(tmp_path):
    answer = _answer(_page(search_run(tmp_path)))
    assert "c0100 (iteration 1): against its parent c0000" in answer
    assert "hypothesis: Ask for the answer alone &lt;script&gt;" in answer
    assert "+# &lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in answer
    assert "search split: 0.2 -&gt; 0.6" in answer


def test_a_huge_hypothesis_is_capped(tmp_path):
    d = search_run(tmp_path)
    meta = json.loads((d / "archive" / "c0100" / "meta.json").read_text())
    _json(d / "archive" / "c0100" / "meta.json", dict(meta, hypothesis="H" * 10**6))
    answer = _answer(_page(d))
    assert "H" * MAX_HYPOTHESIS_CHARS in answer and "H" * (MAX_HYPOTHESIS_CHARS + 1) not in answer
    assert f"({10**6 - MAX_HYPOTHESIS_CHARS} more characters)" in answer


def test_the_answer_draws_the_curve_and_the_curves_section_does_not_repeat_it(tmp_path):
    run = adapt_run(tmp_path)
    page = _page(run)
    pngs = re.findall(r'src="data:image/png;base64,', page)
    assert len(pngs) == len(load_run(run).curves) == 1
    assert 'src="data:image/png;base64,' in _answer(page)


def test_cotrain_answer_gives_the_cost_per_schedule(tmp_path):
    answer = _answer(_page(cotrain_run(tmp_path)))
    assert "<b>adaptive</b>" in answer
    assert "final read after 4 training rollouts" in answer
    assert "4 training rollouts in all (ledger)" in answer


def test_the_raw_config_and_summary_come_last_collapsed(tmp_path):
    page = _page(adapt_run(tmp_path))
    config = page.index('<h2 id="config">')
    assert config > page.index('<h2 id="reads">') > page.index('<h2 id="answer">')
    tail = page[config:]
    assert "<h2" not in tail[4:]  # the last section
    assert page.index("seed_eval.accuracy") > config  # the summary.json dump is in it
    dump = tail.index("seed_eval.accuracy")
    assert tail.rfind("<details>", 0, dump) > tail.rfind("</details>", 0, dump)  # collapsed


def test_summary_accuracy_is_the_fallback_without_ledger_rows(tmp_path):
    d = make_adapt(tmp_path / "adapt")  # no eval row in its ledger
    _json(d / "eval_read.json", {"harnesses": ["aaaa", "cccc"], "n": N, "question_ids": []})
    _json(d / "summary.json", {"seed_eval": {"accuracy": 7 / N, "hash": "aaaa"},
                               "final_eval": {"accuracy": 0.5, "hash": "cccc"}})  # fmt: skip
    lead = load_run(d).lead
    assert lead is not None
    seed, final = (r for _, r in lead.lines[0].steps)
    assert (seed.k, seed.n) == (7, N)  # 7/75 * 75 is whole: k known
    assert final.k is None and final.accuracy == 0.5 and final.n == N  # 37.5: k unknown


def test_a_summary_that_disagrees_with_the_ledger_is_noted(tmp_path):
    d = adapt_run(tmp_path)
    s = json.loads((d / "summary.json").read_text())
    s["final_eval"]["accuracy"] = 0.99
    _json(d / "summary.json", s)
    data = load_run(d)
    assert data.lead is not None and data.lead.lines[0].steps[1][1].k == 39
    assert any("records accuracy 0.99 for cccc" in n for n in data.notes["answer"])


def test_an_unknown_run_says_it_has_no_result(tmp_path):
    d = tmp_path / "cut"
    d.mkdir()
    (d / "config.toml").write_text("rounds = 2\n")
    page = _page(d)
    assert "note: no result: the run kind is unknown" in _answer(page)


@pytest.mark.parametrize("v, shown", [(0.09333333333333334, "0.093"), (0.5, "0.5"),
                                      (12.3456789, "12.35"), (1796146956.0, "1796146956"),
                                      (1e300, "1e+300"), (5e-05, "5.0e-05"), (0.0, "0"),
                                      (-0.25, "-0.25")])  # fmt: skip
def test_human_rounds_floats_as_a_person_reads_them(v, shown):
    assert human(v) == shown


def test_reading_text_without_k_shows_the_accuracy_alone():
    assert reading_text(Reading(accuracy=0.1)) == "0.10"
    assert reading_text(Reading()) == "not recorded"
    assert reading_text(Reading(k=0, n=20)) == _ci(0, 20)


def test_garbage_behind_the_answer_is_a_note_or_nothing_never_a_crash(tmp_path):
    d = adapt_run(tmp_path)
    (d / "round_01" / "proposals.json").write_text("[{cut")
    decision = json.loads((d / "round_02" / "decision.json").read_text())
    _json(d / "round_02" / "decision.json", dict(decision, why=f"better {HYPOTHESIS}"))
    _json(d / "round_02" / "proposals.json", [{"index": True, "text": 5}])  # no explanation
    (d / "summary.json").write_text('{"seed_eval": {"accuracy": "high", "hash": 7}}')
    page = _page(d)
    answer = _answer(page)
    assert "<script" not in page
    assert "kept because: better Ask for the answer alone &lt;script&gt;" in answer
    assert "round_01/proposals.json: unreadable" in page
    assert _ci(7, N) in answer and _ci(39, N) in answer  # eval_read.json and the ledger


def test_hostile_cotrain_reads_are_escaped_and_bad_numbers_not_recorded(tmp_path):
    d = make_cotrain(tmp_path / "cotrain")
    row = {"schedule": "<script>x</script>", "cycle": 0, "boundary": "start", "n": "ten",
           "training_rollouts": 0, "accuracy": 7.5}  # fmt: skip
    (d / "adaptive" / "reads.jsonl").write_text(json.dumps(row) + "\n")
    answer = _answer(_page(d))
    assert "<script" not in answer and "&lt;script&gt;x&lt;/script&gt;" in answer
    assert "base <b>not recorded</b>" in answer  # an accuracy of 7.5 is none
