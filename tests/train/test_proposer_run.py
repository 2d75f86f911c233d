"""train-proposer's config, stage records, evaluation readings and the trained-proposer model."""

import json
import math

import pytest

from whale import config as cfgmod
from whale.models import ModelConfig, ModelNotInstalled, build_model
from whale.records import RecordError
from whale.train.proposer.evaluate import EvaluateSettings, FamilyReading, markdown, paired
from whale.train.proposer.run import ProposerTrainConfig, check_stage_changes


def reading(proposer, family, scores, ratchet=0.0):
    """One context whose proposals scored `scores` (all applied and made a harness)."""
    return FamilyReading(proposer, family, 0.1, [list(scores)], len(scores), [0.1, ratchet], 0)


def test_readings_mean_oracle_and_ratchet():
    r = reading("p", "f", [0.0, 0.5, 0.25, 0.25], ratchet=0.75)
    assert (r.mean, r.oracle, r.reading("ratchet")) == (0.25, 0.5, 0.75)
    assert r.reading("applicable") == 1.0


def test_paired_difference_and_standard_error_on_a_worked_example():
    # subject − other per family: +0.3, +0.1, −0.1 → mean 0.1, SD 0.2, SE 0.2/√3 = 0.11547
    subject = [reading("s", f, [m]) for f, m in (("a", 0.5), ("b", 0.4), ("c", 0.2))]
    other = [reading("o", f, [m]) for f, m in (("a", 0.2), ("b", 0.3), ("c", 0.3))]
    p = paired(subject, other, "mean")
    assert p["n_families"] == 3 and p["mean_diff"] == pytest.approx(0.1)
    assert p["se"] == pytest.approx(0.2 / math.sqrt(3))
    assert p["diffs"] == pytest.approx([0.3, 0.1, -0.1])


def test_one_family_has_no_standard_error_and_unmatched_families_are_left_out():
    p = paired([reading("s", "a", [1.0]), reading("s", "z", [1.0])], [reading("o", "a", [0.5])],
               "oracle")  # fmt: skip
    assert p["n_families"] == 1 and p["se"] is None and p["mean_diff"] == 0.5


def test_the_table_names_every_reading():
    rs = [reading("trained", "a", [0.5, 0.0]), reading("base", "a", [0.0, 0.0])]
    text = markdown(rs, {"base": [paired(rs[:1], rs[1:], "mean")]}, ["trained", "base"])
    assert "| trained | a | 1×2 | 100% (2/2) | 0.100 | 0.250 | 0.250 | 0.500 | 0.500 |" in text
    assert "+0.250" in text


def test_the_subject_cannot_be_its_own_baseline():
    with pytest.raises(ValueError, match="subject"):
        EvaluateSettings(subject="base", against=["base"]).validate()


def test_overlapping_families_are_a_config_error():
    with pytest.raises(cfgmod.ConfigError, match="rg:gcd"):
        cfgmod.build(ProposerTrainConfig, {"families": {"sft": ["rg:gcd"], "eval": ["rg:gcd"]}})


def test_a_started_stage_fixes_its_section_but_a_later_stage_may_still_change(tmp_path):
    saved = ProposerTrainConfig()
    (tmp_path / "teacher").mkdir()  # sft started
    (tmp_path / "rollouts").mkdir()
    changed = cfgmod.build(ProposerTrainConfig, {"grpo": {"updates": 3}, "workers": 4})
    check_stage_changes(saved, changed, tmp_path)  # grpo not started; workers is free
    with pytest.raises(RecordError, match="filter.min_score"):
        check_stage_changes(saved, cfgmod.build(ProposerTrainConfig,
                                                {"filter": {"min_score": 0.1}}), tmp_path)
    with pytest.raises(RecordError, match="contexts.feedback"):  # every stage depends on it
        check_stage_changes(saved, cfgmod.build(ProposerTrainConfig,
                                                {"contexts": {"feedback": 3}}), tmp_path)
    (tmp_path / "grpo").mkdir()
    with pytest.raises(RecordError, match="grpo.updates"):
        check_stage_changes(saved, changed, tmp_path)


