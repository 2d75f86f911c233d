"""One x_t template for a whole train-proposer run: `contexts.template` renders the contexts
(teacher and GRPO prompts), the multistep advance, evaluate's contexts and every prompt of
evaluate's ratchet. `propose.template` is not read by train-proposer: left at its default it is
ignored, another template there is refused; an unknown name is refused too. A scripted solver
and proposer (test doubles) and the real isolated runtime."""

import hashlib
import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, SumTask, prose_solver
from tests.train.test_proposer_pipeline import OffsetSum
from whale import config as cfgmod
from whale.harness import Runtime
from whale.revise.edits import apply_edits
from whale.revise.proposer import ProposerConfig, load_template
from whale.train.proposer import run as runmod
from whale.train.proposer.contexts import ContextSettings, family_dir, family_of
from whale.train.proposer.evaluate import EvaluateSettings, evaluate_proposers

HINT = "arithmetic slips"  # in the hinted template only
PLAIN = "with placeholders in capitals"  # in the default template only


BASES = {"test:a": 1000, "test:c": 3000, "test:d": 4000}


def _config(tmp_path, template, propose_template=None):
    seed = tmp_path / "seed.py"
    seed.write_text(SEED)
    return cfgmod.build(runmod.ProposerTrainConfig, {
        "families": {"sft": ["test:a"], "rl": ["test:c"], "eval": ["test:d"]},
        "contexts": {"dev": 12, "score": 6, "eval": 8, "feedback": 4, "contexts": 1,
                     "seeds": [str(seed)], "template": template},
        "propose": {"template": propose_template or template},
        "evaluate": {"against": [], "contexts": 2, "g": 1, "rounds": 2},
        "solver": {"name": "solver"},
    })  # fmt: skip


@pytest.fixture
def fakes(monkeypatch):
    proposer = ScriptedModel([GOOD_EDIT])

    def open_family(fam, cs, run_dir, solver, rt):
        return family_of(fam, OffsetSum(BASES[fam]), cs, family_dir(run_dir, fam))

    monkeypatch.setattr(runmod, "build_model", lambda mcfg: prose_solver())
    monkeypatch.setattr(runmod, "open_family", open_family)
    monkeypatch.setattr(runmod, "proposer_model", lambda name, cfg, d: lambda: proposer)
    return proposer


def every_prompt(cfg, run, proposer):
    """The prompts of a run: its SFT and RL contexts, an advanced context, and what evaluate's
    proposer was sent (its contexts' prompts and the ratchet's round prompts)."""
    runmod.open_run(cfg, run)
    s = runmod.Session(cfg, run, lambda m: None)
    try:
        sft, rl = s.contexts("sft", cfg.families.sft), s.contexts("rl_1", cfg.families.rl)
        better = apply_edits(rl[0].parent_source, GOOD_EDIT).source
        (advanced,) = runmod.advance(rl, {rl[0].id: (1.0, better)}, s, 1)
    finally:
        s.close()
    assert advanced.step == 1  # it did advance: a new prompt was rendered
    runmod.run_evaluate(cfg, run, say=lambda m: None)
    sent = [m[-1]["content"] for m, _ in proposer.calls]
    rounds = sorted(run.glob("evaluate/**/ratchet/**/prompt.txt"))
    assert len(sent) == 2 + 2 and len(rounds) == 2  # 2 contexts × g = 1, then 2 rounds
    assert {p.read_text() for p in rounds} <= set(sent[2:])
    return [c.prompt for c in sft + rl] + [advanced.prompt] + sent


@pytest.mark.parametrize("propose_template", ["hinted", "default"])
def test_the_hinted_template_renders_every_prompt_of_the_run(tmp_path, fakes, propose_template):
    """propose.template repeating it or left at its default: the contexts' template rules."""
    cfg = _config(tmp_path, "hinted", propose_template)
    prompts = every_prompt(cfg, tmp_path / "run", fakes)
    assert all(HINT in p and PLAIN not in p for p in prompts)


def test_the_default_template_renders_every_prompt_of_the_run(tmp_path, fakes):
    cfg = _config(tmp_path, "default")
    assert runmod.ProposerTrainConfig().contexts.template == "default"
    prompts = every_prompt(cfg, tmp_path / "run", fakes)
    assert all(HINT not in p and PLAIN in p for p in prompts)


