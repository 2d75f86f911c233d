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