def test_a_trained_proposer_folder_is_a_model(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    base = tmp_path / "base.gguf"
    base.write_bytes(b"GGUF")
    (folder / "adapter.gguf").write_bytes(b"GGUF")
    (folder / "whale-proposer.json").write_text(json.dumps({"base": str(base),
                                                            "lora": "adapter.gguf"}))
    model = build_model(ModelConfig(name=str(folder), cache=False))
    assert model.name.startswith("embedded:adapter+")  # nothing starts until the first call
    assert model.lora == folder / "adapter.gguf"


def test_a_broken_proposer_marker_is_refused_by_name(tmp_path):
    (tmp_path / "whale-proposer.json").write_text("{not json")
    with pytest.raises(ModelNotInstalled, match="not a proposer marker"):
        build_model(ModelConfig(name=str(tmp_path), cache=False))
    (tmp_path / "whale-proposer.json").write_text(json.dumps({"base": "/nope.gguf",
                                                              "lora": "adapter.gguf"}))
    with pytest.raises(ModelNotInstalled, match="does not exist"):
        build_model(ModelConfig(name=str(tmp_path), cache=False))


def test_before_anything_ran_even_the_families_may_change(tmp_path):
    saved = ProposerTrainConfig()
    changed = cfgmod.build(ProposerTrainConfig, {"families": {"sft": ["rg:maze"]}})
    check_stage_changes(saved, changed, tmp_path)  # config.toml only: a typo may be fixed
    (tmp_path / "rollouts").mkdir()
    with pytest.raises(RecordError, match="families.sft"):
        check_stage_changes(saved, changed, tmp_path)


def test_the_cli_refuses_an_unsandboxed_config_without_the_flag(tmp_path):
    from typer.testing import CliRunner

    from whale.cli import app

    r = CliRunner().invoke(app, ["train-proposer", "sft", "--run", str(tmp_path / "r"),
                                 "--set", "runtime.sandbox=unsafe"])  # fmt: skip
    assert r.exit_code == 2 and "--unsafe-no-sandbox" in r.output
    assert not (tmp_path / "r").exists()


def test_the_cli_names_bad_family_lists_and_a_missing_run(tmp_path):
    from typer.testing import CliRunner

    from whale.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["train-proposer", "sft", "--run", str(tmp_path / "r"),
                            "--sft-families", "rg:gcd", "--eval-families", "rg:gcd"])  # fmt: skip
    assert r.exit_code == 2 and "rg:gcd" in r.output
    r = runner.invoke(app, ["train-proposer", "grpo"])
    assert r.exit_code == 2 and "--run" in r.output
    r = runner.invoke(app, ["train-proposer", "evaluate", "--run", str(tmp_path / "none")])
    assert r.exit_code == 2 and "config.toml" in r.output


def test_the_readme_run_config_loads():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "train-proposer-small.toml"
    cfg = cfgmod.load(ProposerTrainConfig, path)
    assert cfg.families.sft and cfg.families.rl and cfg.families.eval and cfg.grpo.g == 4


def test_which_eval_families_to_read_may_change_after_evaluate_started(tmp_path):
    saved = ProposerTrainConfig()
    for d in ("rollouts", "teacher", "grpo", "evaluate"):
        (tmp_path / d).mkdir()
    only = cfgmod.build(ProposerTrainConfig, {"evaluate": {"only": ["rg:lcm"]}})
    check_stage_changes(saved, only, tmp_path)
    with pytest.raises(RecordError, match="evaluate.g"):
        check_stage_changes(saved, cfgmod.build(ProposerTrainConfig, {"evaluate": {"g": 4}}),
                            tmp_path)  # fmt: skip


def test_a_variant_an_eval_family_does_not_offer_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(cfgmod.ConfigError, match=r"contexts.variant: 'format' is not offered "
                       r"for task 'rg:dice'.*\(families.eval\)"):  # fmt: skip
        cfgmod.build(ProposerTrainConfig, {"contexts": {"variant": "format"},
                                           "families": {"eval": ["rg:dice"]}})  # fmt: skip
    cfgmod.build(ProposerTrainConfig, {"contexts": {"variant": "format"}})  # the defaults offer it
    from typer.testing import CliRunner

    from whale.cli import app

    r = CliRunner().invoke(app, ["train-proposer", "sft", "--run", str(tmp_path / "r"),
                                 "--eval-families", "rg:dice",
                                 "--set", "contexts.variant=format"])  # fmt: skip
    assert r.exit_code == 2 and "rg:dice" in r.output
    assert not (tmp_path / "r").exists()  # refused before the SFT contexts were paid