def test_evaluate_records_the_template_it_used(tmp_path, fakes):
    every_prompt(_config(tmp_path, "hinted", "default"), tmp_path / "run", fakes)
    summary = json.loads((tmp_path / "run" / "evaluate" / "summary.json").read_text())
    assert summary["setup"]["template"]["name"] == "hinted"
    readings = json.loads((tmp_path / "run" / "evaluate" / "readings.json").read_text())
    assert {r["template"]["name"] for r in readings} == {"hinted"}


@pytest.mark.parametrize("template", ["hinted", "default"])
def test_evaluates_ratchet_prompts_use_the_contexts_template_whatever_the_proposer_config(
    tmp_path, template
):
    """evaluate_proposers called as a library with a proposer config of the other template:
    the ratchet's rounds still render the contexts' one."""
    seed = tmp_path / "seed.py"
    seed.write_text(SEED)
    cs = ContextSettings(dev=12, score=6, eval=8, feedback=4, contexts=1, seeds=[str(seed)],
                         template=template)  # fmt: skip
    fam = family_of("test:sum", SumTask(), cs, tmp_path / "rollouts")
    rt, proposer = Runtime(model=prose_solver()), ScriptedModel([GOOD_EDIT])
    other = "default" if template == "hinted" else "hinted"
    try:
        out = evaluate_proposers({"p": lambda: proposer}, [fam], rt, cs,
                                 ProposerConfig(template=other),
                                 EvaluateSettings(against=[], contexts=1, g=1, rounds=2), 2,
                                 tmp_path / "evaluate")  # fmt: skip
    finally:
        fam.store.close()
        rt.close()
    sent = [m[-1]["content"] for m, _ in proposer.calls]
    assert len(sent) == 3  # one context's proposal, then two ratchet rounds
    assert all((HINT in p) == (template == "hinted") for p in sent)
    assert out["setup"]["template"]["name"] == template


@pytest.mark.parametrize("contexts_t", ["default", "proposer.txt", "custom"])
def test_a_propose_template_other_than_the_contexts_is_refused(tmp_path, contexts_t):
    custom = tmp_path / "custom.txt"
    custom.write_text("Task: {description}\n{source}\n{report}\nEdit it.")
    contexts_t = str(custom) if contexts_t == "custom" else contexts_t
    with pytest.raises(cfgmod.ConfigError, match=r"propose.template = 'hinted' differs from "
                       rf"contexts.template = '{contexts_t}'"):  # fmt: skip
        _config(tmp_path, contexts_t, "hinted")


def test_the_same_template_by_another_name_is_accepted(tmp_path):
    """A run saved before the default's name changed has contexts.template = "proposer.txt":
    the same text as "default", so it still loads with either propose.template."""
    assert _config(tmp_path, "proposer.txt", "default").contexts.template == "proposer.txt"
    _config(tmp_path, "default", "proposer.txt")


def test_an_unknown_template_is_refused_naming_it(tmp_path):
    with pytest.raises(cfgmod.ConfigError, match="contexts.template: 'no-such-template'"):
        _config(tmp_path, "no-such-template", "default")
    with pytest.raises(cfgmod.ConfigError, match="template: 'nope.txt'"):
        ContextSettings(template="nope.txt").validate()


