"""The Harness Learning tables say who read the teacher's prior (contexts.teacher_template)."""

from __future__ import annotations

import json
from pathlib import Path

from whale.experiments.records import StepRecord
from whale.experiments.spec import Step
from whale.experiments.tables_hl import train_proposer_tables


def test_a_teacher_prior_is_named_with_who_read_it_and_its_copies(tmp_path: Path):
    fields = {"contexts": {"template": "default", "teacher_template": "hinted"},
              "solver": {"name": "s"}}  # fmt: skip
    rec = StepRecord("proposer", "train_proposer", "h", {"fields": fields}, "finished")
    d = tmp_path / "proposer"
    (d / "teacher").mkdir(parents=True)
    (d / "teacher" / "summary.json").write_text(json.dumps({
        "contexts": 2, "proposals": 8, "kept": 2, "kept_per_family": {"rg:a": 2},
        "rejected": {"filter": 6}, "mean_kept_gain": 0.1, "teacher_template": "hinted",
        "teacher_template_sha256": "ab" * 32, "kept_copying_hint": 1}))  # fmt: skip
    step = Step("proposer", "train_proposer", ("sft",), fields)
    text = "\n".join(train_proposer_tables(step, rec, d, tmp_path / "t.md"))
    assert "teacher alone read the `hinted` template" in text
    assert "named `teacher` in evaluate reads x_t" in text
    assert "copying a line of it word for word: 1" in text
    plain = {"contexts": {"template": "default"}}
    rec2 = StepRecord("proposer", "train_proposer", "h", {"fields": plain}, "finished")
    assert "prior" not in "\n".join(train_proposer_tables(step, rec2, tmp_path / "none",
                                                          tmp_path / "t.md"))  # fmt: skip


def _reading(proposer: str, family: str, rounds: list[float]):
    from whale.train.proposer.evaluate import FamilyReading

    return FamilyReading(proposer, family, rounds[0], [[rounds[-1]]], 1, rounds, 0)


def test_the_ratchet_curve_is_the_mean_and_se_over_families_round_by_round(tmp_path: Path):
    """The paper's Figure 4, from evaluate's readings: one point per round, the SE over
    families; a round that fewer families reached counts only those."""
    import math

    from whale.experiments.ratchet_plot import ratchet_curves, ratchet_lines

    rs = [_reading("grpo", "a", [0.1, 0.3]), _reading("grpo", "b", [0.3, 0.5, 0.7]),
          _reading("base", "a", [0.1, 0.1])]  # fmt: skip
    got = ratchet_curves(rs)
    (m0, se0, n0), (m1, se1, n1), (m2, se2, n2) = got["grpo"]
    assert (round(m0, 6), n0, round(m1, 6), n1, round(m2, 6), n2) == (0.2, 2, 0.4, 2, 0.7, 1)
    assert math.isclose(se0, 0.1) and math.isnan(se2)  # SD 0.1414 / sqrt(2); one family: none
    assert math.isnan(got["base"][0][1])
    png = tmp_path / "r.png"
    text = "\n".join(ratchet_lines(rs, png))
    assert "| grpo | 0.200 ± 0.100 | 0.400 ± 0.100 | 0.700 | 2 |" in text
    assert "| base | 0.100 | 0.100 | - | 1 |" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](r.png)" in text
    assert ratchet_lines([], png) == []


def test_an_evaluate_in_progress_shows_the_families_each_proposer_has_done(tmp_path: Path):
    fields = {"families": {"eval": ["rg:a", "rg:b"]}, "evaluate": {"contexts": 2, "rounds": 2}}
    rec = StepRecord("proposer", "train_proposer", "h", {"fields": fields}, "started")
    d = tmp_path / "proposer"
    fam = d / "evaluate" / "grpo-0123456789"
    for name in ("rg_a", "rg_b"):
        for k in range(2):  # rg:b's second context has no proposals yet
            if name == "rg_a" or k == 0:
                (fam / name / "proposals").mkdir(parents=True, exist_ok=True)
                (fam / name / "proposals" / f"c{k}.json").write_text("[]")
    (fam / "rg_a" / "ratchet" / "round_02").mkdir(parents=True)
    (fam / "rg_a" / "ratchet" / "round_02" / "decision.json").write_text("{}")
    (d / "evaluate" / "sft-9876543210").mkdir()
    step = Step("proposer", "train_proposer", ("evaluate",), fields)
    text = "\n".join(train_proposer_tables(step, rec, d, tmp_path / "t.md"))
    assert "| `grpo-0123456789` | 1 of 2 | rg:a |" in text
    assert "| `sft-9876543210` | 0 of 2 | - |" in text
