"""`whale rsft` and `whale cotrain` end to end on the tiny model (served in process), and their
exit-2 paths."""

import json

import pytest
from typer.testing import CliRunner

from tests.tiny import make_tiny_model
from whale.cli import app
from whale.records import read_jsonl

runner = CliRunner()
# The tiny random model never counts letters right: every weight step is a recorded skip.
COMMON = ["--task", "rg:letter_counting", "--harness", "single_call", "--serving", "hf",
          "--set", "runtime.budget.max_total_tokens=8", "--set", "solver.cache=false",
          "--json"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_rsft_with_no_accepted_run_records_the_skip_and_its_reason(tmp_path, tiny):
    out = tmp_path / "run"
    r = invoke("rsft", "--solver", str(tiny), "--train", "4", "--eval", "3", "--g", "2",
               "--epochs", "0.5", "--out", str(out), *COMMON)  # fmt: skip
    assert r.exit_code == 0, r.output
    meta = json.loads(r.output.strip().splitlines()[-1])
    (sched,) = meta["schedules"]
    assert sched["schedule"] == "weight-only" and sched["training_rollouts"] == 4
    steps = read_jsonl(out / "weight-only" / "weight" / "steps.jsonl")
    assert len(steps) == 2 and all(not s["trained"] for s in steps)
    assert all(s["skipped"].startswith("no accepted trajectory (0 of 2") for s in steps)
    assert [x["boundary"] for x in read_jsonl(out / "weight-only" / "reads.jsonl")] == \
        ["start", "weight"]
    assert (out / "curves.png").stat().st_size > 0 and (out / "curves.csv").is_file()
    # Resumed, it pays nothing twice.
    rows = len(read_jsonl(out / "weight-only" / "outcomes.jsonl"))
    r2 = invoke("rsft", "--resume", str(out), "--json")
    assert r2.exit_code == 0, r2.output
    assert len(read_jsonl(out / "weight-only" / "outcomes.jsonl")) == rows


def test_an_unknown_schedule_is_exit_2(tmp_path):
    r = invoke("cotrain", "--schedule", "adaptive,sometimes", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "schedules" in r.output


def test_a_search_split_larger_than_the_pool_is_exit_2(tmp_path):
    r = invoke("cotrain", "--train", "5", "--search", "10", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "search" in r.output


def test_resume_refuses_flags_that_define_the_experiment(tmp_path):
    (tmp_path / "config.toml").write_text("")
    r = invoke("cotrain", "--resume", str(tmp_path), "--rollouts", "10")
    assert r.exit_code == 2 and "--rollouts" in r.output


def test_a_sweep_without_a_validation_split_is_exit_2(tmp_path):
    r = invoke("cotrain", "--sweep", "--validation", "0", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "validation" in r.output


def test_a_malformed_stagewise_is_exit_2(tmp_path):
    r = invoke("cotrain", "--stagewise", "0.5", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "--stagewise" in r.output and "two values" in r.output


@pytest.mark.parametrize("value", ["0.75,3.5", "0,3", "0.75,x"])
def test_a_stagewise_out_of_range_says_what_is_wanted(tmp_path, value):
    r = invoke("cotrain", "--stagewise", value, "--schedule", "stagewise",
               "--out", str(tmp_path / "x"))  # fmt: skip
    assert r.exit_code == 2 and "I* an integer >= 1" in " ".join(r.output.split())


def test_a_sweep_without_a_stagewise_schedule_is_exit_2(tmp_path):
    r = invoke("cotrain", "--sweep", "--schedule", "adaptive,fixed", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "no stagewise" in r.output


def test_a_sweep_beside_a_given_stagewise_is_exit_2(tmp_path):
    r = invoke("cotrain", "--sweep", "--schedule", "stagewise", "--stagewise", "1,2",
               "--out", str(tmp_path / "x"))  # fmt: skip
    assert r.exit_code == 2 and "would replace" in " ".join(r.output.split())


def test_resume_of_a_run_made_before_the_format_stamp_is_exit_2(tmp_path):
    # a config.toml of an older cotrain: no stagewise, validation or sweep key, no format.json
    (tmp_path / "config.toml").write_text('schedules = ["adaptive", "stagewise"]\n')
    r = invoke("cotrain", "--resume", str(tmp_path))
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "no format.json" in text and "start a new run" in text


def test_resume_refuses_a_sweep_or_a_new_stagewise(tmp_path):
    (tmp_path / "config.toml").write_text("")
    for flag in (["--sweep"], ["--stagewise", "1,2"], ["--validation", "5"]):
        r = invoke("cotrain", "--resume", str(tmp_path), *flag)
        assert r.exit_code == 2 and flag[0] in r.output
