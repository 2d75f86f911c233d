"""`train-proposer` sft then grpo end to end: a scripted teacher and solver (test doubles), the
real isolated runtime, the tiny random model as the proposer trained (SFT on TRL, CV over two
families, one GRPO update), and the resume of each stage."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import BAD_EDIT, GOOD_EDIT, SEED, prose_solver
from tests.tiny import make_tiny_model
from tests.train.test_proposer_data import OTHER_GOOD
from whale import config as cfgmod
from whale.models import PROPOSER_MARKER
from whale.records import read_jsonl
from whale.tasks import Grade, Question, TaskBase
from whale.train.proposer import run as runmod
from whale.train.proposer.contexts import family_dir, family_of

pytestmark = pytest.mark.slow


class OffsetSum(TaskBase):
    """'What is a + b?' with a family's own numbers (families must not share questions)."""

    description = "Add two integers. Answer with the number only."

    def __init__(self, base: int) -> None:
        self.name = f"test:sum{base}"
        self._qs = [Question(id=f"s{base}-{i}", prompt=f"What is {base + i} + {2 * i + 1}?",
                             reference=base + 3 * i + 1) for i in range(30)]  # fmt: skip

    def questions(self):
        return list(self._qs)

    def grade(self, q, answer):
        ok = answer.strip() == str(q.reference)
        return Grade(1.0 if ok else 0.0, ok)


BASES = {"test:a": 1000, "test:b": 2000, "test:c": 3000, "test:d": 4000}


@pytest.fixture
def cfg_and_models(tmp_path, monkeypatch):
    tiny = make_tiny_model(tmp_path / "tiny")
    seed, template = tmp_path / "seed.py", tmp_path / "template.txt"
    seed.write_text(SEED)
    template.write_text("Task: {description}\nHarness:\n{source}\nReport:\n{report}\nEdit it.")
    # family b gets other code: the same harness twice would be a duplicate, kept once
    # Replies by seed, not by call order: a context's proposals are asked side by side. The
    # teacher's seed for proposal i of context n is seed * 100_000 + n * 100 + i.
    replies = [GOOD_EDIT, BAD_EDIT, OTHER_GOOD, BAD_EDIT]
    teacher = ScriptedModel(lambda messages, s: replies[(s.seed // 100 % 1000) * 2 + s.seed % 100])
    made: list[str] = []

    def build_model(mcfg):
        made.append(mcfg.name)
        return teacher if mcfg.name == "teacher" else prose_solver()

    def open_family(fam, cs, run_dir, solver, rt):
        return family_of(fam, OffsetSum(BASES[fam]), cs, family_dir(run_dir, fam))

    monkeypatch.setattr(runmod, "build_model", build_model)
    monkeypatch.setattr(runmod, "open_family", open_family)
    cfg = cfgmod.build(runmod.ProposerTrainConfig, {
        "families": {"sft": ["test:a", "test:b"], "rl": ["test:c"], "eval": ["test:d"]},
        "contexts": {"dev": 12, "score": 6, "eval": 8, "feedback": 4, "contexts": 1,
                     "seeds": [str(seed)], "template": str(template),
                     "report": {"char_budget": 200, "max_failures": 1, "max_correct": 1}},
        "solver": {"name": "solver"}, "teacher": {"name": "teacher"},
        "checkpoint": str(tiny), "filter": {"g": 2},
        "sft": {"max_epochs": 1.0, "eval_every": 0.5, "batch_size": 1, "max_len": 500,
                "lora": {"r": 4, "alpha": 8}},
        "grpo": {"g": 2, "contexts_per_update": 1, "updates": 1, "max_completion": 8,
                 "max_prompt": 480, "lora": {"r": 4, "alpha": 8}},
    })  # fmt: skip
    return cfg, teacher, made


def test_sft_then_grpo_train_publish_and_resume(cfg_and_models, tmp_path):
    cfg, teacher, made = cfg_and_models
    run = tmp_path / "run"
    runmod.open_run(cfg, run)
    out = runmod.run_sft(cfg, run, say=lambda s: None)
    # one context per family, two proposals each: the good edit kept, BAD_EDIT filtered
    assert out["teacher"]["kept"] == 2 and out["teacher"]["kept_per_family"] == {
        "test:a": 1, "test:b": 1}  # fmt: skip
    assert out["cv"] is not None and out["epochs"] in (0.5, 1.0)  # chosen by 2-fold CV
    cv = json.loads((run / "sft" / "cv" / "cv.json").read_text())
    folds = [set(f["val_families"]) for f in cv["folds"]]
    assert folds == [{"test:a"}, {"test:b"}] or folds == [{"test:b"}, {"test:a"}]
    adapter = run / "sft" / "adapter"
    marker = json.loads((adapter / PROPOSER_MARKER).read_text())
    assert (adapter / marker["lora"]).is_file() and marker["stage"] == "sft"
    rows = read_jsonl(run / "teacher" / "candidates.jsonl")
    assert [r["kept"] for r in rows] == [True, False, True, False]
    assert all(r["reason"].startswith("filter") for r in rows if not r["kept"])

    calls = len(teacher.calls)
    again = runmod.run_sft(cfg, run, say=lambda s: None)  # a resume: nothing is asked again
    assert len(teacher.calls) == calls and again["epochs"] == out["epochs"]

    g = runmod.run_grpo(cfg, run, say=lambda s: None)
    (phase,) = g["phases"]
    assert len(phase["updates"]) == 1 and len(phase["updates"][0]["rewards"]) == 2
    rewards = read_jsonl(run / "grpo" / "phase_1" / "rewards.jsonl")
    assert len(rewards) == 2 and all(r["context"].startswith("test:c/") for r in rewards)
    final = run / "grpo" / "adapter"
    assert json.loads((final / PROPOSER_MARKER).read_text())["stage"] == "grpo"
    g2 = runmod.run_grpo(cfg, run, say=lambda s: None)  # resumed: no update is redone
    assert len(g2["phases"][0]["updates"]) == 1
    assert len(read_jsonl(run / "grpo" / "phase_1" / "rewards.jsonl")) == 2


def test_multistep_advances_each_parent_to_its_best_revision_only_when_it_beat_it(
    cfg_and_models, tmp_path
):
    from whale.revise.edits import apply_edits

    cfg, _, _ = cfg_and_models
    cfg.families.rl = ["test:c", "test:d"]
    cfg.families.eval = []
    s = runmod.Session(cfg, tmp_path / "run", lambda m: None)
    try:
        c, d = s.contexts("rl_1", cfg.families.rl)
        better = apply_edits(c.parent_source, GOOD_EDIT).source
        worse = apply_edits(d.parent_source, BAD_EDIT).source
        new_c, new_d = runmod.advance([c, d], {c.id: (1.0, better), d.id: (0.0, worse)}, s, 1)
    finally:
        s.close()
    assert new_d == d  # its best did not beat the parent: the state stays
    assert new_c.step == 1 and new_c.parent_source == better and new_c.parent_score == 1.0
    assert new_c.id != c.id and better.strip() in new_c.prompt
    assert not set(new_c.feedback_ids) & set(new_c.scoring_ids)