def test_the_cli_template_flag_sets_the_one_template(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from whale.cli import app
    from whale.train.proposer import run as runmod

    got = []
    monkeypatch.setattr(runmod, "run_sft", lambda cfg, run, say: got.append(cfg) or {})
    runner = CliRunner()
    r = runner.invoke(app, ["train-proposer", "sft", "--run", str(tmp_path / "r"),
                            "--template", "hinted"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert got[0].contexts.template == got[0].propose.template == "hinted"
    r = runner.invoke(app, ["train-proposer", "sft", "--run", str(tmp_path / "r2"),
                            "--set", "propose.template=hinted"])  # fmt: skip
    assert r.exit_code == 2 and "contexts.template" in r.output and len(got) == 1


class _Stop(Exception):
    pass


def test_a_teacher_template_is_read_by_the_teacher_alone(tmp_path, monkeypatch):
    """contexts.teacher_template = "hinted" under the default x_t: the teacher is asked with
    the hinted rendering of each context, its kept edit is stored under the default rendering
    (the prompt the trained proposer reads), and the summary names the prior."""
    (tmp_path / "seed.py").write_text(SEED)
    cfg = cfgmod.build(runmod.ProposerTrainConfig, {
        "families": {"sft": ["test:a"], "rl": ["test:c"], "eval": ["test:d"]},
        "contexts": {"dev": 12, "score": 6, "eval": 8, "feedback": 4, "contexts": 1,
                     "seeds": [str(tmp_path / "seed.py")], "template": "default",
                     "teacher_template": "hinted"},
        "solver": {"name": "solver"}, "teacher": {"name": "teacher"}, "filter": {"g": 1},
    })  # fmt: skip
    teacher = ScriptedModel([GOOD_EDIT])
    monkeypatch.setattr(runmod, "build_model",
                        lambda m: teacher if m.name == "teacher" else prose_solver())  # fmt: skip
    monkeypatch.setattr(runmod, "open_family", lambda fam, cs, run_dir, solver, rt: family_of(
        fam, OffsetSum(BASES[fam]), cs, family_dir(run_dir, fam)))  # fmt: skip
    monkeypatch.setattr(runmod.Session, "checkpoint", lambda self: (_ for _ in ()).throw(_Stop()))
    run = tmp_path / "run"
    runmod.open_run(cfg, run)
    with pytest.raises(_Stop):  # stops where SFT would load the model: the teacher is done
        runmod.run_sft(cfg, run, say=lambda m: None)
    (asked,) = [m[-1]["content"] for m, _ in teacher.calls]
    assert HINT in asked and PLAIN not in asked
    kept = [json.loads(line) for line in (run / "teacher" / "kept.jsonl").read_text().splitlines()]
    assert len(kept) == 1
    stored = kept[0]["prompt"][0]["content"]
    assert HINT not in stored and PLAIN in stored
    # one context under two templates: the same harness and the same report in both
    assert SEED.strip() in stored and SEED.strip() in asked
    report = stored.split("# Execution report\n", 1)[1].split("\n# How to answer", 1)[0]
    assert len(report) > 40 and report in asked
    summary = json.loads((run / "teacher" / "summary.json").read_text())
    assert summary["teacher_template"] == "hinted"
    assert summary["teacher_template_sha256"] == hashlib.sha256(
        load_template("hinted").encode()).hexdigest()  # fmt: skip
    assert summary["kept_copying_hint"] == 0


def test_kept_edits_that_copy_the_teachers_prior_are_counted(tmp_path, monkeypatch):
    """The prior is kept out of the SFT prompts, not out of the SFT targets: an edit that
    writes a line of the hinted template into the harness teaches the trained proposer the
    hint's words. The summary counts such kept edits."""
    (tmp_path / "seed.py").write_text(SEED)
    cfg = cfgmod.build(runmod.ProposerTrainConfig, {
        "families": {"sft": ["test:a"], "rl": ["test:c"], "eval": ["test:d"]},
        "contexts": {"dev": 12, "score": 6, "eval": 8, "feedback": 4, "contexts": 1,
                     "seeds": [str(tmp_path / "seed.py")], "template": "default",
                     "teacher_template": "hinted"},
        "solver": {"name": "solver"}, "teacher": {"name": "teacher"}, "filter": {"g": 1},
    })  # fmt: skip
    line = next(t for t in load_template("hinted").splitlines() if HINT in t)
    copying = GOOD_EDIT.replace("=======\n", f"=======\n# {line}\n", 1)
    assert copying != GOOD_EDIT
    teacher = ScriptedModel([copying])
    monkeypatch.setattr(runmod, "build_model",
                        lambda m: teacher if m.name == "teacher" else prose_solver())  # fmt: skip
    monkeypatch.setattr(runmod, "open_family", lambda fam, cs, run_dir, solver, rt: family_of(
        fam, OffsetSum(BASES[fam]), cs, family_dir(run_dir, fam)))  # fmt: skip
    monkeypatch.setattr(runmod.Session, "checkpoint", lambda self: (_ for _ in ()).throw(_Stop()))
    run = tmp_path / "run"
    runmod.open_run(cfg, run)
    with pytest.raises(_Stop):
        runmod.run_sft(cfg, run, say=lambda m: None)
    summary = json.loads((run / "teacher" / "summary.json").read_text())
    assert summary["kept"] == 1 and summary["kept_copying_hint"] == 1


def test_an_unknown_teacher_template_is_refused_naming_the_field(tmp_path):
    with pytest.raises(cfgmod.ConfigError, match="teacher_template: 'nope'"):
        ContextSettings(teacher_template="nope").validate()
