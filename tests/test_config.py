"""Configs are checked once, on load (whale.config.build): types against the field hints, then
each config's ranges, with the dotted field named; and `whale adapt` refuses bad settings
before any cost (issue 8: "Errors promised as exit 2 that are tracebacks or silent")."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from whale import config as cfgmod
from whale.cli import app
from whale.evaluation import EvalConfig
from whale.metaharness.run import SearchConfig
from whale.revise.run import AdaptConfig
from whale.runs.given import build_config
from whale.schedule.cotrain import CotrainConfig
from whale.train.proposer.run import ProposerTrainConfig

runner = CliRunner()
STUB = "stub@http://127.0.0.1:9"  # never called: every case here stops before any model call


def load(cls, *overrides):
    return cfgmod.load(cls, overrides=list(overrides))


def error_of(cls, *overrides) -> str:
    with pytest.raises(cfgmod.ConfigError) as e:
        load(cls, *overrides)
    return str(e.value)


def text(r) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(r.output.split())


# --- types ---------------------------------------------------------------------------------


def test_a_string_for_an_int_field_is_refused_naming_it():
    assert error_of(EvalConfig, "n=abc") == "n: expected an integer, got str 'abc'"


def test_a_float_for_an_int_field_is_refused():
    assert error_of(EvalConfig, "workers=2.5") == "workers: expected an integer, got float 2.5"


def test_a_bool_is_not_an_int():
    assert "n: expected an integer, got bool True" in error_of(EvalConfig, "n=true")


def test_a_string_for_a_table_field_is_refused():
    assert "model: expected a table (ModelConfig), got str 'abc'" in error_of(
        EvalConfig, "model=abc"
    )


def test_a_nested_field_is_named_with_its_whole_path():
    assert error_of(AdaptConfig, "propose.grammar_blocks=abc").startswith(
        "propose.grammar_blocks: expected an integer"
    )


def test_an_int_is_accepted_for_a_float_and_becomes_one():
    t = load(EvalConfig, "runtime.temperature=1").runtime.temperature
    assert t == 1.0 and isinstance(t, float)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_temperature_is_refused(value):
    assert "runtime.temperature: expected a finite number" in error_of(
        EvalConfig, f"runtime.temperature={value}"
    )


def test_an_infinite_budget_is_refused():
    assert "runtime.budget.run_timeout_s: expected a finite number" in error_of(
        EvalConfig, "runtime.budget.run_timeout_s=inf"
    )


def test_a_literal_field_takes_only_its_values():
    assert "runtime.sandbox: 'foo' is not one of 'auto', 'nsjail', 'bwrap', 'unsafe'" in error_of(
        EvalConfig, "runtime.sandbox=foo"
    )


def test_an_optional_field_names_its_type():
    assert "score: expected an integer, got str 'half'" in error_of(AdaptConfig, "score=half")


def test_a_dict_field_refuses_a_scalar():
    assert "task.config: expected a table, got int 5" in error_of(EvalConfig, "task.config=5")


def test_a_string_field_given_a_number_says_how_to_quote_it():
    assert "harness: expected a string, got int 5 (to pass it as a string, quote it" in error_of(
        EvalConfig, "harness=5"
    )


def test_an_integer_too_long_for_python_is_a_config_error():
    assert error_of(EvalConfig, "n=" + "9" * 5000).startswith("n: expected an integer, got str")


# --- ranges --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, override, named",
    [
        (EvalConfig, "n=0", "n: must be at least 1"),
        (EvalConfig, "workers=-3", "workers: must be at least 1"),
        (EvalConfig, "task.size=-1", "task.size: must be at least 1"),
        (EvalConfig, "task.size=0", "task.size: must be at least 1"),
        (EvalConfig, "runtime.budget.model_calls=-1", "runtime.budget.model_calls: must be at"),
        (EvalConfig, "runtime.budget.run_timeout_s=0", "runtime.budget.run_timeout_s: must be"),
        (EvalConfig, "runtime.limits.memory_mb=0", "runtime.limits.memory_mb: must be greater"),
        (EvalConfig, "runtime.temperature=-0.5", "runtime.temperature: must be at least 0"),
        (EvalConfig, "model.timeout_s=0", "model.timeout_s: must be greater than 0"),
        (AdaptConfig, "rounds=0", "rounds: must be at least 1"),
        (AdaptConfig, "g=0", "g: must be at least 1"),
        (AdaptConfig, "dev=0", "dev: must be at least 1"),
        (AdaptConfig, "eval=0", "eval: must be at least 1"),
        (AdaptConfig, "feedback=0", "feedback: must be at least 1"),
        (AdaptConfig, "propose.grammar_blocks=0", "propose.grammar_blocks: must be at least 1"),
        (AdaptConfig, "propose.grammar=maybe", "propose.grammar: 'maybe' is not one of"),
        (AdaptConfig, "select=greedy", "select: 'greedy' is not one of"),
        (AdaptConfig, "proposer.retries=-1", "proposer.retries: must be at least 0"),
        # issue 20: a temperature no server may get is refused on load, not at the first call
        (AdaptConfig, "propose.temperature=30.0", "propose.temperature: must be at most 2"),
        (SearchConfig, "agent.temperature=30.0", "agent.temperature: must be at most 2"),
        (CotrainConfig, "agent.temperature=3.0", "agent.temperature: must be at most 2"),
        (CotrainConfig, "rsft.temperature=30.0", "rsft.temperature: must be at most 2"),
        (ProposerTrainConfig, "propose.temperature=2.5", "propose.temperature: must be at most"),
        (ProposerTrainConfig, "grpo.temperature=30.0", "temperature in (0, 2.0]"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_field(cls, override, named):
    assert named in error_of(cls, override)


def test_a_zero_call_budget_is_a_real_setting():
    assert load(EvalConfig, "runtime.budget.model_calls=0").runtime.budget.model_calls == 0


def test_every_default_config_survives_save_and_load(tmp_path):
    for cls in (EvalConfig, AdaptConfig):
        cfgmod.save(cls(), tmp_path / "c.toml")
        assert cfgmod.load(cls, tmp_path / "c.toml") == cls()


# --- sub-tables start from the field's default --------------------------------------------


def test_the_proposer_flag_keeps_the_proposer_timeout():
    # `--proposer X` sets proposer.name; the proposer's own default timeout (600 s) stays.
    cfg = build_config(AdaptConfig, None, [], {"proposer.name": "qwen-coder-0.5b"})
    assert cfg.proposer.name == "qwen-coder-0.5b" and cfg.proposer.timeout_s == 600.0


def test_a_sub_table_in_a_file_keeps_the_other_defaults_of_its_field(tmp_path):
    (tmp_path / "c.toml").write_text('[proposer]\nname = "x@http://h/v1"\n')
    cfg = cfgmod.load(AdaptConfig, tmp_path / "c.toml")
    assert cfg.proposer.timeout_s == 600.0 and cfg.solver.timeout_s == 120.0


# --- the config file -----------------------------------------------------------------------


def test_a_malformed_config_file_is_a_config_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("n = \n[task\n")
    with pytest.raises(cfgmod.ConfigError, match=r"bad\.toml is not valid TOML: .*line 1"):
        cfgmod.load(EvalConfig, bad)


# --- `whale adapt` refuses before any cost -------------------------------------------------


def adapt(tmp_path, *args):
    sizes = [] if "--eval" in args else ["--dev", "3", "--eval", "3"]
    return runner.invoke(app, ["adapt", "--solver", STUB, "--proposer", STUB, *sizes,
                               "--out", str(tmp_path / "r"), *args])  # fmt: skip


def test_adapt_refuses_a_string_for_rounds(tmp_path):
    r = adapt(tmp_path, "--set", "rounds=abc")
    assert r.exit_code == 2 and "rounds: expected an integer" in text(r)
    assert not (tmp_path / "r").exists()


def test_adapt_refuses_a_string_for_grammar_blocks_before_any_rollout(tmp_path):
    r = adapt(tmp_path, "--set", "propose.grammar_blocks=abc")
    assert r.exit_code == 2 and "propose.grammar_blocks: expected an integer" in text(r)
    assert not (tmp_path / "r").exists()


def test_adapt_refuses_a_bad_family_setting_before_any_cost(tmp_path):
    r = adapt(tmp_path, "--task", "rg:basic_arithmetic", "--set", "task.config.min_terms=-1")
    assert r.exit_code == 2 and "min_terms must be positive" in text(r)
    assert not (tmp_path / "r").exists()


def test_adapt_refuses_an_out_that_is_a_file(tmp_path):
    (tmp_path / "r").write_text("")
    r = adapt(tmp_path)
    assert r.exit_code == 2 and "is not a directory" in text(r)


def test_adapt_without_any_sandbox_refuses_to_start(tmp_path, monkeypatch):
    import whale.harness.sandbox as sandbox

    monkeypatch.setattr(sandbox, "nsjail_binary", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    r = adapt(tmp_path)
    assert r.exit_code == 2 and "--unsafe-no-sandbox" in text(r)
    assert not (tmp_path / "r").exists()


def test_adapt_asking_mhqa_for_more_questions_than_its_world_holds_ends(tmp_path):
    # The exact input of the issue, which looped forever; in a subprocess so that a hang is
    # a failure (TimeoutExpired), not a stuck test run.
    cmd = [sys.executable, "-c", "from whale.cli import app; app()", "adapt", "--task", "mhqa",
           "--dev", "5", "--eval", "2000", "--set", "task.config.passages=8", "--solver", STUB,
           "--proposer", STUB, "--out", str(tmp_path / "r")]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "task.config.passages" in " ".join(p.stderr.split())
    assert not (tmp_path / "r").exists()


def test_adapt_asking_mhqa_past_its_capacity_names_the_limit(tmp_path):
    r = adapt(tmp_path, "--task", "mhqa", "--dev", "5", "--eval", "2000",
              "--set", "task.config.passages=48")  # fmt: skip
    assert r.exit_code == 2 and "distinct questions" in text(r) and "2005" in text(r)


def test_setting_one_task_field_keeps_the_commands_default_task():
    # AdaptConfig's task defaults to rg:maze; `--set task.size=10` used to make it the
    # TaskConfig class default, rg:basic_arithmetic.
    assert load(AdaptConfig, "task.size=10").task.id == "rg:maze"
